#!/usr/bin/env bash
# Issue 32: the four papers' claims targets at CPU scale, and their committed reports.
#
#   experiments/claims_cpu.sh run OUT DATA_ROOT      # the queue, seed by seed (a stop leaves whole
#                                                    # runs' checkpoints); run it again to go on
#   experiments/claims_cpu.sh report OUT [PAPER...]  # each report (+ CSVs, figures) and the finished
#                                                    # runs' records into experiments/<paper>/results/claims-cpu/
#
# OUT is the runs' folder (reproduce --out), DATA_ROOT the folder holding FashionMNIST/raw/*.gz.
# About 30 run-hours in all (two runs at a time: about 15 hours, across sessions); `fedsuite` from this checkout's environment.
#
# The work is a list of paper-seeds (UNITS, each paper seed by seed). Two workers run side by
# side, one run each on its own half of the cores, so both stay busy to the end: each takes the next unit of the list
# (under a lock), runs that seed's 3 to 5 runs one at a time and writes that paper's report (under
# that paper's lock). Two units of one paper may run at once: their runs are different seeds'
# and reproduce replaces its report files whole. Stop everything with `kill -TERM -- -PGID` (the
# script's process group: start it with setsid); each run keeps its last checkpoint and the next
# `run` resumes it (units whose runs are complete take seconds: reproduce skips them).
#
# The queue outlives the machine: `run` first copies the committed records of finished runs
# (config.json, metrics.jsonl, summary.json) back into OUT, where reproduce skips a run whose
# summary says completed, and writes the reports after each paper's seed, so committing
# experiments/*/results/claims-cpu keeps every finished run.
set -euo pipefail
cd "$(dirname "$0")/.."
PAPERS=(fedmrur fednlr fedinit fedmr)
FEDSUITE=${FEDSUITE:-.venv/bin/fedsuite}

restore() {  # committed records -> OUT (never over a run folder that is already there)
    local paper=$1 out=$2 src rel
    for src in "experiments/$paper/results/claims-cpu/runs"/*/*/; do
        [ -f "$src/summary.json" ] || continue
        rel="${src#"experiments/$paper/results/claims-cpu/runs/"}"
        [ -e "$out/$paper/cpu/$rel" ] && continue
        mkdir -p "$out/$paper/cpu/$rel" && cp "$src"/* "$out/$paper/cpu/$rel/"
    done
}

report() {  # OUT's report of one paper and its finished runs' records -> the committed folder
    mkdir -p "$2"
    ( flock 9 && write_report "$@" ) 9>"$2/.report-$1.lock"  # both workers may be on one paper
}

write_report() {
    local paper=$1 out=$2 dest="experiments/$1/results/claims-cpu" run rel
    "$FEDSUITE" reproduce "$paper-claims" --scale cpu --seeds 0 1 2 --out "$out" --report
    rm -rf "$dest" && mkdir -p "$dest/runs"
    cp "$out/$paper/cpu/$paper-claims/"{report.md,report.csv,claims.csv} "$dest/"
    cp "$out/$paper/cpu/$paper-claims/"*.png "$dest/" 2>/dev/null || true  # no figure before a run ends
    # the records of the runs the report read (checkpoints stay out: the numbers need only these)
    for run in "$out/$paper/cpu"/*/*-s[0-9]*/; do
        [ -f "$run/summary.json" ] || continue
        rel="${run#"$out/$paper/cpu/"}"
        mkdir -p "$dest/runs/$rel"
        cp "$run"/{config.json,metrics.jsonl,summary.json} "$dest/runs/$rel/"
    done
}

run_seed() {  # run_seed PAPER SEED PART OUT DATA: that seed's runs; PART "rows=R" or "methods=M" (reproduce's
              # --rows R / --methods M) runs only that part of them, empty: all of them
    local paper=$1 seed=$2 part=$3 out=$4 data=$5
    echo "=== $(date -u +%FT%TZ) $paper-claims seed $seed${part:+ ($part)}"
    "$FEDSUITE" reproduce "$paper-claims" --scale cpu --seeds "$seed" ${part:+"--${part%%=*}" "${part#*=}"} --jobs 1 \
        --data-root "$data" --out "$out" || echo "=== $paper-claims seed $seed${part:+ ($part)}: exit $?"
    report "$paper" "$out"
}

# The order is the order of the answers: FedMRUR's seeds (done first), FedInit's (both workers on
# it, so its three seeds finish within one session), FedMR's, then FedNLR's (done at 200 rounds;
# its FedAvg and FedNLR continue to the paper's 500). A unit is "paper:seed", or "paper:seed:part"
# where a seed's last runs are split so that both workers end together (FedMR's last seed: the 3
# runs of row `paper` and the 2 short ones of `momentum-0.5`; FedNLR's: its two runs of 500
# rounds). A finished unit takes seconds (reproduce skips completed runs), so the list stays whole
# as runs are added.
UNITS=(fedmrur:0 fedmrur:1 fedmrur:2
       fedinit:0 fedinit:1 fedinit:2
       fedmr:0 fedmr:1 fedmr:2:rows=paper fedmr:2:rows=momentum-0.5
       fednlr:0 fednlr:1 fednlr:2:methods=fedavg fednlr:2:methods=fednlr)

take() {  # the next unit of this `run`'s list (OUT/.units/next under its lock); fails when none is left
    local out=$1 i
    i=$( (flock 9 && read -r n < "$out/.units/next" && echo $((n + 1)) > "$out/.units/next" && echo "$n") \
        9>"$out/.units/lock")
    [ "$i" -lt "${#UNITS[@]}" ] && echo "${UNITS[$i]}"
}

pin() {  # this worker (0 or 1) onto its half of the cores, as `reproduce --jobs 2` pins its runs
    local cores
    cores=$("$(dirname "$FEDSUITE")/python" -c "from fedsuite.processes import core_slices as c; s = c(2); print(','.join(map(str, sorted(s[$1]))) if s else '')")
    [ -z "$cores" ] || taskset -pc "$cores" "$BASHPID" > /dev/null
}

worker() {  # units one after another until the list is done, one run at a time, on this worker's cores
    local out=$1 data=$2 unit paper seed part
    pin "$3"
    while unit=$(take "$out"); do
        IFS=: read -r paper seed part <<< "$unit"
        run_seed "$paper" "$seed" "$part" "$out" "$data"
    done
}

case "${1:-}" in
run)
    for paper in "${PAPERS[@]}"; do restore "$paper" "$2"; done
    rm -rf "$2/.units" && mkdir -p "$2/.units" && echo 0 > "$2/.units/next"
    worker "$2" "$3" 0 &
    worker "$2" "$3" 1 &
    wait ;;
report)  # report OUT [PAPER ...]: every paper, or those named (a paper with no runs in OUT would lose its report)
    out=$2
    shift 2
    [ $# -gt 0 ] || set -- "${PAPERS[@]}"
    for paper in "$@"; do report "$paper" "$out"; done ;;
*)
    sed -n '2,11p' "$0"; exit 2 ;;
esac
