#!/usr/bin/env bash
# The four papers' claims targets, and their committed reports, at one of two scales:
#   cpu      `<paper>-claims --scale cpu`: the headline orderings on Fashion-MNIST, FedMR's CNN (~30 run-hours)
#   cifar10  `<paper>-claims-cifar10`: the papers' CIFAR-10 cells, on CIFAR-10 in torchvision's
#            layout (DATA_ROOT/cifar-10-batches-py; the committed results used a lossy JPEG copy)
#
#   experiments/claims.sh SCALE run OUT DATA_ROOT      # the queue, unit by unit (a stop leaves whole
#                                                      # runs' checkpoints); run it again to go on;
#                                                      # NICE=19 in front: only the CPU other work leaves
#   experiments/claims.sh SCALE report OUT [NAME...]  # each report (+ CSVs, figures) and the finished
#                                                      # runs' records into experiments/<paper>/results/claims-SCALE/
#                                                      # (the committed records are copied into OUT first,
#                                                      # so an empty OUT rewrites the reports from them alone)
#   experiments/claims.sh SCALE save OUT [NAME...]    # the in-flight runs' checkpoints into
#                                                      # experiments/<paper>/results/claims-SCALE-inflight/
#   (NAME: a paper, or a variant such as fedmrur-1600, a target of its own beside the paper's: spec below)
#   experiments/claims.sh SCALE status OUT             # where the queue stands: each unfinished run's
#                                                      # round, pace and time left; the units not yet taken
#
# OUT is the runs' folder (reproduce --output-dir), DATA_ROOT the folder holding the data. The queue and
# the reports use this checkout's `fedsuite` (.venv). At the cifar10 scale every run of a paper is
# computed by one frozen commit (at the cpu scale, FedNLR's, whose FedDyn runs were added last), so
# that other work does not change its numbers mid-way: the first
# run of a paper pins this checkout's HEAD in experiments/<paper>/results/claims-cifar10.commit
# (commit that file), and each run is made by that commit's code, in a worktree beside this
# checkout (../claims-code-<commit>, made on first use with a copy of .venv; `frozen_code`).
#
# The work is a list of units (UNITS, each a part of one paper's seed). Two workers run side by
# side, one run each on its own half of the cores, so both stay busy to the end: each takes the next unit of the list
# (under a lock), runs that unit's runs one at a time and writes that paper's report (under
# that paper's lock). Two units of one paper may run at once: their runs are different seeds'
# and reproduce replaces its report files whole. Stop everything with `kill -TERM -- -PGID` (the
# script's process group: start it with setsid); each run keeps its last checkpoint and the next
# `run` resumes it. A unit whose reproduce call ended with every run completed is listed in
# OUT/.finished-units (with the code that ran it) and a later `run` passes it over at once, instead of
# starting reproduce to find its runs done (about 10 s a unit); delete that file to walk them all again.
#
# The queue outlives the machine: `run` first copies the committed records of finished runs
# (config.json, metrics.jsonl, summary.json) back into OUT, where reproduce skips a run whose
# summary says completed, and writes the reports after each unit, so committing
# experiments/*/results/claims-SCALE keeps every finished run.
set -euo pipefail
cd "$(dirname "$0")/.."
# `python -m` puts the working directory first on sys.path: without this, the processes a frozen
# commit's fedsuite starts with `python -m fedsuite...` (a run's CLI, its simulation process) would
# import this checkout's fedsuite, not the frozen one (they did, until this line)
export PYTHONSAFEPATH=1
# glibc's malloc thresholds as fedsuite.engine.allocator sets them in every process (2026-12-07), here
# from the environment, for the frozen commits that predate it: a CPU batch's activations then come
# from the heap instead of freshly mapped pages (a small model's round 20-25% faster); where memory
# comes from changes no number (tests/test_allocator.py)
export MALLOC_MMAP_THRESHOLD_=$((32 << 20)) MALLOC_TRIM_THRESHOLD_=$((256 << 20))
FEDSUITE=${FEDSUITE:-.venv/bin/fedsuite}
SCALE=${1:-}
case "$SCALE" in
cpu)  # the targets `<paper>-claims` at reproduce's cpu scale (Fashion-MNIST)
    PAPERS=(fedmrur fednlr fedinit fedmr)
    SUFFIX=claims REPRODUCE_SCALE=cpu FROZEN=fednlr  # the papers whose runs a frozen commit makes
    # The order is the order of the answers: FedMRUR's seeds (done first), FedInit's, FedMR's, then
    # FedNLR's. A unit is "paper:seed", or "paper:seed:part" where a seed's last runs are split so
    # that both workers end together (FedMR's last seed: the 3 runs of row `paper` and the 2 short
    # ones of `momentum-0.5`; FedNLR's: its two runs of 500 rounds). A finished unit takes seconds
    # (reproduce skips completed runs), so the list stays whole as runs are added.
    UNITS=(fedmrur:0 fedmrur:1 fedmrur:2
           fedinit:0 fedinit:1 fedinit:2
           fedmr:0 fedmr:1 fedmr:2:rows=paper fedmr:2:rows=momentum-0.5
           fednlr:0 fednlr:1 fednlr:2:methods=fedavg fednlr:2:methods=fednlr)
    # Added after the list above had run (by then from the checkout's code, run by run): FedDyn in
    # the second reading of its weight decay (1e-3, the FedDyn lineage's code), with and without
    # neuron-wise rates, 200 rounds each; FedNLR's runs from then on are made by one frozen commit, as
    # at the cifar10 scale (experiments/fednlr/results/claims-cpu.commit); finished units take seconds.
    for seed in 0 1 2; do
        UNITS+=("fednlr:$seed:methods=feddyn-wd1e-3" "fednlr:$seed:methods=feddyn-nlr-wd1e-3")
    done ;;
