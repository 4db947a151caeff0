"""Taking a run directory: making it with its config, clearing a start-up's debris, holding it.

:func:`create_run_dir` makes a run's folder with its ``config.json`` in one step (no kill leaves a
run folder without its config); :func:`start_debris` and :func:`clear_start_debris` deal with what
a fedsuite that made the folder before its config left, and :func:`record_config` records the
config in such a folder. :func:`claimed` holds the folder for the one process that runs or
continues its run (an ``flock`` the kernel drops when the process ends), after the processes of an
earlier, killed attempt (:func:`remnants`) have ended; :func:`held_elsewhere` says whether another
holds it now.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from fedsuite.errors import RunDirError
from fedsuite.launch.processes import marked


def create_run_dir(run_dir: Path, config: dict[str, Any]) -> bool:
    """Create the folder ``run_dir`` holding its ``config.json`` (``config``) in one step, so that
    no kill can leave a run folder without its config: the folder is made beside it under a hidden
    name (``.fedsuite-new-<random>``), the config written into it, and the folder renamed into
    place (a kill before the rename leaves only that hidden folder, which no reader takes for a
    run). Returns False, having written nothing, if ``run_dir`` exists already (its missing
    parents are made)."""
    if os.path.lexists(run_dir):
        return False
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = run_dir.parent / f".fedsuite-new-{os.urandom(6).hex()}"
    tmp.mkdir()
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if os.path.lexists(run_dir):
            raise FileExistsError(run_dir)
        os.rename(tmp, run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.lexists(run_dir):
            return False
        raise
    return True


def record_config(run_dir: Path, config: dict[str, Any]) -> None:
    """Put ``config.json`` into the existing ``run_dir`` if it has none: a folder a start-up left
    before its config existed (:func:`start_debris`, cleared first by the caller), or one made
    by hand; written atomically (whole, or not at all)."""
    if os.path.lexists(run_dir / "config.json"):
        return
    tmp = run_dir / f".config.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, run_dir / "config.json")


#: what a fedsuite before run identities wrote into a run directory before the ServerApp recorded the
#: run's ``config.json`` (a start-up window of about 2-3.5 s on 2 cores); the folder is now created
#: with its config (:func:`create_run_dir`), and such debris is cleared by a fresh start
START_FILES = frozenset({"app", ".flwr", "flower.log", "reaper.log", "ray-logs", "error.txt"})


def start_debris(run_dir: Path) -> bool:
    """Whether ``run_dir`` is what a run killed in its start-up window left: a folder without
    ``config.json`` that holds only :data:`START_FILES` (or nothing). Such a folder records no run,
    so a fresh start and ``--resume`` of the same name both start the run anew in it. A folder
    holding anything else is not ours to remove."""
    if not run_dir.is_dir() or (run_dir / "config.json").exists():
        return False
    return all(entry.name in START_FILES for entry in run_dir.iterdir())


def clear_start_debris(run_dir: Path) -> None:
    """Empty a start-up's debris (:func:`start_debris`) out of ``run_dir``, which the caller holds
    (:func:`claimed`: no run is starting in it now)."""
    for entry in run_dir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


#: how long a start waits for the processes of an earlier, killed attempt of its run to end (the
#: dead launcher's watcher and PDEATHSIG stop them; a Ray agent may outlive its raylet by seconds)
REMNANT_WAIT_S = 20.0


@contextmanager
def claimed(run_dir: Path, wait_s: float = REMNANT_WAIT_S, exclude: tuple[int, ...] = ()) -> Iterator[None]:
    """Hold the existing folder ``run_dir`` for this process while it runs or continues the run in
    it: an exclusive ``flock`` on the folder itself, which the kernel drops when the process ends,
    also on SIGKILL (no file is added to the folder; child processes do not inherit it). A second
    fedsuite process on the same run (``--resume`` while the run goes on, two queues of one target)
    is refused with :class:`RunDirError` before anything in the folder is touched. Processes of an
    earlier attempt whose launcher was killed (:func:`remnants`) are waited for, up to ``wait_s``
    seconds, then refused the same way; ``exclude``: this attempt's own processes (its simulation
    process, started before the run was named, works wherever the CLI does)."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if not _lock_now(fd):
            raise RunDirError(f"{run_dir} is in use by another fedsuite process (its run is going on); "
                              "wait for it or stop it first")
        deadline = time.monotonic() + wait_s
        while left := remnants(run_dir, exclude):
            if time.monotonic() >= deadline:
                raise RunDirError(f"processes of an earlier attempt of {run_dir} are still running "
                                  f"({describe(left[0])}); stop them first")
            time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def held_elsewhere(run_dir: Path) -> bool:
    """Whether ``run_dir`` is held (:func:`claimed`) at this moment, by another process or by another
    claim of this one: a run of it is going on there (a second queue of the same target, a
    ``--resume`` in another terminal)."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # no folder (yet): nobody holds it
        return False
    try:
        return not _lock_now(fd)
    finally:
        os.close(fd)  # closing drops a lock this call took


def _lock_now(fd: int) -> bool:
    """Take the exclusive ``flock`` of the folder open as ``fd`` if no one holds it; whether it did."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def remnants(run_dir: Path, exclude: tuple[int, ...] = ()) -> list[psutil.Process]:
    """Live processes of an earlier attempt of the run in ``run_dir``: its private Ray's (they carry
    its ``FLWR_HOME``) and its simulation process; this process and ``exclude`` left out."""
    return marked("FLWR_HOME", str(run_dir / ".flwr"), exclude=(os.getpid(), *exclude), simulation_in=str(run_dir))


def describe(proc: psutil.Process) -> str:
    """``process PID: its command line``, as far as it can still be read."""
    try:
        return f"process {proc.pid}: {' '.join(proc.cmdline())[:120]}"
    except psutil.Error:
        return f"process {proc.pid}"
