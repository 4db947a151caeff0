"""A run must not outlive its CLI: the parent-death half of ``fedsuite simulate``'s process hygiene.

``fedsuite simulate`` starts the run's simulation process (``fedsuite.launch.simulation``) in a session of
its own, and it starts Ray, whose daemons detach further (a test's deployment SuperLink likewise).
Killing only the CLI's process group (Ctrl-C in some shells, a job scheduler's kill) would leave
them running. Two mechanisms:

* :func:`die_with_parent` (a ``preexec_fn``): the processes the CLI starts itself get
  ``PR_SET_PDEATHSIG`` (Linux), so the kernel signals them when the CLI dies;
* :func:`start` launches this module as a small watcher in its own session (so a process-group
  kill does not reach it). It polls the CLI's PID, and every 2 s notes the run's processes (those
  whose environment carries the run's private ``FLWR_HOME``, and their descendants: Ray's renamed
  agents show no mark of their own); once the CLI is gone it stops the noted ones still running,
  then every process that carries the mark (the simulation process, Ray's daemons and workers; a
  SuperLink and its children), discards the private Ray's temporary directory
  (:func:`discard_ray_tmpdir`), then exits. After a normal run the CLI stops it.

A third, for a ServerApp in Flower's own ``flwr-simulation`` process (``flwr run`` of a Flower app of
one's own, ``fedsuite.engine.server_app.watch_flower_simulation``): :func:`watch_descendants` stops what
that process started (Ray's daemons, agents, ClientApp actors) once it is gone.

The processes are found and stopped through ``fedsuite.launch.processes`` (:func:`sweep` repeats its scan
until Ray has stopped starting workers), a run's outcome read through ``fedsuite.records.rundir``. This
module imports only the standard library, psutil and those two (whose own heavy imports wait inside
functions), so the watcher starts fast and small.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from fedsuite.launch.processes import ATTEMPT_ENV, STOP_GRACE_S, fedsuite_first, marked, terminate_all, with_descendants
from fedsuite.records.rundir import summary_status

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM):
    """A ``preexec_fn`` that makes the child receive ``sig`` when the process that started it dies
    (Linux; a no-op elsewhere). Call it in the parent: it captures the parent's PID."""
    parent = os.getpid()

    def preexec() -> None:
        if sys.platform.startswith("linux"):
            try:
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
            except (OSError, AttributeError):
                pass
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)

    return preexec


def sweep(key: str, value: str, exclude: tuple[int, ...] = (), settle: float = 2.0, limit: float = 60.0) -> int:
    """Stop every process marked ``key=value`` (SIGTERM, then SIGKILL after 5 s), repeating until no
    new one has appeared for ``settle`` seconds (Ray may still be starting workers). Returns how many."""
    stopped: set[int] = set()
    quiet_since = time.monotonic()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        procs = [p for p in with_descendants(marked(key, value, exclude)) if p.pid not in exclude]
        if not procs:
            if time.monotonic() - quiet_since >= settle:
                break
            time.sleep(0.2)
            continue
        terminate_all(procs, timeout=5.0)
        stopped.update(p.pid for p in procs)
        quiet_since = time.monotonic()
    return len(stopped)


def discard_ray_tmpdir(ray_tmpdir: Path, run_dir: Path) -> bool:
    """Remove a run's private Ray directory (``RAY_TMPDIR``, see ``fedsuite.launch.start``). Unless the run
    completed (``summary.json`` says so), Ray's session logs are first copied to ``<run>/ray-logs``:
    a client process that died without a Python traceback (killed for memory, a crash in native
    code) is explained only there.

    The directory is first claimed by an atomic rename (:data:`DISCARDING_PREFIX`), so that of the
    processes that may discard one directory at once (a killed run's watcher, and any other run's
    :func:`remove_orphan_ray_tmpdirs`) exactly one copies and removes it; the others return False.
    A log copy that fails part-way is reported on stderr and does not stop the removal."""
    claimed = Path(ray_tmpdir).with_name(f"{DISCARDING_PREFIX}{os.getpid()}-{Path(ray_tmpdir).name}")
    try:
        os.rename(ray_tmpdir, claimed)
    except FileNotFoundError:
        return False
    completed = summary_status(run_dir) == ("finished:completed", "")
    # Ray's session_latest is a symbolic link to the session's absolute path, which the rename moved
    latest = claimed / "ray" / "session_latest"
    session = claimed / "ray" / Path(os.readlink(latest)).name if latest.is_symlink() else latest
    logs = session / "logs"
    if not completed and logs.is_dir():
        try:
            shutil.copytree(logs, run_dir / "ray-logs", dirs_exist_ok=True, ignore_dangling_symlinks=True)
        except OSError as exc:  # shutil.Error included: the run's folder gone, a disk full
            print(f"fedsuite: Ray's logs of {run_dir} were not all kept: {exc}", file=sys.stderr, flush=True)
    shutil.rmtree(claimed, ignore_errors=True)
    return True