cifar10)  # the targets `<paper>-claims-cifar10`: paper-scale targets of their own
    PAPERS=(fedmr fednlr fedinit fedmrur)
    SUFFIX=claims-cifar10 REPRODUCE_SCALE=paper FROZEN="${PAPERS[*]}"
    # A variant is a target of its own beside a paper's (spec): FedMRUR's cell at the paper's 1600 rounds
    # (experiments/fedmrur/claims-cifar10-1600.toml), made by FedMRUR's pinned commit, and FedMR's cell at
    # Dir α = 0.5 (experiments/fedmr/claims-cifar10-alpha0.5.toml), made by FedMR's
    VARIANTS=(fedmrur-1600 fedmr-alpha0.5)
    # A unit is one row or
    # one run where runs are long (500 rounds of FedMR's CNN: about 50-95 min on one core, depending
    # on what else runs). FedMR: Table 1's CNN at α = 0.1 (its α = 0.5 cell: the variant, last); FedNLR:
    # FedAvg and FedNLR (500 rounds), then that seed's four FedDyn runs (200 rounds); FedInit: its
    # four methods; FedMRUR: its four methods. FedNLR's, FedInit's and FedMRUR's runs record how much each method's own component acted
    # (summary.json's activity), which their verdicts need: their pinned commit is one that does.
    # Two seeds of each paper come before any third seed, so that every paper gets a paired verdict
    # as early as the budget allows (FedMR's first two seeds were under way when this order was set;
    # FedMRUR's cell, added later, was moved up to that rule on 2026-11-27).
    fednlr_seed() { UNITS+=("fednlr:$1:methods=fedavg" "fednlr:$1:methods=fednlr" "fednlr:$1"); }
    fedinit_seed() { local m; for m in fedavg fedinit scaffold scaffold-ri; do UNITS+=("fedinit:$1:methods=$m"); done; }
    fedmrur_seed() { local m; for m in fedavg mofedsam fedmrur-n fedmrur; do UNITS+=("fedmrur:$1:methods=$m"); done; }
    # FedMRUR-N and FedMRUR with the momentum built from the plain mean Δ̄ (momentum_source = mean, spec
    # A9's other reading), added 2026-11-29 after seed 0 showed the normalised reading's momentum
    # loop; FedMRUR's pin moved from 0fb04b1 to the commit whose target has these two methods
    # (experiments/fedmrur/README.md: no training, model or data code differs, and a 3-round FedMRUR
    # run on CIFAR-10 gave the same records and checkpoint bit for bit at both)
    fedmrur_mean() { local m; for m in fedmrur-n-mean fedmrur-mean; do UNITS+=("fedmrur:$1:methods=$m"); done; }
    # FedMR's α = 0.1 cell at the paper's momentum 0.9 sat at chance in seeds 1 and 2 (its pool drifts
    # apart, as in the authors' code; FedMut's clients diverged), so the same cell at the authors'
    # code's momentum 0.5 comes first, beside FedNLR's seeds; the two 0.9 runs in flight finish after.
    fedmr_m05() { UNITS+=("fedmr:$1:rows=cnn-c10-0.1-m0.5"); }
    UNITS=()
    # FedMut at the stand-alone FedMut repository's setting (α = 4, T_mut = 50; row cnn-c10-0.1-m0.5-a27, added after
    # FedMut at α = 5 diverged in seed 1 of the momentum-0.5 cell): only its own run, the row's FedAvg
    # and FedMR runs being the momentum-0.5 row's
    fedmut_a4() { UNITS+=("fedmr:$1:methods=fedmut-a4"); }
    fedmr_m05 1; fednlr_seed 0; fedmr_m05 2; fednlr_seed 1; fedinit_seed 0; fedinit_seed 1
    fedmrur_seed 0; fedmrur_seed 1; fedmrur_mean 0; fedmrur_mean 1
    fedmut_a4 1; fedmut_a4 2
    UNITS+=(fedmr:1:rows=cnn-c10-0.1 fedmr:2:rows=cnn-c10-0.1)
    # The other papers' third seeds before FedMR's third at momentum 0.9 (2026-11-29): FedMR sat at
    # chance on both seeds of that row, so its verdict (reversed, −30.71 points, SE 2.73) cannot move
    # far, while the two-seed verdicts of the other cells (one degree of freedom) still can
    fedmr_m05 3; fedmut_a4 3
    fednlr_seed 2; fedinit_seed 2; fedmrur_seed 2; fedmrur_mean 2
    UNITS+=(fedmr:3:rows=cnn-c10-0.1)
    # Seeds 3 and 4 (2026-12-07), where an ordering of the cell is not decided at 95% with three seeds
    # (docs/reproducing.md: FedInit's two orderings; FedNLR's FedNLR > FedAvg, FedDyn > FedAvg and the
    # superseded FedDyn + FedNLR > FedDyn), by the same pinned commits: before FedMR's α = 0.5 cell,
    # since they decide orderings already reported; the targets' seeds list them, so the reports count
    # them as planned. FedMRUR's undecided orderings get theirs at its 1600 rounds (below).
    fednlr_seed 3; fedinit_seed 3; fednlr_seed 4; fedinit_seed 4
    # FedMRUR's cell at the paper's 1600 rounds (2026-12-07), its 500-round curves still closing at round
    # 500 (c10-dir0.3-differences.png): before FedMR's α = 0.5 cell, which asks a new question, since
    # these decide orderings already reported; seed by seed, the shortest runs of a seed first
    fedmrur_1600() { local m; for m in fedavg mofedsam fedmrur-n-mean fedmrur-mean fedmrur-n fedmrur; do
        UNITS+=("fedmrur-1600:$1:methods=$m"); done; }
    fedmrur_1600 0; fedmrur_1600 1; fedmrur_1600 2
    # its seeds 3 and 4 for the methods of the two orderings three seeds at 500 rounds did not decide at
    # 95% (MoFedSAM > FedAvg, FedMRUR (m from Δ̄) > MoFedSAM)
    for seed in 3 4; do
        for m in fedavg mofedsam fedmrur-mean; do UNITS+=("fedmrur-1600:$seed:methods=$m"); done
    done
    # FedMR's Dir α = 0.5 cell (2026-12-07; experiments/fedmr/claims-cifar10-alpha0.5.toml, FedMR's pinned
    # commit): each unit one method of one seed in both rows (momentum 0.9 and 0.5), FedMut at the
    # FedMR repository's α = 5 last (at α = 0.1 it diverged in five runs of six, within ten rounds)
    for seed in 1 2 3; do
        for m in fedavg fedmr fedmut-a4; do UNITS+=("fedmr-alpha0.5:$seed:methods=$m"); done
    done
    UNITS+=(fedmr-alpha0.5:1:methods=fedmut fedmr-alpha0.5:2:methods=fedmut fedmr-alpha0.5:3:methods=fedmut) ;;
