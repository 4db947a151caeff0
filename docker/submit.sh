#!/bin/sh
# The run container: submit fedsuite's app to the SuperLink (connection "fedsuite", written by
# entrypoint.sh, TLS-verified with the CA), follow its log until it ends, and exit 0 only if Flower
# reports the run finished:completed (`flwr run`'s own exit code does not say whether the ServerApp
# failed). Arguments: the run config, as `flwr run --run-config` takes it, e.g.
#   submit.sh "num_clients=2 fraction=1.0 rounds=2 output_dir='/runs' data_root='/data'"
# The ServerApp runs on the SuperLink's machine and writes the run directory under output_dir there.
set -eu
out=$(flwr run /opt/fedsuite-app fedsuite --run-config "${1:-}" --format json) || true
run_id=$(printf '%s' "$out" | python3 -c "import json,sys; s=sys.stdin.read(); print(json.loads(s[s.index('{'):]).get('run-id', ''))" 2>/dev/null || true)
if [ -z "$run_id" ]; then
    echo "submit: error: flwr run refused the run: $out" >&2
    exit 1
fi
echo "submit: run $run_id submitted; following its log"
flwr log "$run_id" fedsuite --stream || true
for _ in $(seq 1 60); do
    status=$(flwr ls fedsuite --run-id "$run_id" --format json \
        | python3 -c "import json,sys; s=sys.stdin.read(); print(json.loads(s[s.index('{'):])['runs'][0]['status'])" 2>/dev/null || true)
    case "$status" in finished:*) break ;; esac
    sleep 2
done
echo "submit: run $run_id: ${status:-unknown}"
[ "$status" = "finished:completed" ]
