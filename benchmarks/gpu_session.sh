#!/bin/bash
# The GPU checks of a session that is lent the GPU machine, run there from the checkout's root.
#
#   bash benchmarks/gpu_session.sh check OUT [UNTIL]  # set-up, gpu_round.py, the row started, pytest -m gpu,
#                                                     # then the row waited for until UNTIL seconds since the start
#   bash benchmarks/gpu_session.sh row OUT SECS       # wait up to SECS more for the row, then pack its runs
#
# What it needs beside the checkout, in .device/ (ignored by git), is made by
# `bash benchmarks/device_bundle.sh` (3 minutes): site312.tar.xz (flwr, ray and the rest for the
# machine's Python 3.12: ../shared/tools/device's bundle with this project's flwr swapped in, every
# shared object stripped) and cifar10_jpeg.npz + make_cifar10.py from ../shared/data/cifar10-jpeg/.
# The checkout's tracked files and .device/ must stay under the 64 MiB a call may send; that script
# prints the sum. Over it (the committed in-flight checkpoints of the CPU claims queue,
# experiments/*/results/claims-cifar10-inflight/, 17 MB on 2026-11-28), move those out of the
# working tree for the calls, then `git checkout` them back.
#
# Timing seen on one H200 (15 minutes of device time in all): 2026-11-27, the machine started in ~30
# s, "check" took 240 s, "row" then waited 470 s (a 500-round row at round 280, 1.7 s a round, three
# runs at once). 2026-11-28: set-up 25 s, gpu_round.py 210 s, pytest -m gpu 96 s (32 tests); the
# FedNLR row ran at 2.6-3.1 s a round, two runs at once (beside pytest or not); "check OUT 555"
# then "row OUT 245" left 44 s of the 900: FedDyn's 200 rounds ended, FedDyn + FedNLR's reached 185. A second call must come within the machine's 30 s warm window, or the machine, and
# the row with it, goes back.
#
# "check": (1) unpacks the bundle and writes CIFAR-10 (JPEG copy) to /tmp/data; (2) times
# benchmarks/gpu_round.py on both engines while the GPU is otherwise idle; (3) starts one row of
# the CIFAR-10 claims at the paper's scale in the background, in its own process session so that it
# outlives this call while the machine stays warm: FedNLR's Table 1 cell (CIFAR-10 Dir(20, 0.3),
# 20 clients, 40% a round, 2 local epochs, 200 rounds), seed 2, FedDyn + FedNLR at weight decay
# 1e-3 on the in-process engine: the run that did not end on 2026-11-28 (at round 185; its checkpoint
# did not come back, so it starts again: about 200 x 2.6 s), whose twin FedDyn ended there
# (experiments/fednlr/results/claims-cifar10-gpu/), so that both halves of that ordering have a GPU
# run of seed 2 beside the CPU queue's, compared on whole runs; (4) runs `pytest -m gpu` beside it; (5) waits for the row until UNTIL seconds after
# the start (default 0: no wait) and packs it if it ended, else leaves it running for "row". "row" waits for the row and packs its
# records into OUT/rows.tar.gz (configs, metrics, summaries and logs; no checkpoints); a row stopped
# at SECS is interrupted (SIGTERM: each run records its status and keeps its last checkpoint), and
# says so in its summaries.
set -uo pipefail
phase=${1:-} out=${2:-/tmp/gpu-session}
mkdir -p /tmp/site "$out"
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH FLWR_TELEMETRY_ENABLED=0 PYTHONUNBUFFERED=1
ROW=(python3 -m fedsuite.cli.main reproduce fednlr-claims-cifar10 --methods feddyn-nlr-wd1e-3 --seeds 2
     --jobs 1 --engine inprocess --data-root /tmp/data --output-dir /tmp/rows)

wait_row() {  # wait_row SECS: wait up to SECS for the row; true if it ended
  local pid end
  pid=$(cat /tmp/row.pid) end=$((SECONDS + $1))
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 5; done
  ! kill -0 "$pid" 2>/dev/null
}

pack_row() {  # pack_row OUT: the row's log and records (no checkpoints or client state) into OUT
  tail -30 /tmp/row.log; cp /tmp/row.log "$1/row.log"
  tar -czf "$1/rows.tar.gz" --exclude=client-state --exclude='*.pt' -C /tmp rows
  for m in $(find /tmp/rows -name metrics.jsonl); do echo "$m: $(tail -1 "$m" | cut -c1-200)"; done
}

if [ "$phase" = check ]; then
  {
    date -u; nvidia-smi; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    tar -xJf .device/site312.tar.xz -C /tmp/site && sed -i "1s|^#!.*|#!$(command -v python3)|" /tmp/site/bin/*
    python3 -c "from importlib.metadata import version as v; print('flwr', v('flwr'), 'ray', v('ray'))"
    python3 .device/make_cifar10.py /tmp/data
    git log -1 --format='commit %H %s'; git status --short
  } > "$out/setup.log" 2>&1 || { cat "$out/setup.log"; exit 1; }
  tail -3 "$out/setup.log"
  echo "== gpu_round.py"
  timeout 320 python3 benchmarks/gpu_round.py --rounds 4 --methods fedavg fedmr-cnn --engines flower inprocess \
    > "$out/gpu_round.log" 2>&1; echo "gpu_round exit $?"; tail -8 "$out/gpu_round.log"
  echo "== the row, in the background"
  setsid nohup "${ROW[@]}" > /tmp/row.log 2>&1 < /dev/null & echo $! > /tmp/row.pid
  echo "== pytest -m gpu"
  timeout 200 python3 -m pytest -m gpu -n 8 --dist load -v -p no:cacheprovider tests/test_gpu.py \
    > "$out/pytest-gpu.log" 2>&1; echo "pytest exit $?"; grep -v PytestBenchmark "$out/pytest-gpu.log" | tail -25
  echo "== the row so far"; tail -5 /tmp/row.log
  for m in $(find /tmp/rows -name metrics.jsonl); do echo "$m: $(tail -1 "$m" | cut -c1-160)"; done
  until=${3:-0}
  if [ "$until" -gt "$SECONDS" ]; then
    echo "== waiting for the row until ${until}s"
    if wait_row $((until - SECONDS)); then pack_row "$out"
    else echo "the row is still running: 'row' (the next call, within the warm window) waits for it"; fi
  fi
elif [ "$phase" = row ]; then
  if ! wait_row "$3"; then
    echo "the row ran past ${3}s: interrupted"; kill -TERM -- -"$(cat /tmp/row.pid)"
    for _ in $(seq 30); do kill -0 "$(cat /tmp/row.pid)" 2>/dev/null || break; sleep 1; done
  fi
  pack_row "$out"
else
  echo "usage: bash benchmarks/gpu_session.sh check OUT [UNTIL] | row OUT SECONDS (not '$phase')" >&2; exit 2
fi