*)
    sed -n '2,19p' "$0"; exit 2 ;;
esac
shift
RECORDS=claims-$SCALE  # the committed folder: experiments/<paper>/results/$RECORDS
VARIANTS=(${VARIANTS[@]+"${VARIANTS[@]}"})

spec() {  # spec NAME: a paper (PAPER) or a variant (PAPER-VARIANT: its own target, experiments/PAPER/
          # claims-SCALE-VARIANT.toml, read through --tables by PAPER's pinned commit; its runs in
          # OUT/VARIANT, its records in experiments/PAPER/results/claims-SCALE-VARIANT) -> paper, target,
          # records, tables (reproduce's option) and sub (OUT's subfolder)
    paper=${1%%-*} target=$1-$SUFFIX records=$RECORDS tables=() sub=
    if [ "$paper" != "$1" ]; then
        target=$paper-$SUFFIX-${1#*-} records=$RECORDS-${1#*-} sub=/${1#*-}
        tables=(--tables "$PWD/experiments/$paper/$records.toml")
    fi
}

restore() {  # committed records -> OUT (never over a run folder that is already there): the finished
             # runs' records, then the in-flight runs' checkpoints (save), which the queue continues
    local paper target records tables sub src rel runs kept
    spec "$1"
    runs="$2$sub/$paper/$REPRODUCE_SCALE"
    for kept in "experiments/$paper/results/$records/runs" "experiments/$paper/results/$records-inflight"; do
        for src in "$kept"/*/*/; do
            [ -f "$src/config.json" ] || continue
            rel="${src#"$kept/"}"
            [ -e "$runs/$rel" ] && continue
            mkdir -p "$runs/$rel" && cp -r "$src"/* "$runs/$rel/"
        done
    done
}

save() {  # the in-flight runs of OUT (a checkpoint, no summary yet) -> experiments/<paper>/results/claims-SCALE-inflight/,
          # replacing what was there: commit it when a session ends, and a fresh machine continues them from
          # their last round (restore) instead of from round 0. A run's client state goes too (it is part of
          # what --resume needs); a run whose client state exceeds 20 MB is left out and named.
    local paper target records tables sub dest run rel runs
    spec "$1"
    dest="experiments/$paper/results/$records-inflight" runs="$2$sub/$paper/$REPRODUCE_SCALE"
    rm -rf "$dest"
    for run in "$runs"/*/*-s[0-9]*/; do
        [ -f "$run/checkpoint.pt" ] && [ ! -f "$run/summary.json" ] || continue
        rel="${run#"$runs/"}"
        if [ -d "$run/client-state" ] && [ "$(du -sm "$run/client-state" | cut -f1)" -gt 20 ]; then
            echo "save: $rel left out: its client state is over 20 MB" >&2
            continue
        fi
        mkdir -p "$dest/$rel"
        cp "$run"/{config.json,metrics.jsonl,checkpoint.pt} "$dest/$rel/"
        [ ! -d "$run/client-state" ] || cp -r "$run/client-state" "$dest/$rel/"
        echo "save: $rel at round $(($(wc -l < "$run/metrics.jsonl") - 1))"
    done
}

report() {  # OUT's report of one paper and its finished runs' records -> the committed folder
    mkdir -p "$2"
    ( flock 9 && write_report "$@" ) 9>"$2/.report-$1.lock"  # both workers may be on one paper
}

write_report() {
    local paper target records tables sub dest run rel setting runs shadow
    spec "$1"
    dest="experiments/$paper/results/$records" runs="$2$sub/$paper/$REPRODUCE_SCALE"
    # The report is written into a folder of its own that sees OUT's run folders through links: a
    # unit's reproduce (the pinned code) writes its own report, of its seed and methods only, into
    # OUT's report folder when it ends, and one that ended between this --report and the copy below
    # was copied in its place (seen 2026-12-07 with two lanes on one paper)
    shadow=$(mktemp -d) && mkdir -p "$shadow/$paper/$REPRODUCE_SCALE"
    for setting in "$runs"/*/; do
        setting=${setting%/}
        [ "${setting##*/}" = "$target" ] || ln -s "$(cd "$setting" && pwd)" "$shadow/$paper/$REPRODUCE_SCALE/${setting##*/}"
    done
    "$FEDSUITE" reproduce "$target" ${tables[@]+"${tables[@]}"} --scale "$REPRODUCE_SCALE" --output-dir "$shadow" --report
    rm -rf "$dest" && mkdir -p "$dest/runs"
    cp "$shadow/$paper/$REPRODUCE_SCALE/$target/"{report.md,report.csv,claims.csv} "$dest/"
    cp "$shadow/$paper/$REPRODUCE_SCALE/$target/"*.png "$dest/" 2>/dev/null || true  # no figure before a run ends
    rm -rf "$shadow"
    # the records of the runs the report read, and each finished run's last checkpoint (with its client
    # state) where they take at most 20 MB together: the numbers need only the records, but a run can be
    # extended to more rounds (reproduce's extend) only from its checkpoint, and a new machine has only
    # what is committed (the FedMRUR cell's 500-round runs kept none, so its 1600 rounds start again)
    for run in "$runs"/*/*-s[0-9]*/; do
        [ -f "$run/summary.json" ] || continue
        rel="${run#"$runs/"}"
        mkdir -p "$dest/runs/$rel"
        cp "$run"/{config.json,metrics.jsonl,summary.json} "$dest/runs/$rel/"
        if [ -f "$run/checkpoint.pt" ] && [ "$(du -smc "$run/checkpoint.pt" "$run/client-state" 2>/dev/null | tail -n 1 | cut -f1)" -le 20 ]; then
            cp "$run/checkpoint.pt" "$dest/runs/$rel/"
            [ ! -d "$run/client-state" ] || cp -r "$run/client-state" "$dest/runs/$rel/"
        fi
    done
}

run_unit() {  # run_unit PAPER SEED PART OUT DATA: that seed's runs; PART "rows=R" or "methods=M" (reproduce's
              # --rows R / --methods M) runs only that part of them, empty: all of them
    local paper target records tables sub seed=$2 part=$3 out=$4 data=$5 fedsuite=$FEDSUITE out_option=--output-dir name=$1
    spec "$name"
    case " ${FROZEN:-} " in *" $paper "*) fedsuite=$(frozen_code "$paper") ;; esac
    local label="$target seed $seed${part:+ ($part)}" finished="$out/.finished-units"
    local unit="$label by $fedsuite"
    if [ -f "$finished" ] && grep -qxF -- "$unit" "$finished"; then
        echo "=== $label: finished (listed in $finished)"
        return
    fi
    # a frozen commit older than the option's rename spells it --out (grep reads the whole help: no SIGPIPE)
    "$fedsuite" reproduce --help | grep -- --output-dir > /dev/null || out_option=--out
    echo "=== $(date -u +%FT%TZ) $label (${fedsuite%/.venv/bin/fedsuite})"
    # --engine inprocess: the same numbers as Flower's engine, bit for bit (tests/test_registry_e2e.py),
    # with no Ray to start: at nice 19 on a busy machine, Ray's start timed out ("The current node
    # timed out during startup") and failed four runs (2026-11-27). --retry-failed: a run failed by
    # something outside it, such as that time-out, goes on from its checkpoint; one that fails by its
    # own arithmetic (FedMut's non-finite models) fails again within a round and stays named.
    if "$fedsuite" reproduce "$target" ${tables[@]+"${tables[@]}"} --scale "$REPRODUCE_SCALE" --seeds "$seed" \
        ${part:+"--${part%%=*}" "${part#*=}"} --jobs 1 --engine inprocess --retry-failed --data-root "$data" \
        "$out_option" "$out$sub"; then
        echo "$unit" >> "$finished"  # one short line per append: the two workers' lines never mix
    else
        echo "=== $label: exit $?"
    fi
    report "$name" "$out"
}

