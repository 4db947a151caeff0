#!/usr/bin/env bash
# Issue 32: the four papers' claims targets at CPU scale, and their committed reports.
#
#   experiments/claims_cpu.sh run OUT DATA_ROOT      # the queue: seed by seed across the papers, so a
#                                                    # stop leaves whole seeds; run it again to go on
#   experiments/claims_cpu.sh report OUT             # each report (+ CSVs, figures) and the finished
#                                                    # runs' records into experiments/<paper>/results/claims-cpu/
#
# OUT is the runs' folder (reproduce --out), DATA_ROOT the folder holding FashionMNIST/raw/*.gz.
# About 10 CPU-hours in all, two runs at a time; `fedsuite` from this checkout's environment.
set -euo pipefail
cd "$(dirname "$0")/.."
PAPERS=(fedmrur fednlr fedinit fedmr)
FEDSUITE=${FEDSUITE:-.venv/bin/fedsuite}
case "${1:-}" in
run)
    for seed in 0 1 2; do
        for paper in "${PAPERS[@]}"; do
            echo "=== $(date -u +%FT%TZ) $paper-claims seed $seed"
            "$FEDSUITE" reproduce "$paper-claims" --scale cpu --seeds "$seed" --jobs 2 --data-root "$3" --out "$2" \
                || echo "=== $paper-claims seed $seed: exit $?"
        done
    done ;;
report)
    for paper in "${PAPERS[@]}"; do
        "$FEDSUITE" reproduce "$paper-claims" --scale cpu --seeds 0 1 2 --out "$2" --report
        dest="experiments/$paper/results/claims-cpu"
        rm -rf "$dest" && mkdir -p "$dest/runs"
        cp "$2/$paper/cpu/$paper-claims/"{report.md,report.csv,claims.csv,*.png} "$dest/" 2>/dev/null || true
        # the records of the runs the report read (checkpoints stay out: the numbers need only these)
        for run in "$2/$paper/cpu"/*/*-s[0-9]*/; do
            [ -f "$run/summary.json" ] || continue
            rel="${run#"$2/$paper/cpu/"}"
            mkdir -p "$dest/runs/$rel"
            cp "$run"/{config.json,metrics.jsonl,summary.json} "$dest/runs/$rel/"
        done
    done ;;
*)
    sed -n '2,11p' "$0"; exit 2 ;;
esac
