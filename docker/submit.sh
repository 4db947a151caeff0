#!/bin/sh
# The run container: submit fedsuite's app to the SuperLink (connection "fedsuite", written by
# entrypoint.sh, TLS-verified with the CA), follow its log until it ends, and exit 0 only if Flower
# reports the run finished:completed (`flwr run`'s own exit code does not say whether the ServerApp
# failed). Arguments: the run config, as `flwr run --run-config` takes it, e.g.
#   submit.sh "num_clients=2 fraction=1.0 rounds=2 output_dir='/runs' data_root='/data'"
# The ServerApp runs on the SuperLink's machine and writes the run directory under output_dir there.
# The logic is fedsuite's own (fedsuite/deploy/superlink.py, `fedsuite submit`), which the tests use too.
set -eu
exec python3 -m fedsuite.cli.main submit /opt/fedsuite-app fedsuite --run-config "${1:-}"