frozen_code() {  # frozen_code PAPER: the fedsuite of the commit pinned for PAPER's runs (pinned and made on first use)
    local pin="experiments/$1/results/$RECORDS.commit" commit dir
    ( flock 9
      [ -s "$pin" ] || git rev-parse HEAD > "$pin"
      commit=$(cat "$pin") dir="$(cd .. && pwd)/claims-code-$(cut -c1-12 "$pin")"
      if [ ! -x "$dir/.venv/bin/fedsuite" ]; then
          rm -rf "$dir" && git worktree prune && git worktree add -q --detach "$dir" "$commit"
          cp -al .venv "$dir/.venv"  # the same packages (hard links: no second copy of ~6 GB on disk); then its scripts and fedsuite point at the worktree
          grep -lI '^#!.*/\.venv/bin/' "$dir"/.venv/bin/* | xargs sed -i "1s#^\#!.*/\.venv/bin/#\#!$dir/.venv/bin/#"
          "$dir/.venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$dir" > /dev/null
      fi ) 9>".claims-code.lock" >&2
    echo "$(cd .. && pwd)/claims-code-$(cut -c1-12 "$pin")/.venv/bin/fedsuite"
}

held() {  # held FOLDER: whether a process holds an flock on FOLDER (fedsuite.records.hold.claimed: a run is going
           # on in it), read from /proc/locks by device and inode, so that looking never takes the lock
    local dev ino
    read -r dev ino < <(stat -c '%d %i' "$1")
    grep -qE "FLOCK +ADVISORY +WRITE +[0-9]+ +0*$(printf '%x:0*%x' $(((dev >> 8) & 0xfff)) $(((dev & 0xff) | ((dev >> 12) & 0xfff00)))):$ino " /proc/locks
}

