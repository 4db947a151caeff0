#!/bin/sh
# The SuperLink container: TLS always, SuperNode authentication on (Flower 1.42's CLI-managed node
# authentication: https://flower.ai/docs/framework/how-to-authenticate-supernodes.html).
#
# Flower's SuperLink serves the Fleet, Control and Runtime APIs on one port, and its Control API
# authenticates nobody: it must not face the network. This container listens on
# FEDSUITE_SUPERLINK_HOST:9092 (default 127.0.0.1; compose: the private `backend` network, which only
# the gateway and the run service join); the gateway (`fedsuite gateway`, nginx) publishes the Fleet
# API alone to the SuperNodes.
#
# 1. checks /credentials holds ca.crt, server.pem, server.key (compose: the credentials step hands
#    them over; never ca.key);
# 2. starts flower-superlink with --ssl-* and --enable-supernode-auth, its state (runs, registered
#    SuperNodes) in /state/state.db;
# 3. registers every public key in FEDSUITE_ALLOWED_KEYS (default /credentials/supernodes/*.pub) with
#    `flwr supernode register`, on its own loopback: that folder is the list of allowed SuperNodes. A
#    key registered before (the database persists) is reported and kept;
# 4. touches /tmp/fedsuite-ready (the healthcheck) and waits for the SuperLink.
# Arguments are passed on to flower-superlink.
set -eu
C=/credentials
ALLOWED="${FEDSUITE_ALLOWED_KEYS:-$C/supernodes}"
HOST="${FEDSUITE_SUPERLINK_HOST:-127.0.0.1}"
for f in "$C/ca.crt" "$C/server.pem" "$C/server.key"; do
    if [ ! -f "$f" ]; then
        echo "superlink: error: $f is missing (run \`fedsuite certs\`; compose: the credentials service)" >&2
        exit 2
    fi
done
rm -f /tmp/fedsuite-ready
flower-superlink --ssl-ca-certfile "$C/ca.crt" --ssl-certfile "$C/server.pem" --ssl-keyfile "$C/server.key" \
    --enable-supernode-auth --host "$HOST" --port 9092 --database /state/state.db \
    --disable-runtime-dependency-installation "$@" &
link=$!
trap 'kill -TERM $link 2>/dev/null' TERM INT
until python3 -c "import socket; socket.create_connection(('127.0.0.1', 9092), 1)" 2>/dev/null; do
    kill -0 $link 2>/dev/null || { wait $link || true; echo "superlink: flower-superlink exited" >&2; exit 1; }
    sleep 1
done
export FLWR_HOME=/tmp/superlink-cli
python3 -m fedsuite.cli.main connection "$FLWR_HOME" 127.0.0.1:9092 --root-certificates "$C/ca.crt" --name local
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
echo "superlink: $count SuperNode key(s) allowed; listening on $HOST:9092 only; ready"
touch /tmp/fedsuite-ready
wait $link
