#!/bin/sh
# The one-shot credentials step of docker/compose.yaml (the `credentials` service): the only
# container that sees the whole credentials folder, ca.key included, and it exits when done.
#
# 1. `fedsuite certs` makes what is missing in /credentials (the host folder): the CA, the SuperLink's
#    certificate for "superlink" (the name the gateway checks), "gateway" (the name the SuperNodes
#    use on the compose network), localhost and FEDSUITE_TLS_HOSTS (space separated: the names/IPs
#    other machines use to reach the gateway), and a key pair for each name in FEDSUITE_SUPERNODES;
# 2. hands each long-running container only what it needs, in its own volume:
#      /out/superlink   ca.crt, server.pem, server.key, supernodes/*.pub (the allowed SuperNodes)
#      /out/gateway     ca.crt, server.pem, server.key
#      /out/<name>      ca.crt and <name>.key, for each SuperNode name in FEDSUITE_SUPERNODES
#      /out/admin       ca.crt (the run service: the flwr CLI verifies the SuperLink)
#    ca.key never leaves the host folder; no container holds another SuperNode's private key.
# (The folders are /credentials and /out; FEDSUITE_CREDENTIALS_DIR and FEDSUITE_HANDOUT_DIR move
# them, as tests/test_multihost.py does to run this script without Docker.)
set -eu
C="${FEDSUITE_CREDENTIALS_DIR:-/credentials}"
OUT="${FEDSUITE_HANDOUT_DIR:-/out}"
args="--host superlink --host gateway"
for h in ${FEDSUITE_TLS_HOSTS:-}; do args="$args --host $h"; done
for n in ${FEDSUITE_SUPERNODES:-}; do args="$args --supernode $n"; done
# (a certificate made before that lacks one of these hosts is refused in one line saying how to
# re-issue it: fedsuite certs ... --force-server)
# shellcheck disable=SC2086  # names and hosts hold no spaces
fedsuite certs "$C" $args

hand() {  # hand DEST FILE...: DEST holds exactly these files (private ones readable by their owner only)
    dest=$1
    shift
    mkdir -p "$dest"
    find "$dest" -mindepth 1 -delete
    for f in "$@"; do
        cp -p "$f" "$dest/"
    done
}
hand "$OUT/superlink" "$C/ca.crt" "$C/server.pem" "$C/server.key"
mkdir -p "$OUT/superlink/supernodes"
for pub in "$C"/supernodes/*.pub; do
    if [ -f "$pub" ]; then cp -p "$pub" "$OUT/superlink/supernodes/"; fi
done
hand "$OUT/gateway" "$C/ca.crt" "$C/server.pem" "$C/server.key"
hand "$OUT/admin" "$C/ca.crt"
for n in ${FEDSUITE_SUPERNODES:-}; do
    hand "$OUT/$n" "$C/ca.crt" "$C/supernodes/$n.key"
done
echo "credentials: handed out (superlink, gateway, admin, ${FEDSUITE_SUPERNODES:-no SuperNodes}); ca.key stays in the host folder"