status() {  # status OUT: each run with a checkpoint and no summary yet, running (a fedsuite process holds its
            # folder: held) or waiting for its unit, with its round, its pace over its
            # last 20 rounds and the time left at that pace; the units that the last `run` had not taken
            # yet (a finished unit is passed over in seconds)
    local out=$1 name paper target records tables sub run state running=0 next=0
    for name in "${PAPERS[@]}" ${VARIANTS[@]+"${VARIANTS[@]}"}; do
        spec "$name"
        for run in "$out$sub/$paper/$REPRODUCE_SCALE"/*/*-s[0-9]*/; do
            [ -f "$run/checkpoint.pt" ] && [ ! -f "$run/summary.json" ] || continue
            if held "$run"; then state=running running=$((running + 1)); else state=waiting; fi
            "$(dirname "$FEDSUITE")/python" - "$run" "$state" "$name/${run#"$out$sub/$paper/$REPRODUCE_SCALE/"}" <<'PY'
import json, sys
from pathlib import Path

run, state, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3].rstrip("/")
rounds = json.loads((run / "config.json").read_text())["rounds"]
lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
done = lines[-1]["round"] if lines else 0
walls = [line["wall_seconds"] for line in lines[-20:] if line.get("round", 0) > 0 and "wall_seconds" in line]
pace = f"{sum(walls) / len(walls):.1f} s a round, about {(rounds - done) * sum(walls) / len(walls) / 60:.0f} min left" \
    if walls else "no round timed yet"
