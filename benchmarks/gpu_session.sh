#!/bin/bash
# The GPU checks of a session that is lent the GPU machine, run there from the checkout's root.
#
#   bash benchmarks/gpu_session.sh check OUT     # set-up, gpu_round.py, the row started, pytest -m gpu
#   bash benchmarks/gpu_session.sh row OUT SECS  # wait up to SECS for the row, then pack its runs
#
# What it needs beside the checkout, in .device/ (ignored by git): site312.tar.xz (flwr, ray and the
# rest for the machine's Python 3.12, built as ../shared/tools/device/README.md says), and
# cifar10_jpeg.npz + make_cifar10.py from ../shared/data/cifar10-jpeg/. The checkout (18 MiB
# tracked) and .device/ must stay under the 64 MiB a call may send: with flwr 1.42 the bundle fits
# (28.9 MB) only after `strip --strip-unneeded` on every unstripped .so in it and `strip --strip-all`
# on ray's raylet and gcs_server (2026-11-27: then 63.3 MiB in all; Ray and Flower ran from it).
#
# Timing seen (2026-11-27, one H200; 15 minutes of device time in all): the machine started in
# ~30 s; "check" took 240 s; "row" then waited 470 s, when the row had reached round 280 of 500 at
# 1.7 s a round (three runs at once). Issue the second call within the machine's 30 s warm window,
# or the machine, and the row with it, goes back.
#
# "check": (1) unpacks the bundle and writes CIFAR-10 (JPEG copy) to /tmp/data; (2) times
# benchmarks/gpu_round.py on both engines while the GPU is otherwise idle; (3) starts one row of
# the CIFAR-10 claims at the paper's scale in the background (FedMR's Table 1 cell, CNN, Dir 0.1,
# momentum 0.5, seed 1: FedAvg, FedMut and FedMR, 500 rounds each, on the in-process engine, three
# runs at once), in its own process session so that it outlives this call while the machine stays
# warm; (4) runs `pytest -m gpu` beside it. "row", the next call, waits for the row and packs its
# records into OUT/rows.tar.gz; a row stopped at SECS is interrupted (SIGTERM: each run records
# its status and keeps its last checkpoint), and says so in its summaries.
set -uo pipefail
phase=${1:-} out=${2:-/tmp/gpu-session}
mkdir -p /tmp/site "$out"
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH FLWR_TELEMETRY_ENABLED=0 PYTHONUNBUFFERED=1
ROW=(python3 -m fedsuite.cli reproduce fedmr-claims-cifar10 --rows cnn-c10-0.1-m0.5 --seeds 1 --jobs 3
     --engine inprocess --data-root /tmp/data --output-dir /tmp/rows)

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
  timeout 260 python3 benchmarks/gpu_round.py --rounds 4 --methods fedavg fedmr-cnn --engines flower inprocess \
    > "$out/gpu_round.log" 2>&1; echo "gpu_round exit $?"; tail -8 "$out/gpu_round.log"
  echo "== the row, in the background"
  setsid nohup "${ROW[@]}" > /tmp/row.log 2>&1 < /dev/null & echo $! > /tmp/row.pid
  echo "== pytest -m gpu"
  timeout 200 python3 -m pytest -m gpu -n 8 --dist load -v -p no:cacheprovider tests/test_gpu.py \
    > "$out/pytest-gpu.log" 2>&1; echo "pytest exit $?"; grep -v PytestBenchmark "$out/pytest-gpu.log" | tail -25
  echo "== the row so far"; tail -5 /tmp/row.log
  for m in /tmp/rows/*/paper/*/*/metrics.jsonl /tmp/rows/*/*/*/*/metrics.jsonl; do
    [ -f "$m" ] && echo "$m: $(tail -1 "$m" | cut -c1-160)"
  done
elif [ "$phase" = row ]; then
  secs=$3 pid=$(cat /tmp/row.pid)
  end=$((SECONDS + secs))
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 5; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "the row ran past ${secs}s: interrupted"; kill -TERM -- -"$pid"
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  fi
  tail -30 /tmp/row.log; cp /tmp/row.log "$out/row.log"
  tar -czf "$out/rows.tar.gz" -C /tmp rows
  for m in $(find /tmp/rows -name metrics.jsonl); do echo "$m: $(tail -1 "$m" | cut -c1-200)"; done
else
  echo "usage: bash benchmarks/gpu_session.sh check OUT | row OUT SECONDS (not '$phase')" >&2; exit 2
fi
