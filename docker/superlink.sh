#!/bin/sh
# The SuperLink container: TLS always, SuperNode authentication on (Flower 1.41's CLI-managed node
# authentication: https://flower.ai/docs/framework/how-to-authenticate-supernodes.html).
#
# 1. with FEDSUITE_MAKE_CREDENTIALS=1, `fedsuite certs` makes what is missing in /credentials: the CA,
#    the SuperLink certificate for "superlink", localhost and FEDSUITE_TLS_HOSTS (space separated: the
#    names/IPs other machines use), and a key pair for each name in FEDSUITE_SUPERNODES;
# 2. starts flower-superlink with --ssl-* and --enable-supernode-auth on 0.0.0.0:9093, its state
#    (runs, registered SuperNodes) in /state/state.db;
# 3. registers every public key in FEDSUITE_ALLOWED_KEYS (default /credentials/supernodes/*.pub) with
#    `flwr supernode register`: that folder is the list of allowed SuperNodes. A key registered before
#    (the database persists) is reported and kept;
# 4. touches /tmp/fedsuite-ready (the healthcheck) and waits for the SuperLink.
# Arguments are passed on to flower-superlink.
set -eu
C=/credentials
ALLOWED="${FEDSUITE_ALLOWED_KEYS:-$C/supernodes}"
if [ "${FEDSUITE_MAKE_CREDENTIALS:-0}" = "1" ]; then
    args="--host superlink"
    for h in ${FEDSUITE_TLS_HOSTS:-}; do args="$args --host $h"; done
    for n in ${FEDSUITE_SUPERNODES:-}; do args="$args --supernode $n"; done
    # shellcheck disable=SC2086  # names and hosts hold no spaces
    fedsuite certs "$C" $args
fi
for f in "$C/ca.crt" "$C/server.pem" "$C/server.key"; do
    if [ ! -f "$f" ]; then
        echo "superlink: error: $f is missing (run \`fedsuite certs\`, or set FEDSUITE_MAKE_CREDENTIALS=1)" >&2
        exit 2
    fi
done
rm -f /tmp/fedsuite-ready
flower-superlink --ssl-ca-certfile "$C/ca.crt" --ssl-certfile "$C/server.pem" --ssl-keyfile "$C/server.key" \
    --enable-supernode-auth --host 0.0.0.0 --port 9093 --database /state/state.db \
    --disable-runtime-dependency-installation "$@" &
link=$!
trap 'kill -TERM $link 2>/dev/null' TERM INT
until python3 -c "import socket; socket.create_connection(('127.0.0.1', 9093), 1)" 2>/dev/null; do
    kill -0 $link 2>/dev/null || { wait $link || true; echo "superlink: flower-superlink exited" >&2; exit 1; }
    sleep 1
done
export FLWR_HOME=/tmp/superlink-cli
python3 -m fedsuite.superlink connection "$FLWR_HOME" 127.0.0.1:9093 --root-certificates "$C/ca.crt" --name local
count=0
for key in "$ALLOWED"/*.pub; do
    [ -f "$key" ] || continue
    out=$(flwr supernode register "$key" local --name "$(basename "$key" .pub)" --format json 2>&1 || true)
    if echo "$out" | grep -q '"success": true'; then
        echo "superlink: registered SuperNode key $key"
    elif echo "$out" | grep -q 'already in use'; then
        echo "superlink: SuperNode key $key was registered before"
    else
        echo "superlink: error: could not register $key: $out" >&2
        kill -TERM $link
        exit 1
    fi
    count=$((count + 1))
done
echo "superlink: $count SuperNode key(s) allowed; ready"
touch /tmp/fedsuite-ready
wait $link
