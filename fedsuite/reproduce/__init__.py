"""``fedsuite reproduce``: a paper's table as one resumable, parallel queue of runs, and its report.

``fedsuite reproduce TARGET`` (:func:`main`, its options: :func:`parser`)
plans one ``fedsuite simulate`` run per (row, method, seed) of a paper's table under ``--out``,
checks that every dataset the runs need is on disk, works through the queue with ``--jobs``
simulations at once, and writes the report. One idea per module:

* :mod:`fedsuite.reproduce.tables`: the targets of ``experiments/<paper>/tables.toml`` (parsed and
  validated) and the runs of a selection (:func:`~fedsuite.reproduce.tables.plan`);
* :mod:`fedsuite.reproduce.queue`: the runs as processes, ``--jobs`` at a time, finished runs
  skipped, interrupted ones resumed, Ctrl-C and kill safe (also ``fedsuite sweep``'s queue);
* :mod:`fedsuite.reproduce.report`: per cell the published and the obtained numbers (each run's
  reading from ``fedsuite.results``, as ``fedsuite report``, ``sweep`` and a search read a run),
  as ``report.md``, ``report.csv``, ``claims.csv`` and one figure per row;
* :mod:`fedsuite.reproduce.verdicts`: each ordering the paper claims judged on the differences
  paired by seed: holds, within noise, reversed or not judged.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from fedsuite import rundir
from fedsuite.reproduce.queue import ReproduceError, pending, placement_options, queue_and_report
from fedsuite.reproduce.report import write_report
from fedsuite.reproduce.tables import SCALES, Target, load_targets, plan


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit code 2
        raise ReproduceError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fedsuite reproduce", description=(
        "Reproduce a paper's table: run its grid (rows x methods x seeds) as a resumable queue of "
        "`fedsuite simulate` runs and report obtained beside published. `fedsuite reproduce list` "
        "shows the targets."))
    p.add_argument("target", help="a target name (see `fedsuite reproduce list`), or `list`")
    p.add_argument("--rows", nargs="+", help="only these rows (names as in `list`)")
    p.add_argument("--methods", nargs="+", help="only these methods (columns)")
    p.add_argument("--seeds", nargs="+", type=int, help="seeds (default: the target's, per scale)")
    p.add_argument("--scale", choices=SCALES, default="paper",
                   help="paper: the paper's settings; cpu: the target's CPU-sized variant (orderings only)")
    p.add_argument("--jobs", type=int, default=1, help="simulations at once (default 1)")
    p.add_argument("--out", type=Path, default=Path("runs/reproduce"), help="folder for runs and reports")
    p.add_argument("--data-root", help="data_root of every run (where the datasets are)")
    p.add_argument("--num-gpus", type=float, help="GPU share per simulated client, passed to every run")
    p.add_argument("--ray-address", help="run every simulation's clients on this Ray cluster (host:port, auto)")
    p.add_argument("--tables", type=Path, action="append", default=[], help="another tables file (repeatable)")
    p.add_argument("--report", action="store_true", help="only write the report from the runs on disk")
    return p


def main(argv: Sequence[str]) -> int:
    """``fedsuite reproduce ...``; returns the exit code (0 all runs completed, 1 a run failed,
    2 a user error, 130 interrupted)."""
    from rich.console import Console

    console, err = Console(), Console(stderr=True)
    try:
        args = parser().parse_args(list(argv))
        if args.jobs < 1:
            raise ReproduceError(f"--jobs must be at least 1, got {args.jobs}")
        problem = rundir.folder_problem(args.out)
        if problem is not None:
            raise ReproduceError(f"--out: {problem}")
        targets = load_targets(args.tables)
        if args.target == "list":
            print_targets(targets, console)
            return 0
        if args.target not in targets:
            raise ReproduceError(f"unknown target {args.target!r}; allowed: {', '.join(sorted(targets))}")
        target = targets[args.target]
        specs = plan(target, args.scale, args.out, args.rows, args.methods, args.seeds, args.data_root)
        report_dir = (args.out / target.paper_key / args.scale / target.name).resolve()
        if args.report:
            path = write_report(target, specs, args.scale, report_dir)
            console.print(f"report -> {path}")
            return 0
        todo = pending(specs)
    except ReproduceError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    console.print(f"[bold]{target.name}[/] ({args.scale} scale): {len(specs)} runs, "
                  f"{len(specs) - len(todo)} already done, {args.jobs} at a time -> {report_dir.parent}")
    return queue_and_report(specs, args.jobs, placement_options(args.num_gpus, args.ray_address), console,
                            lambda: write_report(target, specs, args.scale, report_dir))


def print_targets(targets: dict[str, Target], console) -> None:
    """One block per target: name, title, grid size, and its row names (for --rows)."""
    for name, t in sorted(targets.items()):
        console.print(f"[bold]{name}[/]  {t.title}  ({len(t.rows)} rows x {len(t.methods)} methods; "
                      f"{t.file.parent.name}/{t.file.name})", highlight=False, soft_wrap=True)
        console.print("  methods: " + " ".join(t.methods), highlight=False, soft_wrap=True)
        console.print("  rows: " + " ".join(r.name for r in t.rows), highlight=False, soft_wrap=True)
