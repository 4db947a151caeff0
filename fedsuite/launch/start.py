"""Start and watch a run's simulation (``fedsuite simulate``): its app, its process (the watchdog is
``fedsuite.launch.watch``).

Per run:

1. a simulation process is started in its own session, before the run is named
   (:func:`start_simulation_process`: the CLI does so at its first line, and the process imports
   torch, Flower's engine and the apps meanwhile);
2. writes a thin Flower app (a ``pyproject.toml`` whose ``[tool.flwr.app.config]`` is the resolved
   config) into ``<run>/app``; the components are the installed ``fedsuite`` apps;
3. names the run to the process on its stdin (:func:`simulate`): the app, the log
   ``<run>/flower.log`` and the run's environment, whose ``FLWR_HOME=<run>/.flwr`` every process it
   starts then carries (the reaper's mark, ``fedsuite.launch.reaper``; the simulation process itself dies
   with the launcher, PDEATHSIG); it starts Ray (a private Ray in a
   temporary directory of the run, or ``cfg.ray_address``'s cluster) while the caller checks the
   data, then gets ``start``: Flower's Simulation Engine with the ServerApp and the Ray-backed
   ClientApps (``fedsuite.launch.simulation``);
4. draws progress from ``metrics.jsonl`` (with a stall watchdog: ``fedsuite.launch.watch.watch``)
   until ``summary.json`` appears or the process ends; the outcome is ``summary.json``'s status,
   else the process's exit code;
5. stops every process of the run, by that mark.

The run's environment, and the scan and stop of its processes, are ``fedsuite.launch.processes``; what a
run directory holds (may it be continued, how did it end) is read through ``fedsuite.records.rundir``. On the
Deployment Engine the ServerApp runs under a SuperLink instead: ``fedsuite.deploy.superlink``, which
watches its runs with the same ``fedsuite.launch.watch``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import tomli_w

from fedsuite.launch import reaper
from fedsuite.launch.watch import LaunchError, watch
from fedsuite.records import hold, rundir
from fedsuite.launch.processes import (STOP_GRACE_S, new_attempt, process_env, process_tree, run_env, stop_tree,
                                terminate_all)

if TYPE_CHECKING:
    from fedsuite.config import BaseRunConfig

# This module imports torch, pydantic and the registry only where a function needs them (via
# fedsuite.config): the CLI imports it first, to start a simulation process before its own imports
# (start_simulation_process).


@dataclass
class RunOutcome:
    run_dir: Path
    status: str  # "finished:completed" | "finished:failed" | ...
    details: str
    ran: bool = True  # False: the run was complete already and nothing was started or written

    @property
    def ok(self) -> bool:
        return self.status == "finished:completed"


def write_app(app_dir: Path, cfg: BaseRunConfig, run_dir: Path) -> None:
    """A Flower app directory holding only a pyproject.toml that points at the fedsuite apps."""
    from fedsuite.config import to_run_config
    from fedsuite.engine.runtime import RUN_DIR_KEY

    write_app_config(app_dir, {**to_run_config(cfg), RUN_DIR_KEY: str(run_dir)})


def write_app_config(app_dir: Path, flat: dict[str, Any]) -> None:
    """:func:`write_app` with the app's run config given (``[tool.flwr.app.config]``)."""
    app_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        "[build-system]", 'requires = ["hatchling"]', 'build-backend = "hatchling.build"', "",
        "[project]", 'name = "fedsuite-run"', 'version = "1.0.0"', "dependencies = []", "",
        "[tool.flwr.app]", 'publisher = "fedsuite"', "",
        "[tool.flwr.app.components]", 'serverapp = "fedsuite.server_app:app"', 'clientapp = "fedsuite.client_app:app"', "",
        "[tool.flwr.app.config]",
    ]
    body = tomli_w.dumps({k: flat[k] for k in sorted(flat)})
    (app_dir / "pyproject.toml").write_text("\n".join(lines) + "\n" + body)


def start_simulation_process() -> subprocess.Popen:
    """Start a run's simulation process before the run is named (``python -m fedsuite.launch.simulation
    --await-start``): it imports torch, Flower's engine and the apps while the caller
    builds the config, then waits for :func:`simulate` to name the run. The CLI starts it at its
    first line, so those imports use the second core while its own imports use the first. It dies
    with the process that started it; its output goes to an unnamed temporary file (removed here at
    once: the process holds it open) until the run is named, and is then moved to the run's
    ``flower.log``."""
    fd, early_log = tempfile.mkstemp(prefix="fedsuite-simulation-", suffix=".log")
    try:
        return subprocess.Popen([sys.executable, "-m", "fedsuite.launch.simulation", "--await-start"],
                                env=process_env(), stdout=fd, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                start_new_session=True, preexec_fn=reaper.die_with_parent())
    finally:
        os.close(fd)
        os.unlink(early_log)


