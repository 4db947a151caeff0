#!/usr/bin/env bash
# The Docker test (tests/test_multihost.py, marker `docker`) on a machine that has no Docker engine
# running and no image registry: .ci/run calls this with FEDSUITE_CI_DOCKER=1 (off by default, see
# there). Needs root (apt-get, dockerd). It
#   1. installs docker.io, docker-compose and debootstrap with apt where missing;
#   2. starts a private dockerd (state under $WORK), stopped by its PID on exit;
#   3. makes the base image fedsuite-base:bookworm with debootstrap (python3 + venv from Debian);
#   4. downloads fedsuite's dependency wheels (pip download, PyPI) into a wheelhouse the test serves
#      to `docker build` over loopback;
#   5. runs the test.
# Measured on the 2-core CI machine kind, shared with other work (load 13-20), 2026-11-23: 28m42s in
# all: debootstrap 4 min, wheelhouse 6 min (3.1 GB: PyPI's torch is the CUDA build), image build
# 12.4 min (6.9 GB image), the compose federation (up, intruder refused, 2 rounds, down) 5.5 min;
# plus about 1 min for apt on a machine without docker.io. A second run reuses $WORK's rootfs and
# wheelhouse (the image is rebuilt: the private dockerd's data is kept in $WORK/data, so layers cache).
# 2026-11-27, same machine kind, two claims queues beside it: a second run (rootfs, wheelhouse and
# layers kept in $WORK) took 8m52s for the test, image rebuild (fedsuite's layer) included.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WORK=${FEDSUITE_CI_DOCKER_DIR:-/tmp/fedsuite-ci-docker}
mkdir -p "$WORK"
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
export DOCKER_HOST="unix://$WORK/docker.sock"
dockerd --data-root "$WORK/data" --exec-root "$WORK/exec" -H "$DOCKER_HOST" --pidfile "$WORK/dockerd.pid" \
    >"$WORK/dockerd.log" 2>&1 &
DOCKERD=$!
# dockerd leaves its bridge and iptables rules (and FORWARD policy DROP) behind: undo them after it
undo_dockerd_network() {
    for rule in "-j DOCKER-USER" "-j DOCKER-ISOLATION-STAGE-1" \
                "-o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT" "-o docker0 -j DOCKER" \
                "-i docker0 ! -o docker0 -j ACCEPT" "-i docker0 -o docker0 -j ACCEPT"; do
        # shellcheck disable=SC2086
        iptables -D FORWARD $rule 2>/dev/null || true
    done
    for chain in DOCKER DOCKER-ISOLATION-STAGE-1 DOCKER-ISOLATION-STAGE-2 DOCKER-USER; do
        iptables -F "$chain" 2>/dev/null && iptables -X "$chain" 2>/dev/null || true
    done
    iptables -P FORWARD ACCEPT 2>/dev/null || true
    iptables -t nat -D PREROUTING -m addrtype --dst-type LOCAL -j DOCKER 2>/dev/null || true
    iptables -t nat -D OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER 2>/dev/null || true
    iptables -t nat -D POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE 2>/dev/null || true
    iptables -t nat -F DOCKER 2>/dev/null && iptables -t nat -X DOCKER 2>/dev/null || true
    ip link del docker0 2>/dev/null || true
    umount "$WORK/exec/netns/default" 2>/dev/null || true
}
trap 'kill -TERM $DOCKERD 2>/dev/null; wait $DOCKERD 2>/dev/null || true; undo_dockerd_network' EXIT
for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
docker info >/dev/null || { echo "dockerd did not start; see $WORK/dockerd.log" >&2; exit 1; }
if ! docker image inspect fedsuite-base:bookworm >/dev/null 2>&1; then
    [ -x "$WORK/rootfs/usr/bin/python3" ] || \
        debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates bookworm \
            "$WORK/rootfs" >"$WORK/debootstrap.log"  # the mirror: debootstrap's own default
    tar -C "$WORK/rootfs" -c . | docker import - fedsuite-base:bookworm >/dev/null
fi
if [ ! -f "$WORK/wheels/.complete" ]; then
    "$PY" -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml','rb'))['project']['dependencies']))" \
        >"$WORK/reqs.txt"
    printf 'setuptools>=68\nwheel\n' >>"$WORK/reqs.txt"
    "$PY" -m pip download -q --only-binary=:all: -r "$WORK/reqs.txt" -d "$WORK/wheels"
    touch "$WORK/wheels/.complete"
fi
export FEDSUITE_DOCKER_TESTS=1 FEDSUITE_DOCKER_BASE_IMAGE=fedsuite-base:bookworm FEDSUITE_DOCKER_WHEELHOUSE="$WORK/wheels"
"$PY" -m pytest -q -p no:cacheprovider -n 0 -m docker tests/test_multihost.py
