"""``fedsuite reproduce``: a paper's table as one resumable, parallel queue of runs, and its report.

``fedsuite reproduce TARGET`` (:func:`run_reproduce`; the options are ``fedsuite.cli.queues.reproduce``'s)
plans one ``fedsuite simulate`` run per (row, method, seed) of a paper's table under ``--output-dir``,
checks that every dataset the runs need is on disk, works through the queue with ``--jobs``
simulations at once, and writes the report. One idea per module:

* :mod:`fedsuite.queues.reproduce.tables`: the targets of ``experiments/<paper>/tables.toml`` (parsed and
  validated);
* :mod:`fedsuite.queues.reproduce.planning`: the runs of a selection
  (:func:`~fedsuite.queues.reproduce.planning.plan`), one per (row, method, seed);
* :mod:`fedsuite.queues.reproduce.queue`: the runs as processes, ``--jobs`` at a time, finished runs
  skipped, interrupted ones resumed, Ctrl-C and kill safe (also ``fedsuite sweep``'s queue);
* :mod:`fedsuite.queues.reproduce.report`: per cell the published and the obtained numbers (each run's
  reading from ``fedsuite.records.results``, as ``fedsuite report``, ``sweep`` and a search read a run),
  as ``report.md``, ``report.csv``, ``claims.csv`` and one figure per row;
* :mod:`fedsuite.queues.reproduce.verdicts`: each ordering the paper claims judged on the differences
  paired by seed against the paper's own difference: holds, reversed, could not tell, smaller than
  the paper's, or not judged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from rich.text import Text

from fedsuite.records.paths import folder_problem
from fedsuite.queues.reproduce.queue import (ReproduceError, check_recorded, completed, name_failed, other_folder, pending,
                                      queue_and_report)
from fedsuite.queues.reproduce.report import write_report
from fedsuite.queues.reproduce.planning import plan
from fedsuite.queues.reproduce.tables import SCALES, Target, load_targets
from fedsuite.queues.reproduce.verdicts import DEFAULT_CONFIDENCE


def run_reproduce(target_name: str, rows: Sequence[str] | None, methods: Sequence[str] | None,
                  seeds: Sequence[int] | None, scale: str | None, jobs: int, output_dir: Path, data_root: str | None,
                  placement: Sequence[str], tables: Sequence[Path], report_only: bool,
                  console, retry_failed: bool = False, confidence: float = DEFAULT_CONFIDENCE) -> int:
    """The command (``target_name`` ``list``: the targets): plan, check, queue, report. Returns the
    exit code (0 every run completed, 1 a run did not, 130 interrupted); raises
    :class:`ReproduceError` for bad input (exit 2, nothing started): among it a run on disk that is
    not the run the target asks for (its config changed since, e.g. by a ``--tables`` file that
    replaces the target: ``fedsuite.queues.reproduce.queue.check_recorded``), also with ``--report``, which
    would read it as the target's. A failed run is named at the start and left as it is, or run
    again with ``retry_failed`` (``--retry-failed``). ``scale`` None: :func:`default_scale`. The
    report judges each claimed ordering at ``confidence`` (``--confidence``:
    :mod:`fedsuite.queues.reproduce.verdicts`)."""
    if scale is not None and scale not in SCALES:
        raise ReproduceError(f"unknown scale {scale!r}; allowed: {', '.join(SCALES)}")
    if jobs < 1:
        raise ReproduceError(f"--jobs must be at least 1, got {jobs}")
    if not 0.0 < confidence < 1.0:  # NaN too
        raise ReproduceError(f"--confidence must lie strictly between 0 and 1 (0.95: a 95% t-interval), got {confidence}")
    if report_only and retry_failed:
        raise ReproduceError("--report only writes the report; --retry-failed belongs to a queue that runs")
    problem = folder_problem(output_dir)
    if problem is not None:
        raise ReproduceError(f"--output-dir: {problem}")
    targets = load_targets(tables)
    if target_name == "list":
        print_targets(targets, console)
        return 0
    if target_name not in targets:
        raise ReproduceError(f"unknown target {target_name!r}; allowed: {', '.join(sorted(targets))}")
    target = targets[target_name]
    if scale is None:
        scale = default_scale(target, placement, report_only, gpu_here(),
                              lambda: plan(target, "paper", output_dir, rows, methods, seeds, data_root))
        console.print(f"--scale {scale}: {SCALE_REASON[scale]}", soft_wrap=True)
    specs = plan(target, scale, output_dir, rows, methods, seeds, data_root)
    report_dir = (output_dir / target.paper_key / scale / target.name).resolve()
    if report_only:
        check_recorded(specs, other_folder("another --output-dir"))
        path = write_report(target, specs, scale, report_dir, confidence)
        console.print(f"report -> {path}")
        return 0
    # the checks, simulate's for every run among them: nothing starts unless they pass
    todo = pending(specs, retry_failed, other_folder("another --output-dir"), placement)
    console.print(Text.assemble((target.name, "bold"), f" ({scale} scale): {len(specs)} runs, "
                                f"{completed(specs)} already done, {len(todo)} to run, {jobs} at a time -> "
                                f"{report_dir.parent}"))
    name_failed(specs, retry_failed, console)
    return queue_and_report(specs, jobs, placement, console,
                            lambda: write_report(target, specs, scale, report_dir, confidence), retry_failed)


#: what ``fedsuite reproduce`` says when it chose the scale itself (:func:`default_scale`)
SCALE_REASON = {"paper": "the paper's settings (the default with a GPU here or a Ray cluster)",
                "cpu": "the target's CPU-sized variant, the default on a machine without a GPU (--scale paper runs "
                       "the paper's settings; its numbers compare orderings only)"}


def gpu_here() -> bool:
    """Whether this machine has a CUDA device torch can use."""
    import torch

    return torch.cuda.is_available()


def default_scale(target: Target, placement: Sequence[str], report_only: bool, gpu: bool,
                  paper_runs: Callable[[], list]) -> str:
    """The scale of a ``fedsuite reproduce`` given no ``--scale``: ``paper`` where the runs have a
    GPU (``gpu``: this machine has one) or run on a Ray cluster (``--ray-address``: its hardware is
    not this machine's); else the target's ``cpu`` scale where it has one. A target with only the
    paper scale, on a machine without a GPU, is refused (:class:`ReproduceError`, naming how many
    runs and rounds of which models it would start: ``paper_runs()``, the paper scale's plan) unless
    nothing runs (``--report``): the paper's settings (hundreds of rounds of ResNet-18) on a CPU
    take days, and ``--scale paper`` asks for them explicitly."""
    if gpu or "--ray-address" in placement:
        return "paper"
    if target.has_cpu_scale:
        return "cpu"
    if report_only:
        return "paper"
    runs = paper_runs()
    models = ", ".join(sorted({f"{run.cfg.model} on {run.cfg.dataset}" for run in runs}))
    raise ReproduceError(f"{target.name} has only the paper scale, {len(runs)} runs of "
                         f"{sum(run.rounds for run in runs)} rounds in all ({models}), sized for GPUs, and this "
                         f"machine has none: pass --scale paper to start them on its CPU anyway")


def print_targets(targets: dict[str, Target], console) -> None:
    """One block per target: name, title, grid size, and its row names (for --rows)."""
    for name, t in sorted(targets.items()):
        console.print(Text.assemble((name, "bold"), f"  {t.title}  ({len(t.rows)} rows x {len(t.methods)} methods; "
                                    f"{t.file.parent.name}/{t.file.name})"), soft_wrap=True)
        console.print("  methods: " + " ".join(t.methods), highlight=False, soft_wrap=True)
        console.print("  rows: " + " ".join(r.name for r in t.rows), highlight=False, soft_wrap=True)