@contextmanager
def simulation_process() -> Iterator[subprocess.Popen]:
    """:func:`start_simulation_process`, ended on leaving if no run took it (its stdin closed: it
    leaves at once; killed if still there), e.g. when the config it waited for was refused."""
    proc = start_simulation_process()
    try:
        yield proc
    finally:
        if not proc.stdin.closed:
            proc.stdin.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def simulate(cfg: BaseRunConfig, run_dir: Path,
             on_progress: Callable[[list[dict[str, Any]]], None] | None = None,
             before_start: Callable[[], None] | None = None,
             process: subprocess.Popen | None = None) -> RunOutcome:
    """Run ``cfg`` on Flower's Simulation Engine (``fedsuite.launch.simulation``); results land in
    ``run_dir``. The clients run on a private Ray, or on the cluster ``cfg.ray_address`` names.

    ``process``: a simulation process from :func:`start_simulation_process` (started at once if
    none). It is told the run (its app, log and environment: it starts Ray), then ``before_start``
    (the CLI's data check) runs while Ray starts, then it is told to begin: a first run's partition
    (about 2 s on 2 cores) no longer precedes Ray's start. If ``before_start`` raises, the process
    and its Ray are stopped, the folders this call created are removed, and the exception
    propagates: nothing is left behind."""
    run_dir = run_dir.resolve()
    created = _make_run_dir(run_dir, cfg)
    # this process's run until it returns: a second one is refused
    with hold.claimed(run_dir, exclude=(process.pid,) if process is not None else ()):
        if cfg.engine == "inprocess":
            return _simulate_inprocess(cfg, run_dir, created, on_progress, before_start)
        return _simulate(cfg, run_dir, created, on_progress, before_start, process)


def _make_run_dir(run_dir: Path, cfg: BaseRunConfig) -> Path | None:
    """Make ``run_dir`` with its ``config.json`` in one step (``hold.create_run_dir``: no kill leaves
    a run folder without its config), and its missing parents; return the outermost folder this
    made, which is removed if the run is called off before it starts (None: ``run_dir`` existed)."""
    outermost = run_dir
    while not outermost.parent.exists():
        outermost = outermost.parent
    made = None if outermost.exists() else outermost
    hold.create_run_dir(run_dir, cfg.active_dump())
    return made


def _take_debris(cfg: BaseRunConfig, run_dir: Path) -> None:
    """In a folder this process holds: a start-up's debris (``hold.start_debris``: left by a fedsuite
    that made the folder before its config) is cleared and the run's ``config.json`` recorded before
    anything else is written."""
    if hold.start_debris(run_dir):
        hold.clear_start_debris(run_dir)
        hold.record_config(run_dir, cfg.active_dump())


def _simulate_inprocess(cfg: BaseRunConfig, run_dir: Path, created: Path | None,
                        on_progress: Callable[[list[dict[str, Any]]], None] | None,
                        before_start: Callable[[], None] | None) -> RunOutcome:
    """:func:`simulate` with ``engine=inprocess``: the round engine in this process, every client a
    call into the ClientApp's handlers (``fedsuite.engine.round_engine.run_inprocess``); no simulation process,
    no Ray. ``on_progress`` is called after every recorded round. A Ctrl-C (KeyboardInterrupt)
    leaves the run partial, for ``--resume``; ``stall_timeout_s`` does not apply (nothing runs
    apart from this process to be stopped)."""
    from fedsuite.engine import round_engine as engine
    from fedsuite.records.rows import read_metrics

    _take_debris(cfg, run_dir)
    done = rundir.check_resumable(cfg, run_dir)
    if done == cfg.rounds and rundir.summary_status(run_dir) == ("finished:completed", ""):
        return RunOutcome(run_dir, "finished:completed", f"already complete after {done} rounds", ran=False)
    started = False
    try:
        if before_start is not None:
            before_start()
        (run_dir / "summary.json").unlink(missing_ok=True)
        (run_dir / "error.txt").unlink(missing_ok=True)
        started = True
        report = None if on_progress is None else (lambda: on_progress(read_metrics(run_dir, tolerant=True)))
        try:
            engine.run_inprocess(cfg, run_dir, on_round=report)
        except Exception:  # noqa: BLE001 - recorded in summary.json and error.txt; the outcome says it
            pass
        recorded = rundir.summary_status(run_dir)
        status, details = recorded if recorded is not None else (
            "finished:failed", "the run ended before it recorded an outcome")
        return RunOutcome(run_dir, status, details)
    finally:
        if not started and created is not None:
            shutil.rmtree(created, ignore_errors=True)