print(f"{state:8} {name}: round {done} of {rounds}, {pace}")
PY
        done
    done
    [ "$running" -gt 0 ] || echo "no run is going on in $out"
    [ ! -f "$out/.units/next" ] || read -r next < "$out/.units/next"
    [ "$next" -le "${#UNITS[@]}" ] || next=${#UNITS[@]}
    echo "units not yet taken: $((${#UNITS[@]} - next)) of ${#UNITS[@]}${UNITS[next]:+ (next: ${UNITS[next]})}"
    [ "$next" -ge "${#UNITS[@]}" ] || printf '  %s\n' "${UNITS[@]:next}"
}

take() {  # the next unit of this `run`'s list (OUT/.units/next under its lock); fails when none is left
    local out=$1 i
    i=$( (flock 9 && read -r n < "$out/.units/next" && echo $((n + 1)) > "$out/.units/next" && echo "$n") \
        9>"$out/.units/lock")
    [ "$i" -lt "${#UNITS[@]}" ] && echo "${UNITS[$i]}"
}

pin() {  # this worker (0 or 1) onto its half of the cores, as `reproduce --jobs 2` pins its runs
    local cores
    cores=$("$(dirname "$FEDSUITE")/python" -c "from fedsuite.launch.processes import core_slices as c; s = c(2); print(','.join(map(str, sorted(s[$1]))) if s else '')")
    [ -z "$cores" ] || taskset -pc "$cores" "$BASHPID" > /dev/null
}