#: the prefix of a run's private Ray directory in the temporary folder (``RAY_TMPDIR``)
RAY_TMPDIR_PREFIX = "fsray-"
#: the file in it naming the process that made it, and the run it belongs to
OWNER_FILE = "owner.json"
#: the prefix a directory being discarded is renamed to: ``fsgone-<pid of the discarding process>-fsray-...``
DISCARDING_PREFIX = "fsgone-"


def make_ray_tmpdir(run_dir: Path) -> Path:
    """A private Ray directory for ``run_dir``, owned by this process (:data:`OWNER_FILE`), so that
    :func:`remove_orphan_ray_tmpdirs` can tell when nobody will discard it any more."""
    path = Path(tempfile.mkdtemp(prefix=RAY_TMPDIR_PREFIX))
    me = psutil.Process()
    (path / OWNER_FILE).write_text(json.dumps({"pid": me.pid, "create_time": me.create_time(),
                                               "run_dir": str(run_dir)}))
    return path


def remove_orphan_ray_tmpdirs() -> list[Path]:
    """Discard (:func:`discard_ray_tmpdir`) the private Ray directories whose owner is gone and that
    no live process uses: a run whose whole process tree, its watcher included, was killed with
    SIGKILL leaves one behind (about 190 KB). Every run calls this as it starts. A directory
    without an owner file (another program's, or being made) is left alone, and so is one that
    another process claims first. The remains of a discard whose process died part-way
    (``fsgone-<pid>-...``, that pid gone) are removed too. Returns the directories removed."""
    tmp = Path(tempfile.gettempdir())
    removed = []
    for path in tmp.glob(RAY_TMPDIR_PREFIX + "*"):
        try:
            owner = json.loads((path / OWNER_FILE).read_text())
            pid, create_time, run_dir = int(owner["pid"]), float(owner["create_time"]), Path(owner["run_dir"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(pid, create_time) or marked("RAY_TMPDIR", str(path)):
            continue
        if run_dir.is_dir():  # an unfinished run keeps Ray's logs, as when its watcher discards them
            if discard_ray_tmpdir(path, run_dir):
                removed.append(path)
        else:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    for path in tmp.glob(DISCARDING_PREFIX + "*"):
        claimant = path.name[len(DISCARDING_PREFIX):].split("-", 1)[0]
        if claimant.isdigit() and not psutil.pid_exists(int(claimant)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def start(flwr_home: Path, log_path: Path | None = None, remove: Path | None = None,
          attempt: str | None = None) -> subprocess.Popen:
    """Start the watcher for this process (the CLI) and the run whose ``FLWR_HOME`` is ``flwr_home``
    (``<run>/.flwr``); ``remove``: the run's private Ray directory, discarded after the sweep
    (:func:`discard_ray_tmpdir`). With ``attempt`` (``processes.new_attempt``, set in the run's
    processes as ``processes.ATTEMPT_ENV``) it stops the processes of that start of the run only,
    so a ``--resume`` begun while it sweeps is left alone; without, every process of the run."""
    me = psutil.Process()
    env = fedsuite_first({k: v for k, v in os.environ.items() if k not in ("FLWR_HOME", ATTEMPT_ENV)})
    marker = (ATTEMPT_ENV, attempt) if attempt is not None else ("FLWR_HOME", str(flwr_home))
    out = log_path.open("ab") if log_path is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "fedsuite.launch.reaper", str(me.pid), repr(me.create_time()), str(flwr_home),
             *marker, *([str(remove)] if remove is not None else [])],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    finally:
        if log_path is not None:
            out.close()


def stop(watcher: subprocess.Popen | None) -> None:
    """Stop the watcher after a run that ended normally (its processes are already stopped)."""
    if watcher is None or watcher.poll() is not None:
        return
    watcher.terminate()
    try:
        watcher.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        watcher.kill()
        watcher.wait()


def _alive(pid: int, create_time: float) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and abs(p.create_time() - create_time) < 1e-3
    except psutil.NoSuchProcess:
        return False


#: the watcher's polls (every 0.5 s) between two looks at the run's processes (:func:`remember`)
REMEMBER_EVERY = 4


def remember(seen: dict[int, float], key: str, value: str, exclude: tuple[int, ...]) -> None:
    """Add the processes marked ``key=value`` and their descendants to ``seen`` (PID -> start time)."""
    for p in with_descendants(marked(key, value, exclude)):
        try:
            seen[p.pid] = p.create_time()
        except psutil.NoSuchProcess:
            continue


def terminate_seen(seen: dict[int, float], grace: float = 5.0) -> list[int]:
    """Stop the processes of ``seen`` that still run (the same PID and start time: never a process
    that reused a PID; SIGKILL after ``grace`` seconds); returns their PIDs."""
    alive = []
    for pid, started in seen.items():
        if _alive(pid, started):
            try:
                alive.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
    terminate_all(alive, timeout=grace)
    return [p.pid for p in alive]


def watch_descendants() -> subprocess.Popen:
    """Start a watcher of this process's descendants (``python -m fedsuite.launch.reaper --descendants``, in
    its own session): every 0.5 s it notes them, and once this process is gone it stops those still
    running (the same PID and start time), then exits. For a ServerApp in Flower's own
    ``flwr-simulation``: its Ray (started by Flower, not by fedsuite) loses its raylet and GCS with
    that process when ``flwr stop`` ends it, and Ray's agents, children of the raylet, then linger
    for a minute or more, reporting to a GCS that is gone."""
    me = psutil.Process()
    env = fedsuite_first({k: v for k, v in os.environ.items() if k != ATTEMPT_ENV})
    return subprocess.Popen([sys.executable, "-m", "fedsuite.launch.reaper", "--descendants", str(me.pid), repr(me.create_time())],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def descendants_main(pid: int, create_time: float) -> int:
    """:func:`watch_descendants`' watcher: note ``pid``'s descendants while it lives, then stop them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    seen: dict[int, float] = {}
    while _alive(pid, create_time):
        try:
            for p in psutil.Process(pid).children(recursive=True):
                if p.pid != os.getpid():
                    seen[p.pid] = p.create_time()
        except psutil.NoSuchProcess:
            break
        time.sleep(0.5)
    # Ray's agents ignore SIGTERM once their raylet is gone, and nothing of the run is left to save
    stopped = terminate_seen(seen, grace=STOP_GRACE_S)
    print(f"fedsuite reaper: process {pid} is gone; stopped {len(stopped)} of its descendants", flush=True)
    return 0


def main(argv: list[str]) -> int:
    """``python -m fedsuite.launch.reaper PID CREATE_TIME FLWR_HOME MARK_KEY MARK_VALUE [RAY_TMPDIR]``, or
    ``python -m fedsuite.launch.reaper --descendants PID CREATE_TIME`` (:func:`watch_descendants`)."""
    if argv[:1] == ["--descendants"]:
        return descendants_main(int(argv[1]), float(argv[2]))
    pid, create_time, flwr_home, key, value = int(argv[0]), float(argv[1]), argv[2], argv[3], argv[4]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the CLI finished normally
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    seen: dict[int, float] = {}  # the run's processes so far: PID -> start time
    polls = 0
    while _alive(pid, create_time):
        if polls % REMEMBER_EVERY == 0:
            remember(seen, key, value, exclude=(os.getpid(),))
        polls += 1
        time.sleep(0.5)
    # first the processes seen while the CLI lived: Ray's renamed agents show no mark, and once
    # their raylet has gone (it may die with the simulation process before the sweep below looks)
    # they are nobody's descendants either
    n = len(terminate_seen(seen))
    n += sweep(key, value, exclude=(os.getpid(),))
    if len(argv) > 5:
        discard_ray_tmpdir(Path(argv[5]), Path(flwr_home).parent)
    print(f"fedsuite reaper: CLI {pid} is gone; stopped {n} processes of {flwr_home} ({key}={value})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
