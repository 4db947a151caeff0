#!/bin/sh
# Every fedsuite container starts here. With FEDSUITE_SUPERLINK set (host:port), it writes the `flwr`
# CLI's connection "fedsuite" into $FLWR_HOME/config.toml: TLS verified against FEDSUITE_CA (default
# /credentials/ca.crt), or plain HTTP when FEDSUITE_INSECURE=1 (loopback experiments only), with
# fedsuite's own writer (fedsuite/deploy/superlink.py, `fedsuite connection`; python3 is the image's fedsuite
# environment, first on PATH). Then it runs the command.
set -eu
if [ -n "${FEDSUITE_SUPERLINK:-}" ]; then
    if [ "${FEDSUITE_INSECURE:-0}" = "1" ]; then
        echo "entrypoint: WARNING: FEDSUITE_INSECURE=1, the connection to $FEDSUITE_SUPERLINK is not encrypted" >&2
        python3 -m fedsuite.cli.main connection "$FLWR_HOME" "$FEDSUITE_SUPERLINK"
    else
        ca="${FEDSUITE_CA:-/credentials/ca.crt}"
        if [ ! -f "$ca" ]; then
            echo "entrypoint: error: the CA certificate $ca is missing (make it with \`fedsuite certs\`)" >&2
            exit 2
        fi
        python3 -m fedsuite.cli.main connection "$FLWR_HOME" "$FEDSUITE_SUPERLINK" --root-certificates "$ca"
    fi
fi
exec "$@"