autogroups() {  # NICE=19 experiments/claims.sh ... run: the queue takes only the CPU that other work
                # leaves. Under sched_autogroup (Linux's default for desktops and many servers) a nice
                # value counts only inside its autogroup (the process's session), and every run the
                # queue starts is a session of its own; so the queue renices itself (`run`), and this
                # sets the autogroup of each process at that nice value (its runs, Ray's workers) to it,
                # every 15 s while the queue runs
    while kill -0 "$$" 2> /dev/null; do
        for p in $(ps -eo pid=,ni= | awk -v n="$1" '$2 == n {print $1}'); do
            [ ! -w "/proc/$p/autogroup" ] || echo "$1" > "/proc/$p/autogroup" 2> /dev/null || true
        done
        sleep 15
    done
}

worker() {  # units one after another until the list is done, one run at a time, on this worker's cores
    local out=$1 data=$2 unit paper seed part
    pin "$3"
    while unit=$(take "$out"); do
        IFS=: read -r paper seed part <<< "$unit"
        run_unit "$paper" "$seed" "$part" "$out" "$data"
    done
}

case "${1:-}" in
run)
    for paper in "${PAPERS[@]}" ${VARIANTS[@]+"${VARIANTS[@]}"}; do restore "$paper" "$2"; done
    rm -rf "$2/.units" && mkdir -p "$2/.units" && echo 0 > "$2/.units/next"
    if [ -n "${NICE:-}" ]; then renice -n "$NICE" -p $$ > /dev/null; autogroups "$NICE" & renicer=$!; fi
    worker "$2" "$3" 0 & lane0=$!
    worker "$2" "$3" 1 & lane1=$!
    wait "$lane0" "$lane1"  # the lanes only: the renicing loop lives as long as this script does
    [ -z "${renicer:-}" ] || kill "$renicer" ;;
report)  # report OUT [PAPER ...]: every paper, or those named; OUT gets the committed records first
    out=$2
    shift 2
    [ $# -gt 0 ] || set -- "${PAPERS[@]}" ${VARIANTS[@]+"${VARIANTS[@]}"}
    for paper in "$@"; do restore "$paper" "$out" && report "$paper" "$out"; done ;;
status)  # status OUT: where the queue stands
    [ -d "${2:-}" ] || { echo "claims.sh $SCALE status OUT: OUT must be the queue's runs folder (got '${2:-}')" >&2; exit 2; }
    status "$2" ;;
save)  # save OUT [PAPER ...]: the in-flight runs' checkpoints, to commit when a session ends
    out=$2
    shift 2
    [ $# -gt 0 ] || set -- "${PAPERS[@]}" ${VARIANTS[@]+"${VARIANTS[@]}"}
    for paper in "$@"; do save "$paper" "$out"; done ;;
*)
    sed -n '2,19p' "$0"; exit 2 ;;
esac
