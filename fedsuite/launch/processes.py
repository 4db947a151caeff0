"""The processes fedsuite starts: their environment, and how they are found and stopped.

* environment: :func:`fedsuite_first` (this fedsuite first on ``PYTHONPATH``, once: every process
  fedsuite starts imports the same code, and a run started by a run does not grow the path),
  :func:`process_env` (a run's Flower processes, before the run is named), :func:`run_env` (what
  ties a process to one run: its ``FLWR_HOME``, the mark), :func:`flower_env` (both);
  :func:`bin_path` (a console script of this environment);
* finding: :func:`marked` (the one scan of the process table: processes whose environment carries a
  mark), :func:`process_tree` (a process, its descendants and the marked);
* stopping: :func:`terminate_all` (SIGTERM, then SIGKILL), :func:`stop_tree`.

The simulation launcher (``fedsuite.launch.start``), the SuperLink helpers (``fedsuite.deploy.superlink``), the
parent-death watcher (``fedsuite.launch.reaper``) and the queues (``fedsuite.queues.reproduce``, sweeps, searches)
start, find and stop processes only through this module. It imports only the standard library and
psutil, so the watcher starts fast and small.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

#: the folder holding this fedsuite (a checkout, or site-packages for an installed one)
ROOT = str(Path(__file__).resolve().parents[2])  # fedsuite/launch/processes.py

#: SIGTERM-to-SIGKILL grace when a run's processes are stopped. Everything a run produces is on disk
#: before its processes are stopped (checkpoint and rows written atomically, summary.json last), so
#: nothing is lost by not waiting for Flower's own teardown (shutting Ray down took 4.5 s of every
#: run's wall time on 2 cores).
STOP_GRACE_S = 1.0

#: ``CUBLAS_WORKSPACE_CONFIG`` for deterministic cuBLAS, which ``torch.use_deterministic_algorithms``
#: needs on CUDA (a run's processes get it; no effect on a CPU)
DETERMINISTIC_CUBLAS_WORKSPACE = ":4096:8"


def available_cores() -> int:
    """The CPU cores this process may run on: its affinity mask (a container's cpuset, ``taskset``'s,
    or the share a queue gave its run, :func:`core_slices`)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def core_slices(jobs: int, cores: Sequence[int] | None = None) -> list[frozenset[int]] | None:
    """The cores each of ``jobs`` runs at once is pinned to (``fedsuite reproduce``/``sweep --jobs``):
    ``cores`` (default: this process's affinity) cut into ``jobs`` disjoint slices whose sizes differ
    by at most one; with more runs than cores, one core each, in turn. So a run's clients and its
    server's evaluation (``engine.evaluation_threads``: every core the run may use) stay on its
    own share instead of spinning on the others' (measured on 2 cores with two runs: a central
    evaluation took 5.2 s on two threads, 2.6 s on one). None for one job, or where affinity
    cannot be set (not Linux): nothing is pinned."""
    if jobs < 2 or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0) if cores is None else cores)
    n = len(cores)
    if jobs >= n:
        return [frozenset({cores[k % n]}) for k in range(jobs)]
    return [frozenset(cores[k * n // jobs:(k + 1) * n // jobs]) for k in range(jobs)]


def fedsuite_first(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with this fedsuite first on ``PYTHONPATH``, so that a subprocess imports this
    very fedsuite (a checkout or an installed package). Nothing is added when it is first already.
    ``PYTHONSAFEPATH`` keeps ``python -m`` from putting the working directory before it: a subprocess
    started in another checkout's folder would import that checkout's fedsuite (a claims queue run
    from a frozen worktree, started in the main checkout, ran the main checkout's code that way)."""
    out = dict(env)
    out["PYTHONSAFEPATH"] = "1"
    parts = out["PYTHONPATH"].split(os.pathsep) if out.get("PYTHONPATH") else []
    if parts[:1] != [ROOT]:
        out["PYTHONPATH"] = os.pathsep.join([ROOT, *parts])
    return out


def flower_env(flwr_home: Path, ray_address: str | None = None, ray_tmpdir: Path | None = None) -> dict[str, str]:
    """The environment of a run's Flower processes: :func:`process_env` and :func:`run_env`."""
    return {**process_env(), **run_env(flwr_home, ray_address, ray_tmpdir)}


#: the environment variable that marks the processes of one start of a run (:func:`new_attempt`):
#: a killed start's watcher stops those, never the processes of a ``--resume`` begun meanwhile,
#: which share the run's ``FLWR_HOME``
ATTEMPT_ENV = "FEDSUITE_ATTEMPT"


def new_attempt() -> str:
    """A mark for one start of a run, unique on this machine (the starting process and the time)."""
    return f"{os.getpid()}-{time.time_ns()}"


def run_env(flwr_home: Path, ray_address: str | None = None, ray_tmpdir: Path | None = None,
            attempt: str | None = None) -> dict[str, str]:
    """What ties a process to one run: ``FLWR_HOME`` (Flower's home for the run, and the mark by which
    the run's processes are found and stopped), the Ray cluster it joins, its private Ray's folder,
    and the start of the run it belongs to (:data:`ATTEMPT_ENV`)."""
    env = {"FLWR_HOME": str(flwr_home)}
    if attempt is not None:
        env[ATTEMPT_ENV] = attempt
    # Flower's simulation process calls ray.init(), which joins the cluster named by RAY_ADDRESS:
    # set exactly when the run asks for one (fedsuite.launch.raycluster), never inherited from the shell
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    # a private Ray keeps its session (sockets, logs) under RAY_TMPDIR/ray instead of the shared
    # /tmp/ray: removed with the run's processes, and a plain ray.init() elsewhere never finds it
    if ray_tmpdir is not None:
        env["RAY_TMPDIR"] = str(ray_tmpdir)
    return env


def process_env() -> dict[str, str]:
    """This process's environment as a run's Flower processes need it, before any run is named."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR", "FLWR_HOME")}
    env.update({
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        "RAY_DEDUP_LOGS": "0",
        "RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES": str(2 * 1024**3),
        "PYTHONUNBUFFERED": "1",
        # numpy's OpenBLAS single-threaded in Flower's processes: the simulation process runs the
        # ServerApp thread while Ray forks its daemons, and OpenBLAS's at-fork handler can then leave a
        # threaded BLAS call in another thread spinning forever
        "OPENBLAS_NUM_THREADS": "1",
    })
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", DETERMINISTIC_CUBLAS_WORKSPACE)
    # Flower's processes start others by name (flower-superexec, flwr-serverapp; Ray its workers):
    # put this environment's scripts first
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return fedsuite_first(env)


def bin_path(name: str) -> str:
    """A console script of the running interpreter's environment (works without an activated venv)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else (shutil.which(name) or name)


def marked(key: str, value: str, exclude: tuple[int, ...] = (),
           simulation_in: str | None = None) -> list[psutil.Process]:
    """Processes whose environment has ``key=value`` (a run's private ``FLWR_HOME``, a private Ray's
    ``RAY_TMPDIR``), or, with ``simulation_in``, a run's simulation process (``python -m
    fedsuite.launch.simulation``) working in that folder (its ``FLWR_HOME`` was set after it started, so
    its environment does not show it); except the PIDs in ``exclude``."""
    out = []
    for p in psutil.process_iter():
        if p.pid in exclude:
            continue
        try:
            if p.environ().get(key) == value or (simulation_in is not None and p.cwd() == simulation_in
                                                 and "fedsuite.launch.simulation" in p.cmdline()):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def with_descendants(procs: list[psutil.Process]) -> list[psutil.Process]:
    """``procs`` and all their descendants, each once. A marked process's children need not carry
    the mark where /proc shows it: Ray renames its agents (``ray::DashboardAgent``,
    ``ray::RuntimeEnvAgent``) by writing over the memory that holds their environment, so only their
    parent, the raylet, still shows a run's ``FLWR_HOME``."""
    out: dict[int, psutil.Process] = {}
    for p in procs:
        out[p.pid] = p
        try:
            out.update({c.pid: c for c in p.children(recursive=True)})
        except psutil.NoSuchProcess:
            continue
    return list(out.values())


def process_tree(proc: subprocess.Popen, marker_env: tuple[str, str] | None = None) -> list[psutil.Process]:
    """``proc``, its descendants and any process whose environment carries ``marker_env`` (our
    private ``FLWR_HOME``: Ray daemons re-parented to init, and a SuperLink's SuperExec, which Flower
    detaches into a new session), with theirs (:func:`with_descendants`)."""
    procs: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(proc.pid)
        procs[root.pid] = root
    except psutil.NoSuchProcess:
        pass
    if marker_env is not None:
        procs.update({p.pid: p for p in marked(*marker_env, exclude=tuple(procs))})
    return with_descendants(list(procs.values()))


def terminate_all(procs: list[psutil.Process], timeout: float) -> None:
    """SIGTERM every process of ``procs`` at once, then SIGKILL those still alive after ``timeout``
    seconds, and wait (5 s at most) for them to go."""
    for sig_fn in ("terminate", "kill"):
        for p in procs:
            try:
                getattr(p, sig_fn)()
            except psutil.NoSuchProcess:
                pass
        _, procs = psutil.wait_procs(procs, timeout=timeout if sig_fn == "terminate" else 5.0)
        if not procs:
            return


def stop_tree(proc: subprocess.Popen, marker_env: tuple[str, str] | None = None, timeout: float = 10.0) -> None:
    """Stop ``proc`` and everything it started (:func:`process_tree`, collected before anything is
    killed): SIGTERM, then SIGKILL for what is still alive after ``timeout``."""
    terminate_all(process_tree(proc, marker_env), timeout)
    proc.poll()
