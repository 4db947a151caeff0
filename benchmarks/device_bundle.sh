#!/bin/bash
# Prepare .device/, what benchmarks/gpu_session.sh needs beside the checkout on the GPU machine:
#
#   bash benchmarks/device_bundle.sh [SHARED]     # SHARED: ../shared (default)
#
# * site312.tar.xz: SHARED/tools/device/site312.tar.xz (flwr, ray, pydantic and the rest for the
#   machine's Python 3.12; its README says how it was built) with the pure-Python distributions of
#   SWAP (default "flwr certifi") replaced by this checkout's .venv copies where their versions differ
#   or the bundle lacks them: the shared bundle pins flwr 1.41, the project 1.42, which needs a newer
#   certifi. Then every shared object is stripped (`strip --strip-unneeded`) and Ray's unused parts
#   removed (`strip_ray.sh --elf`): with flwr 1.42 the bundle is 29 MB instead of 32, which is what
#   lets it travel beside CIFAR-10 and the checkout within the 64 MiB a call may send.
# * cifar10_jpeg.npz and make_cifar10.py: SHARED/data/cifar10-jpeg/, written to /tmp/data there.
#
# It adds /.device/ to .git/info/exclude, and ends with the sizes that will travel: if the checkout's
# tracked files and .device/ pass 64 MiB, move the committed in-flight checkpoints of the claims
# queue (experiments/*/results/claims-cifar10-inflight/) aside for the calls, as gpu_session.sh says.
# Takes about 3 minutes of one core (xz -9).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=$(realpath "${1:-../shared}")
SWAP=${SWAP:-"flwr certifi"}
PY=.venv/bin/python
[ -x "$PY" ] || { echo "device_bundle: no .venv here (install first, README)" >&2; exit 1; }
[ -f "$SHARED/tools/device/site312.tar.xz" ] || { echo "device_bundle: no $SHARED/tools/device/site312.tar.xz" >&2; exit 1; }

SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
tar -xJf "$SHARED/tools/device/site312.tar.xz" -C "$SITE"

# swap: remove the bundle's copy (its dist-info's RECORD names its files), copy the .venv's (the same)
"$PY" - "$SITE" $SWAP <<'PY'
import importlib.metadata as md, shutil, sys
from pathlib import Path

site = sys.argv[1]
for name in sys.argv[2:]:
    ours = md.distribution(name)
    if "Root-Is-Purelib: true" not in (ours.read_text("WHEEL") or ""):
        sys.exit(f"device_bundle: {name} is not pure Python: it cannot be copied from this machine's .venv")
    theirs = [d for d in md.distributions(path=[site]) if d.metadata["Name"].lower() == name.lower()]
    if theirs and theirs[0].version == ours.version:
        print(f"  {name} {ours.version}: the bundle's already")
        continue
    old = theirs[0].version if theirs else "absent"
    inside = lambda f: not str(f).startswith("..") and "__pycache__" not in f.parts  # not bin/ scripts
    for d in theirs:  # the bundle's copy, file by file (its RECORD), then the folders it emptied
        gone = [Path(d.locate_file(f)) for f in filter(inside, d.files or [])]
        for path in gone:
            path.unlink(missing_ok=True)
        for folder in sorted({p.parent for p in gone}, key=lambda p: -len(p.parts)):
            while folder != Path(site) and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
                folder = folder.parent
    for f in filter(inside, ours.files or []):
        dest = Path(site) / f
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ours.locate_file(f), dest)
    print(f"  {name}: {old} -> {ours.version}")
PY
bash "$SHARED/tools/device/strip_ray.sh" "$SITE" --elf
find "$SITE" -type f \( -name "*.so" -o -name "*.so.[0-9]*" \) -exec strip --strip-unneeded {} +

mkdir -p .device
grep -qxF "/.device/" .git/info/exclude 2> /dev/null || echo "/.device/" >> .git/info/exclude
rm -f .device/site312.tar.xz
(cd "$SITE" && tar -cf - .) | xz -9 -T1 > .device/site312.tar.xz
install -m 0444 "$SHARED/data/cifar10-jpeg/cifar10_jpeg.npz" .device/cifar10_jpeg.npz
install -m 0555 "$SHARED/data/cifar10-jpeg/make_cifar10.py" .device/make_cifar10.py

tracked=$(git ls-files -z | xargs -0 stat -c %s 2> /dev/null | awk '{s += $1} END {print s}')
device=$(du -sb .device | cut -f1)
awk -v t="$tracked" -v d="$device" 'BEGIN {
    printf ".device/ %.1f MB, tracked files %.1f MB: %.1f MiB of the 64 MiB a call may send\n", d / 1e6, t / 1e6, (t + d) / 1048576
    if (t + d > 64 * 1048576) print "over: move experiments/*/results/claims-cifar10-inflight/ aside for the calls (benchmarks/gpu_session.sh)"
}'