def _simulate(cfg: BaseRunConfig, run_dir: Path, created: Path | None,
              on_progress: Callable[[list[dict[str, Any]]], None] | None,
              before_start: Callable[[], None] | None,
              process: subprocess.Popen | None) -> RunOutcome:
    """:func:`simulate` in a run directory this process holds (``hold.claimed``)."""
    progress = None if on_progress is None else (lambda _run_dir, rows: on_progress(rows))
    return _simulate_runs([(cfg, run_dir)], [created] if created is not None else [], progress, before_start,
                          process)[0]


#: what a batch's runs must share (:func:`simulate_batch`): what Flower's engine and its Ray are built from
BATCH_SHARED = ("engine", "num_clients", "num_cpus", "num_gpus", "ray_address")


def simulate_batch(runs: list[tuple[BaseRunConfig, Path]],
                   on_progress: Callable[[Path, list[dict[str, Any]]], None] | None = None) -> list[RunOutcome]:
    """Several runs one after another in one Flower simulation: one simulation process, one Ray and
    one pool of ClientApp actors for all of them. Those are what a short run spends most of its CPU
    on (about 11 of a 2-round run's 13 CPU-seconds on 2 cores, ``benchmarks/README.md``); the
    rounds themselves are the same messages through the same engine as :func:`simulate`'s, and give
    the same numbers bit for bit.

    The runs must share :data:`BATCH_SHARED` (``LaunchError`` otherwise, before anything is
    written). Each keeps its own folder, app, records and checkpoint, and resumes alone
    (``fedsuite simulate --resume``); a run complete already is left as it is. The batch's Flower
    log is the first run's ``flower.log`` (the others' say so). A run that fails is recorded as
    failed and the next one starts; a stop or a kill leaves the unfinished runs partial.
    ``on_progress(run_dir, rows)`` is called as each run's rows land. Returns the outcomes in the
    order of ``runs``."""
    if not runs:
        return []
    first = runs[0][0]
    for cfg, run_dir in runs:
        differ = [key for key in BATCH_SHARED if getattr(cfg, key) != getattr(first, key)]
        if differ:
            raise LaunchError(f"a batch's runs must share {', '.join(BATCH_SHARED)}; {run_dir} differs from "
                              f"{runs[0][1]} in {', '.join(differ)}")
    if first.engine != "flower":
        raise LaunchError(f"a batch runs on Flower's engine; engine is {first.engine!r}")
    resolved = [(cfg, run_dir.resolve()) for cfg, run_dir in runs]
    if len({run_dir for _, run_dir in resolved}) < len(resolved):
        raise LaunchError("a batch names one run folder twice")
    created = [folder for cfg, run_dir in resolved if (folder := _make_run_dir(run_dir, cfg)) is not None]
    with ExitStack() as held:
        for _, run_dir in resolved:
            held.enter_context(hold.claimed(run_dir))
        return _simulate_runs(resolved, created, on_progress, None, None)


