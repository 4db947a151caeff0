"""The queue: runs as ``fedsuite simulate`` processes, ``--jobs`` at a time, resumable.

The queue of ``fedsuite reproduce``, ``fedsuite sweep`` and (its command line, environment and the
checks before it starts) ``fedsuite sweep --search``. A queued run is a :class:`QueuedRun` (a
target's :class:`fedsuite.queues.reproduce.planning.RunSpec`, a sweep's ``SweepRun``):

* before anything starts (:func:`pending`), every run folder that holds a run is checked to hold
  the run asked for: its recorded ``config.json`` equals the run's config up to the rounds and the
  fields that do not make another experiment (``fedsuite.records.rundir.config_mismatch``, the comparison
  ``--resume`` makes). A run of another config (a base ``--set`` or a target's config changed since
  it ran) stops the queue in one line naming the run folder and the differing fields, exit code 2,
  nothing started or written: it is never continued, skipped as done or read into a report as the
  new setting's. A folder without ``config.json`` (a run killed in its first seconds) records no
  run and is started anew, as before;
* then every dataset the runs need is checked (:func:`missing_data`), and every run to run is
  checked as its ``fedsuite simulate`` would check it before its run folder exists (:func:`check_runs`:
  the hardware it asks for, and a partition and model its data can take), so that a run that would
  fail at once stops the queue in one line before anything starts;
* a run is judged only from a record that passes the check ``--resume`` makes (``rundir.state``:
  ``damaged`` otherwise, ``integrity.record_problem``: a checkpoint deleted, unreadable or another
  run's, a summary or client state of another run): a damaged run is never counted done, never
  started, and named at the start of every queue and in the report, with why;
* a run whose ``summary.json`` says ``completed`` with the rounds asked is skipped; a run directory
  that holds a ``config.json`` but no finished summary is continued with ``fedsuite simulate
  --resume`` (the run restarts from its last per-round checkpoint, so a killed queue loses at most
  the rounds that were in flight), and so is a completed run asked for more rounds than it has (a
  target's rounds raised: it goes on from its last round); a run that has more rounds than asked
  is left as it is and reported (``rundir.state``);
* a run that ended ``failed`` is named at the start of every later queue, one line each with the
  round it stopped after and why (:func:`name_failed`), and left as it is, so that a failure that
  would recur is not run again unasked; the report names it too and the command exits 1. With
  ``retry_failed`` (``--retry-failed``) it is run again, continued with ``--resume`` from its last
  checkpoint like a partial run: its completed rounds are kept, and a failure of the run itself
  (a diverged model) comes back at the same round, while one of its surroundings (a machine out of
  memory, a lost Ray node, a fixed bug) does not;
* each run is a ``fedsuite simulate`` process of its own in this process's group, forked from a
  warm process that has imported torch, the methods and the CLI once (``fedsuite.launch.warm``: about 2.5
  CPU-seconds a run saved); both die with their parent (``PR_SET_PDEATHSIG``,
  ``fedsuite.launch.reaper.die_with_parent``), so a killed queue takes its runs with it; Ctrl-C or SIGTERM
  stops each run's whole process tree (``fedsuite.launch.processes.stop_tree``);
* with ``jobs`` > 1, each running run (its private Ray, clients and server) is pinned to its own
  share of the cores (``fedsuite.launch.processes.core_slices``), so that runs do not spin on each
  other's cores; what a run computes does not depend on it.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from fedsuite.records import hold, rundir
from fedsuite.errors import FedsuiteError
from fedsuite.launch.processes import core_slices, fedsuite_first, stop_tree

if TYPE_CHECKING:
    from fedsuite.config import BaseRunConfig


class ReproduceError(FedsuiteError, ValueError):
    """A user error (unknown target, row or method, a bad tables file, missing data); one line."""


@dataclass(kw_only=True)
class QueuedRun(ABC):
    """One ``fedsuite simulate`` run of a queue: what the queue needs of it, whatever grid it
    belongs to (a subclass adds its place in the grid and its ``label``)."""

    run_dir: Path
    config: Path | None  # the TOML file the run starts from (None: the defaults)
    overrides: list[str]  # --set key=value, in order
    rounds: int
    dataset: tuple[str, str, str]  # (name, data_root, dataset_options as JSON)
    cfg: BaseRunConfig  # the config the run runs: what its recorded config.json must equal

    @property
    @abstractmethod
    def label(self) -> str:
        """The run's name in the queue's lines."""

    def command(self, resume: bool, placement: Sequence[str] = ()) -> list[str]:
        return simulate_command(self.config, self.overrides, resume, placement)


def simulate_command(config: Path | None, overrides: Sequence[str], resume: bool,
                     placement: Sequence[str] = ()) -> list[str]:
    """The ``fedsuite simulate`` command line of a queued run (``--resume`` continues it);
    ``placement``: options that say where every run executes (:func:`placement_options`)."""
    cmd = [sys.executable, "-m", "fedsuite.cli.main", "simulate"]
    if config is not None:
        cmd += ["--config", str(config)]
    for item in overrides:
        cmd += ["--set", item]
    return cmd + list(placement) + (["--resume"] if resume else [])


def placement_options(num_gpus: float | None, ray_address: str | None, engine: str | None = None) -> list[str]:
    """``fedsuite simulate`` options passed to every run: the GPU share per client, the Ray
    cluster and the engine (``flower`` or ``inprocess``, which gives the same numbers bit for bit).
    None changes what a run computes, so each may differ when a run is resumed. ``ReproduceError``
    for a Ray cluster with the in-process engine, which uses no Ray (every run would fail on it)."""
    if engine == "inprocess" and ray_address is not None:
        raise ReproduceError("--engine inprocess calls every client in the run's own process, without Ray: "
                             "--ray-address goes with --engine flower")
    return ([] if num_gpus is None else ["--num-gpus", f"{num_gpus:g}"]) + \
        ([] if ray_address is None else ["--ray-address", ray_address]) + \
        ([] if engine is None else ["--engine", engine])


def missing_data(specs: Sequence[Any]) -> list[str]:
    """One message per dataset the runs need that is not on disk (the loader's own message: the
    missing files and the expected layout). Loaders are called with downloads off."""
    from fedsuite.method import registry
    from fedsuite.data import load_dataset
    problems = []
    for name, root, options in sorted({s.dataset for s in specs}):
        opts = json.loads(options)
        if "download" in inspect.signature(registry.datasets()[name]).parameters:
            opts["download"] = False
        try:
            load_dataset(name, Path(root).expanduser(), **opts)
        except Exception as exc:  # DatasetError, and the npz/imagefolder loaders' file errors
            problems.append(f"{name} (data_root {root}): {str(exc).strip()}")
    return problems


#: what ``fedsuite simulate`` options of :func:`placement_options` set in a run's config
PLACEMENT_KEYS = {"--num-gpus": ("num_gpus", float), "--ray-address": ("ray_address", str), "--engine": ("engine", str)}


def placed(cfg: Any, placement: Sequence[str]) -> Any:
    """``cfg`` as its run runs it under ``placement`` (:func:`placement_options`: the options every
    run of a queue is given on its command line)."""
    update = {}
    for option, value in zip(placement[::2], placement[1::2]):
        key, kind = PLACEMENT_KEYS[option]
        update[key] = kind(value)
    return cfg.model_copy(update=update) if update else cfg


def check_runs(specs: Sequence[Any], placement: Sequence[str] = (),
               subject: Callable[[Any], str] = lambda spec: spec.label) -> None:
    """The checks ``fedsuite simulate`` makes before its run folder exists, beyond its config's
    validation (which :func:`fedsuite.queues.reproduce.planning.plan` and ``fedsuite.queues.sweep.plan`` make), for
    every run of ``specs`` as ``placement`` places it: the hardware it asks for
    (``runtime.check_hardware``: a client's CPU cores, GPUs that exist, a reachable Ray cluster) and
    its data, partition and model (``runtime.check_data``: "a model that cannot take the data",
    ``--model cnn`` on feature vectors). Else :class:`ReproduceError`, one line naming the run
    (``subject``: a sweep names the setting) and simulate's reason: a run that would fail at once is
    refused before the queue starts, not run and reported "not run". Each distinct check is made
    once (seeds share hardware; settings share data and model); call it once the data is known to be
    on disk (:func:`missing_data`). Writes nothing but the partitions a first run caches under its
    ``data_root``, as simulate's own check does."""
    from fedsuite.engine import runtime
    from fedsuite.config import ConfigError
    from fedsuite.errors import DataError

    done: set[tuple] = set()
    try:
        for spec in specs:
            cfg = placed(spec.cfg, placement)
            hardware = ("hardware", cfg.num_cpus, cfg.num_gpus, cfg.device, cfg.ray_address)
            data = ("data", cfg.dataset, cfg.data_root, json.dumps(cfg.dataset_options, sort_keys=True),
                    cfg.partitioner, cfg.num_clients, cfg.seed, cfg.alpha, cfg.min_partition_size,
                    cfg.classes_per_client, cfg.shards_per_client, cfg.partition_by, cfg.model)
            for key, check in ((hardware, runtime.check_hardware), (data, runtime.check_data)):
                if key in done:
                    continue
                try:
                    check(cfg)
                except (ConfigError, DataError) as exc:
                    raise ReproduceError(f"{subject(spec)}: {str(exc).strip().splitlines()[0]}; nothing was started") \
                        from None
                done.add(key)
    finally:
        runtime.forget_data()  # the runs load their data in their own processes


def runnable(retry_failed: bool) -> tuple[str, ...]:
    """The states (``rundir.state``) of the runs a queue runs: new, partial (resumed or extended),
    debris (started anew), and failed with ``retry_failed``."""
    return ("new", "partial", "debris", "failed") if retry_failed else ("new", "partial", "debris")


def check_recorded(specs: Sequence[Any], remedy: str) -> None:
    """That every run folder of ``specs`` holding a run holds the run asked for
    (``rundir.config_mismatch``); else :class:`ReproduceError`, one line: the first such run folder
    and its differing fields, how many other runs differ, and what to do (``remedy``, the
    command's). Reads only."""
    from fedsuite.config import ConfigError

    stale = []
    for spec in specs:
        try:
            changed = rundir.config_mismatch(spec.run_dir, spec.cfg, who=spec.label)
        except ConfigError as exc:
            raise ReproduceError(f"{exc}; nothing was started") from None
        if changed:
            stale.append((spec, changed))
    if stale:
        (spec, changed), more = stale[0], len(stale) - 1
        raise ReproduceError(
            f"{spec.run_dir} holds a run of another config ({'; '.join(changed)})"
            + (f", and {more} more run{'s' if more > 1 else ''} of this queue differ" if more else "")
            + f"; nothing was started: {remedy}")


def other_folder(options: str) -> str:
    """What a queue's user does about a run of another config in its folder (:func:`check_recorded`);
    ``options``: the command's options that name another folder."""
    return f"ask for the recorded config, or give the new runs another folder ({options})"


def pending(specs: Sequence[Any], retry_failed: bool = False, remedy: str = other_folder("another --output-dir"),
            placement: Sequence[str] = (), subject: Callable[[Any], str] = lambda spec: spec.label) -> list[Any]:
    """The runs still to run (neither completed nor failed; failed too with ``retry_failed``), once
    every run on disk is the one asked for (:func:`check_recorded`), every dataset they need is on
    disk and each passes the checks its ``fedsuite simulate`` would make before it starts
    (:func:`check_runs`, under ``placement``); else :class:`ReproduceError` naming the run and its
    fields, listing what data is missing and the expected layout, or naming the run (``subject``)
    and simulate's reason, nothing started."""
    check_recorded(specs, remedy)
    todo = [s for s in specs if rundir.state(s.run_dir, s.rounds) in runnable(retry_failed)]
    problems = missing_data(todo)
    if problems:
        raise ReproduceError("missing data, nothing was started:\n  " + "\n  ".join(problems))
    check_runs(todo, placement, subject)
    return todo


def name_failed(specs: Sequence[Any], retry_failed: bool, console) -> None:
    """One line per run that ended ``failed``: the round it stopped after and why (its
    ``summary.json``, as the report says it: ``rundir.why_incomplete``), and whether this queue runs
    it again (``retry_failed``) or how to; and one per run that is ``damaged`` (never run): why its
    record is refused, and what to do."""
    for spec in specs:
        now = rundir.state(spec.run_dir, spec.rounds)
        if now == "damaged":
            console.print(f"{rundir.why_incomplete(spec.run_dir, spec.label, spec.rounds)}; not run: put the run's "
                          "own files back, or remove its folder to run it anew", highlight=False, soft_wrap=True)
        if now != "failed":
            continue
        then = ("run again (--retry-failed), from its last checkpoint" if retry_failed else
                "not run again; --retry-failed runs it again from its last checkpoint")
        console.print(f"{rundir.why_incomplete(spec.run_dir, spec.label, spec.rounds)} ({spec.run_dir}); {then}",
                      highlight=False, soft_wrap=True)


def completed(specs: Sequence[Any]) -> int:
    """How many of ``specs`` are completed with the rounds asked (a queue's "already done")."""
    return sum(1 for s in specs if rundir.state(s.run_dir, s.rounds) == "completed")


def interrupt(*_: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the queue like Ctrl-C


#: a run's state in the queue when another fedsuite process is running it (``hold.held_elsewhere``)
IN_USE = "in use"


def run_queue(specs: Sequence[Any], jobs: int = 1, placement: Sequence[str] = (),
              console=None, poll_s: float = 0.5, retry_failed: bool = False) -> dict[Path, str]:
    """Run every spec that is not completed or failed (failed too with ``retry_failed``), ``jobs``
    at a time, each as a ``fedsuite simulate`` process of its own (``--resume`` where a partial or
    failed run exists), forked from one warm process that has the imports done
    (``fedsuite.launch.warm``); show one progress display. Returns each run directory's final state
    (``rundir.state``, or ``failed`` for a run whose process exited non-zero, or ``in use`` for a
    run that another fedsuite process is running: a second queue of the same target, which this
    queue leaves it to; it is not started, or, held after it started, its refusal is no failure). Ctrl-C/SIGTERM stops
    every running run's process tree, then re-raises. The caller has checked the runs
    (:func:`pending`)."""
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text

    from fedsuite.cli.support import plain_console
    from fedsuite.launch.warm import WarmStarter

    console = console or plain_console()
    slices = core_slices(jobs)  # each running run's own share of the cores (None: one job, unpinned)
    initial = {s.run_dir: rundir.state(s.run_dir, s.rounds) for s in specs}  # what each run starts from
    todo = [s for s in specs if initial[s.run_dir] in runnable(retry_failed)]
    states = {s.run_dir: "queued" if initial[s.run_dir] in runnable(retry_failed) else initial[s.run_dir]
              for s in specs}
    done_at_start = {s.run_dir: (s.rounds if initial[s.run_dir] == "completed" else
                                 rundir.rounds_done(s.run_dir) if initial[s.run_dir] in ("partial", "failed") else 0)
                     for s in specs}
    progress = dict(done_at_start)
    running: dict[Any, tuple[Any, Path, int]] = {}  # a run's process (fedsuite.launch.warm) -> spec, log, slot
    started = time.monotonic()
    total_rounds = sum(s.rounds for s in specs)

    def display() -> Table:
        finished = sum(1 for s in specs if states[s.run_dir] in ("completed", "failed", "longer", "damaged"))
        gained = sum(progress.values()) - sum(done_at_start.values())
        left = total_rounds - sum(progress.values())
        elapsed = time.monotonic() - started
        eta = f"{left * elapsed / gained / 60:.0f} min" if gained > 0 else "-"
        table = Table.grid(padding=(0, 2))
        table.add_row(Text.assemble((f"runs {finished}/{len(specs)} done", "bold"), f", {len(running)} running, "
                                    f"{len(todo)} queued; rounds {sum(progress.values())}/{total_rounds}; "
                                    f"elapsed {elapsed / 60:.1f} min, ETA {eta}"))
        for spec, *_ in running.values():
            table.add_row(f"  {spec.label}: round {progress[spec.run_dir]}/{spec.rounds}")
        return table

    def start(spec: Any) -> None:
        state = initial[spec.run_dir]
        spec.run_dir.parent.mkdir(parents=True, exist_ok=True)
        log = spec.run_dir.parent / f"{spec.run_dir.name}.log"
        slot = min(set(range(jobs)) - {s for *_, s in running.values()})
        # its own process, on its share of the cores, dying with this one (fedsuite.launch.warm)
        proc = starter.start(spec.command(resume=state in ("partial", "failed"), placement=placement), log,
                             None if slices is None else slices[slot], fedsuite_first(os.environ))
        states[spec.run_dir] = "running"
        running[proc] = (spec, log, slot)
        verb = ("retry " if state == "failed" else "start " if state != "partial" else
                "extend" if rundir.summary_status(spec.run_dir) else "resume")
        console.print(f"{verb} {spec.label} -> {spec.run_dir}", highlight=False, soft_wrap=True)

    starter = WarmStarter() if todo else None
    try:
        with Live(display(), console=console, refresh_per_second=2, transient=True) as live:
            while todo or running:
                while todo and len(running) < jobs:
                    spec = todo.pop(0)
                    if hold.held_elsewhere(spec.run_dir):
                        states[spec.run_dir] = IN_USE
                        console.print(f"{IN_USE:9s} {spec.label}: another fedsuite process runs it; left to that one",
                                      highlight=False)
                        continue
                    start(spec)
                for proc in list(running):
                    spec, log, _ = running[proc]
                    progress[spec.run_dir] = max(progress[spec.run_dir], rundir.rounds_done(spec.run_dir))
                    if proc.poll() is None:
                        continue
                    del running[proc]
                    state = rundir.state(spec.run_dir, spec.rounds)
                    if proc.returncode == 2 and hold.held_elsewhere(spec.run_dir):  # taken while it started
                        state = IN_USE
                    states[spec.run_dir] = state if proc.returncode == 0 or state in ("failed", "damaged", IN_USE) \
                        else "failed"
                    if states[spec.run_dir] == "completed":
                        progress[spec.run_dir] = spec.rounds
                    console.print(f"{states[spec.run_dir]:9s} {spec.label} (exit {proc.returncode}"
                                  f"{'' if proc.returncode == 0 else f'; log {spec.run_dir}.log'})", highlight=False)
                live.update(display())
                time.sleep(poll_s)
    except BaseException:
        for proc in running:
            stop_tree(proc)
        raise
    finally:
        if starter is not None:
            starter.close()
    return {s.run_dir: states[s.run_dir] for s in specs}


def queue_and_report(specs: Sequence[Any], jobs: int, placement: Sequence[str], console,
                     report: Callable[[], Path], retry_failed: bool = False) -> int:
    """:func:`run_queue`, stopped like Ctrl-C by SIGTERM, then ``report()``. Returns the exit code:
    0 every run completed, 1 a run did not (its log lies beside it; a failed run left as it was
    counts), 130 interrupted."""
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        states = run_queue(specs, jobs, placement, console, retry_failed=retry_failed)
    except KeyboardInterrupt:
        console.print("interrupted: running runs stopped; the same command continues where it stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    path = report()
    failed = [p for p, s in states.items() if s != "completed"]
    console.print(f"report -> {path}" + (f"; {len(failed)} run(s) did not complete (logs beside them)" if failed else ""))
    return 1 if failed else 0