def _simulate_runs(runs: list[tuple[BaseRunConfig, Path]], created: list[Path],
                   on_progress: Callable[[Path, list[dict[str, Any]]], None] | None,
                   before_start: Callable[[], None] | None,
                   process: subprocess.Popen | None) -> list[RunOutcome]:
    """Runs in folders this process holds, in one simulation process (one run: its own app; more:
    a batch app naming them all, ``runtime.BATCH_KEY``). ``created``: folders this call's caller
    made, removed if nothing started."""
    from fedsuite.config import to_run_config
    from fedsuite.engine.runtime import BATCH_KEY, RUN_DIR_KEY

    outcomes: dict[Path, RunOutcome] = {}
    todo: list[tuple[BaseRunConfig, Path]] = []
    for cfg, run_dir in runs:
        _take_debris(cfg, run_dir)  # a run killed before it recorded anything: nothing to keep
        done = rundir.check_resumable(cfg, run_dir)  # before anything in an existing run directory is touched
        if done == cfg.rounds and rundir.summary_status(run_dir) == ("finished:completed", ""):
            # a finished run asked for the rounds it has: it stays as it was, byte for byte
            outcomes[run_dir] = RunOutcome(run_dir, "finished:completed", f"already complete after {done} rounds",
                                           ran=False)
        else:
            todo.append((cfg, run_dir))
    if not todo:
        return [outcomes[run_dir] for _, run_dir in runs]
    for cfg, run_dir in todo:
        write_app(run_dir / "app", cfg, run_dir)  # each run's own app: what --resume runs it from
    cfg, lead = todo[0]  # what the simulation is built from (shared), and the folder holding its marks and log
    batch_dir = None
    app_dir = lead / "app"
    if len(todo) > 1:
        batch_dir = Path(tempfile.mkdtemp(prefix="fedsuite-batch-"))
        app_dir = batch_dir / "app"
        runs_text = json.dumps([{**to_run_config(c), RUN_DIR_KEY: str(d)} for c, d in todo])
        write_app_config(app_dir, {BATCH_KEY: runs_text})
        for _, run_dir in todo[1:]:
            with (run_dir / "flower.log").open("a") as log:
                log.write(f"this start ran in a batch of {len(todo)} runs, whose Flower log is {lead / 'flower.log'}\n")
    flwr_home = lead / ".flwr"  # Flower's home for the run, and the mark of its processes
    flwr_home.mkdir(exist_ok=True)
    # a private Ray keeps its session in a short temporary directory of this run (Ray's socket paths
    # must fit 107 bytes), discarded at the end; its logs are kept in <run>/ray-logs unless completed
    reaper.remove_orphan_ray_tmpdirs()  # those of runs killed with their watcher
    ray_tmpdir = None if cfg.ray_address else reaper.make_ray_tmpdir(lead)
    # a run must not outlive this process: the simulation dies with it (PDEATHSIG) and a watcher in
    # its own session stops everything carrying our FLWR_HOME if this process is killed
    attempt = new_attempt()  # this start's mark: its watcher never stops a --resume begun after a kill
    watcher = reaper.start(flwr_home, lead / "reaper.log", remove=ray_tmpdir, attempt=attempt)
    proc = process if process is not None else start_simulation_process()
    started = False
    try:
        try:
            tell(proc, json.dumps({"app": str(app_dir), "log": str(lead / "flower.log"),
                                   "env": run_env(flwr_home, cfg.ray_address, ray_tmpdir, attempt)}))
            if before_start is not None:
                before_start()
            # a resumed run (one retried after it failed, too) writes its own outcome when it ends: the
            # last attempt's would be read as this one's (flower.log keeps every attempt's traceback)
            for _, run_dir in todo:
                (run_dir / "summary.json").unlink(missing_ok=True)
                (run_dir / "error.txt").unlink(missing_ok=True)
            tell(proc, "start")
            proc.stdin.close()
            started = True
            for run_cfg, run_dir in todo:  # one after another, as the ServerApp runs them
                progress = None if on_progress is None else functools.partial(on_progress, run_dir)
                watch(run_dir, lambda: proc.poll() is None, progress, run_cfg.stall_timeout_s)
                outcomes[run_dir] = RunOutcome(run_dir, *simulation_status(proc, run_dir))
            # the runs have ended and their results are on disk: the simulation process gets no teardown
            # (Ray's shutdown takes seconds, and Ray's SIGTERM handler writes a stack dump to the log);
            # what it started is collected first, while its children are still its children
            started_by_it = process_tree(proc, ("FLWR_HOME", str(flwr_home)))
            proc.kill()
            terminate_all(started_by_it, timeout=STOP_GRACE_S)
            return [outcomes[run_dir] for _, run_dir in runs]
        finally:
            stop_tree(proc, ("FLWR_HOME", str(flwr_home)), timeout=STOP_GRACE_S)
            if not started:  # stopped mid-start: Ray's raylet may have started its agents meanwhile
                reaper.sweep("FLWR_HOME", str(flwr_home), settle=0.5)
            if not proc.stdin.closed:
                proc.stdin.close()
    finally:
        reaper.stop(watcher)
        if batch_dir is not None:
            shutil.rmtree(batch_dir, ignore_errors=True)
        if ray_tmpdir is not None:
            if started:
                reaper.discard_ray_tmpdir(ray_tmpdir, lead)
            else:  # called off before it began: Ray's logs explain nothing the caller does not know
                shutil.rmtree(ray_tmpdir, ignore_errors=True)
        if not started:
            for folder in created:
                shutil.rmtree(folder, ignore_errors=True)


def tell(proc: subprocess.Popen, line: str) -> None:
    """One line to a simulation process waiting on its stdin; a process that has already ended is
    not an error here (its exit code and log say how it ended)."""
    try:
        proc.stdin.write(line.encode() + b"\n")
        proc.stdin.flush()
    except BrokenPipeError:
        pass


def simulation_status(proc: subprocess.Popen, run_dir: Path) -> tuple[str, str]:
    """A simulation's outcome: ``summary.json``'s, else (the process ended before the ServerApp
    wrote it: an engine or start-up error) failed, with the process's exit code."""
    recorded = rundir.summary_status(run_dir)
    if recorded is not None:
        return recorded
    code = proc.wait()
    return "finished:failed", (f"the simulation process exited with code {code} before the ServerApp "
                               f"recorded an outcome; see {run_dir / 'flower.log'}")
