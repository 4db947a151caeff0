"""Start and watch a run's processes: a simulation (``fedsuite simulate``) or a submission to a
SuperLink (the Deployment Engine).

A simulation, per run:

1. a simulation process is started in its own session, before the run is named
   (:func:`start_simulation_process`: the CLI does so at its first line, and the process imports
   torch, Flower's engine and the apps meanwhile);
2. writes a thin Flower app (a ``pyproject.toml`` whose ``[tool.flwr.app.config]`` is the resolved
   config) into ``<run>/app``; the components are the installed ``fedsuite`` apps;
3. names the run to the process on its stdin (:func:`simulate`): the app, the log
   ``<run>/flower.log`` and the run's environment, whose ``FLWR_HOME=<run>/.flwr`` every process it
   starts then carries (the reaper's mark, ``fedsuite.reaper``; the simulation process itself dies
   with the launcher, PDEATHSIG); it starts Ray (a private Ray in a
   temporary directory of the run, or ``cfg.ray_address``'s cluster) while the caller checks the
   data, then gets ``start``: Flower's Simulation Engine with the ServerApp and the Ray-backed
   ClientApps (``fedsuite.simulation``);
4. draws progress from ``metrics.jsonl`` (with a stall watchdog) until ``summary.json`` appears or
   the process ends; the outcome is ``summary.json``'s status, else the process's exit code;
5. stops every process of the run, by that mark.

On the Deployment Engine the ServerApp runs under a SuperLink: :func:`private_superlink` (a
loopback SuperLink for tests), :func:`submit` (``flwr run``), :func:`follow` (``flwr log``) and
:func:`final_status` (``flwr list``: ``flwr run``'s exit code hides a failed ServerApp).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import psutil
import tomli_w

from fedsuite import reaper, rundir

if TYPE_CHECKING:
    from fedsuite.config import BaseRunConfig

# This module imports torch, pydantic and the registry only where a function needs them (via
# fedsuite.config): the CLI imports it first, to start a simulation process before its own imports
# (start_simulation_process).

CONNECTION = "fedsuite"

#: SIGTERM-to-SIGKILL grace when a run's processes are stopped. Everything a run produces is on disk
#: before its processes are stopped (checkpoint and rows written atomically, summary.json last), so
#: nothing is lost by not waiting for Flower's own teardown (shutting Ray down took 4.5 s of every
#: run's wall time on 2 cores).
STOP_GRACE_S = 1.0


class LaunchError(RuntimeError):
    """The run could not be started or did not finish well."""


@dataclass
class RunOutcome:
    run_dir: Path
    status: str  # "finished:completed" | "finished:failed" | ...
    details: str
    ran: bool = True  # False: the run was complete already and nothing was started or written

    @property
    def ok(self) -> bool:
        return self.status == "finished:completed"


def flower_env(flwr_home: Path, ray_address: str | None = None, ray_tmpdir: Path | None = None) -> dict[str, str]:
    """The environment of a run's Flower processes: :func:`process_env` and :func:`run_env`."""
    return {**process_env(), **run_env(flwr_home, ray_address, ray_tmpdir)}


def run_env(flwr_home: Path, ray_address: str | None = None, ray_tmpdir: Path | None = None) -> dict[str, str]:
    """What ties a process to one run: ``FLWR_HOME`` (Flower's home for the run, and the mark by which
    the run's processes are found and stopped), the Ray cluster it joins, its private Ray's folder."""
    env = {"FLWR_HOME": str(flwr_home)}
    # Flower's simulation process calls ray.init(), which joins the cluster named by RAY_ADDRESS:
    # set exactly when the run asks for one (fedsuite.raycluster), never inherited from the shell
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
        # threaded BLAS call in another thread spinning forever (issue 16, item 1)
        "OPENBLAS_NUM_THREADS": "1",
    })
    # deterministic cuBLAS (torch.use_deterministic_algorithms needs it on CUDA); no effect on CPU
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # Flower's processes start others by name (flower-superexec, flwr-serverapp; Ray its workers):
    # put this environment's scripts first
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # the subprocesses must import this very fedsuite (a checkout or an installed package)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bin_path(name: str) -> str:
    """A console script of the running interpreter's environment (works without an activated venv)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else (shutil.which(name) or name)


def write_app(app_dir: Path, cfg: BaseRunConfig, run_dir: Path) -> None:
    """A Flower app directory holding only a pyproject.toml that points at the fedsuite apps."""
    from fedsuite.config import to_run_config
    from fedsuite.runtime import RUN_DIR_KEY

    app_dir.mkdir(parents=True, exist_ok=True)
    flat = {**to_run_config(cfg), RUN_DIR_KEY: str(run_dir)}
    lines = [
        "[build-system]", 'requires = ["hatchling"]', 'build-backend = "hatchling.build"', "",
        "[project]", 'name = "fedsuite-run"', 'version = "1.0.0"', "dependencies = []", "",
        "[tool.flwr.app]", 'publisher = "fedsuite"', "",
        "[tool.flwr.app.components]", 'serverapp = "fedsuite.server_app:app"', 'clientapp = "fedsuite.client_app:app"', "",
        "[tool.flwr.app.config]",
    ]
    body = tomli_w.dumps({k: flat[k] for k in sorted(flat)})
    (app_dir / "pyproject.toml").write_text("\n".join(lines) + "\n" + body)


def write_connection(flwr_home: Path, address: str, root_certificates: Path | None = None,
                     name: str = CONNECTION) -> None:
    """``$FLWR_HOME/config.toml`` with one connection: plain HTTP (``insecure``, loopback only), or TLS
    verified against ``root_certificates`` (the federation's CA, ``fedsuite certs``)."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    security = ("insecure = true\n" if root_certificates is None else
                f'root-certificates = "{Path(root_certificates).resolve()}"\n')
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{address}"\n{security}'
    )


def process_tree(proc: subprocess.Popen, marker_env: tuple[str, str] | None = None) -> list[psutil.Process]:
    """``proc``, its descendants and any process whose environment carries ``marker_env`` (our
    private ``FLWR_HOME``: Ray daemons re-parented to init, and a SuperLink's SuperExec, which Flower
    detaches into a new session)."""
    procs: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(proc.pid)
        procs[root.pid] = root
        procs.update({p.pid: p for p in root.children(recursive=True)})
    except psutil.NoSuchProcess:
        pass
    if marker_env is not None:
        key, value = marker_env
        for p in psutil.process_iter():
            try:
                if p.pid not in procs and p.environ().get(key) == value:
                    procs[p.pid] = p
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
    return list(procs.values())


def stop_tree(proc: subprocess.Popen, marker_env: tuple[str, str] | None = None, timeout: float = 10.0) -> None:
    """Stop ``proc`` and everything it started (:func:`process_tree`, collected before anything is
    killed): SIGTERM, then SIGKILL for what is still alive after ``timeout``."""
    reaper.terminate_all(process_tree(proc, marker_env), timeout)
    proc.poll()


def wait_for_port(port: int, proc: subprocess.Popen, log_path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LaunchError(f"flower-superlink exited early (code {proc.returncode}); see {log_path}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise LaunchError(f"flower-superlink did not open 127.0.0.1:{port} within {timeout:.0f}s; see {log_path}")


@contextmanager
def private_superlink(run_dir: Path) -> Iterator[tuple[dict[str, str], str]]:
    """Start a Deployment-Engine SuperLink owned by this process on a free loopback port; yield (env
    for ``flwr`` commands, connection name). It is stopped, with everything carrying its
    ``FLWR_HOME``, on exit, and by the reaper if this process dies."""
    flwr_home = run_dir / ".flwr"
    port = free_port()
    address = f"127.0.0.1:{port}"
    write_connection(flwr_home, address)
    env = flower_env(flwr_home)
    log_path = run_dir / "superlink.log"
    cmd = [bin_path("flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port),
           "--disable-runtime-dependency-installation", "--database", str(flwr_home / "state.db")]
    watcher = reaper.start(flwr_home, run_dir / "reaper.log")
    try:
        with log_path.open("ab") as log_file:
            proc = subprocess.Popen(cmd, cwd=run_dir, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=reaper.die_with_parent())
        try:
            wait_for_port(port, proc, log_path)
            yield env, CONNECTION
        finally:
            stop_tree(proc, ("FLWR_HOME", str(flwr_home)), timeout=STOP_GRACE_S)
    finally:
        reaper.stop(watcher)


def submit(app_dir: Path, env: dict[str, str], connection: str, wrap: Sequence[str] = ()) -> int:
    """``flwr run`` to a SuperLink; ``wrap`` prefixes every ``flwr`` command (e.g. ``ip netns exec NS``)."""
    cmd = [*wrap, bin_path("flwr"), "run", str(app_dir), connection, "--format", "json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=app_dir)
    try:
        data = json.loads(out.stdout)
    except json.JSONDecodeError:
        raise LaunchError(f"flwr run failed (code {out.returncode}): {out.stdout.strip()} {out.stderr.strip()}") from None
    if not data.get("success", True) or "run-id" not in data:
        raise LaunchError(f"flwr run refused the run: {data.get('error-message', data)}")
    return int(data["run-id"])


def run_status(run_id: int, env: dict[str, str], connection: str, cwd: Path,
               wrap: Sequence[str] = ()) -> tuple[str, str]:
    out = subprocess.run([*wrap, bin_path("flwr"), "list", connection, "--run-id", str(run_id), "--format", "json"],
                         env=env, capture_output=True, text=True, cwd=cwd)
    try:
        run = json.loads(out.stdout)["runs"][0]
    except (json.JSONDecodeError, KeyError, IndexError):
        return "unknown", out.stdout + out.stderr
    return str(run.get("status", "unknown")), str(run.get("status-details", ""))


class StallError(LaunchError):
    """The watchdog fired: no progress for ``stall_timeout_s`` seconds."""


def watch(run_dir: Path, running: Callable[[], bool],
          on_progress: Callable[[list[dict[str, Any]]], None] | None = None, stall_timeout_s: float = 0.0) -> None:
    """Report metrics as they land until the run has ended: ``summary.json`` exists (the ServerApp
    writes it last, also on failure) or ``running()`` turns false.

    Watchdog: progress is a new line in ``metrics.jsonl`` (round 0 = start-up done, then one per
    round); with ``stall_timeout_s > 0``, that long without progress raises :class:`StallError`
    (written to ``error.txt`` too)."""
    from fedsuite.results import read_metrics

    summary = run_dir / "summary.json"
    seen = -1
    last_progress = time.monotonic()
    while running() and not summary.exists():
        rows = read_metrics(run_dir, tolerant=True)
        if len(rows) != seen:
            seen, last_progress = len(rows), time.monotonic()
            if on_progress is not None:
                on_progress(rows)
        elif stall_timeout_s > 0 and time.monotonic() - last_progress > stall_timeout_s:
            done = [r["round"] for r in rows if r.get("round", 0) > 0]
            where = (f"after round {done[-1]}" if done else
                     "during start-up (no round-0 evaluation yet)" if not rows else "in round 1")
            message = (f"no progress for {stall_timeout_s:g} s (stall_timeout_s) {where}; the run was "
                       f"stopped. Logs: {run_dir / 'flower.log'}")
            err = run_dir / "error.txt"
            if not err.exists():
                err.write_text(f"StallError: {message}\n")
            raise StallError(message)
        time.sleep(0.25)
    if on_progress is not None:
        on_progress(read_metrics(run_dir, tolerant=True))


def follow(run_id: int, env: dict[str, str], connection: str, run_dir: Path,
           on_progress: Callable[[list[dict[str, Any]]], None] | None = None,
           stall_timeout_s: float = 0.0, wrap: Sequence[str] = ()) -> None:
    """Stream a SuperLink run's logs (``flwr log --stream``) into flower.log and :func:`watch` it
    until it ends. Flower's own teardown is not waited for: the caller stops the processes."""
    with (run_dir / "flower.log").open("ab") as log_file:
        proc = subprocess.Popen([*wrap, bin_path("flwr"), "log", str(run_id), connection, "--stream"], env=env,
                                stdout=log_file, stderr=subprocess.STDOUT, cwd=run_dir, start_new_session=True,
                                preexec_fn=reaper.die_with_parent())
    try:
        watch(run_dir, lambda: proc.poll() is None, on_progress, stall_timeout_s)
        if (run_dir / "summary.json").exists():
            time.sleep(0.5)  # let the last log lines reach flower.log
    finally:
        stop_tree(proc, timeout=STOP_GRACE_S)


def start_simulation_process() -> subprocess.Popen:
    """Start a run's simulation process before the run is named (``python -m fedsuite.simulation
    --await-start``): it imports torch, Flower's engine and the apps while the caller
    builds the config, then waits for :func:`simulate` to name the run. The CLI starts it at its
    first line, so those imports use the second core while its own imports use the first. It dies
    with the process that started it; its output goes to an unnamed temporary file (removed here at
    once: the process holds it open) until the run is named, and is then moved to the run's
    ``flower.log``."""
    fd, early_log = tempfile.mkstemp(prefix="fedsuite-simulation-", suffix=".log")
    try:
        return subprocess.Popen([sys.executable, "-m", "fedsuite.simulation", "--await-start"],
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
    """Run ``cfg`` on Flower's Simulation Engine (``fedsuite.simulation``); results land in
    ``run_dir``. The clients run on a private Ray, or on the cluster ``cfg.ray_address`` names.

    ``process``: a simulation process from :func:`start_simulation_process` (started at once if
    none). It is told the run (its app, log and environment: it starts Ray), then ``before_start``
    (the CLI's data check) runs while Ray starts, then it is told to begin: a first run's partition
    (about 2 s on 2 cores) no longer precedes Ray's start. If ``before_start`` raises, the process
    and its Ray are stopped, the folders this call created are removed, and the exception
    propagates: nothing is left behind."""
    run_dir = run_dir.resolve()
    if rundir.start_debris(run_dir):  # a run killed before it recorded anything: nothing to keep
        rundir.clear_start_debris(run_dir)
    done = rundir.check_resumable(cfg, run_dir)  # before anything in an existing run directory is touched
    if done == cfg.rounds and rundir.summary_status(run_dir) == ("finished:completed", ""):
        # a finished run asked for the rounds it has: it stays as it was, byte for byte
        return RunOutcome(run_dir, "finished:completed", f"already complete after {done} rounds", ran=False)
    created = run_dir
    while not created.parent.exists():  # the outermost folder this call creates, removed if called off
        created = created.parent
    created = None if created.exists() else created
    run_dir.mkdir(parents=True, exist_ok=True)
    app_dir = run_dir / "app"
    write_app(app_dir, cfg, run_dir)
    flwr_home = run_dir / ".flwr"  # Flower's home for the run, and the mark of its processes
    flwr_home.mkdir(exist_ok=True)
    # a private Ray keeps its session in a short temporary directory of this run (Ray's socket paths
    # must fit 107 bytes), discarded at the end; its logs are kept in <run>/ray-logs unless completed
    reaper.remove_orphan_ray_tmpdirs()  # those of runs killed with their watcher
    ray_tmpdir = None if cfg.ray_address else reaper.make_ray_tmpdir(run_dir)
    # a run must not outlive this process: the simulation dies with it (PDEATHSIG) and a watcher in
    # its own session stops everything carrying our FLWR_HOME if this process is killed
    watcher = reaper.start(flwr_home, run_dir / "reaper.log", remove=ray_tmpdir)
    proc = process if process is not None else start_simulation_process()
    started = False
    try:
        try:
            tell(proc, json.dumps({"app": str(app_dir), "log": str(run_dir / "flower.log"),
                                   "env": run_env(flwr_home, cfg.ray_address, ray_tmpdir)}))
            if before_start is not None:
                before_start()
            (run_dir / "summary.json").unlink(missing_ok=True)  # a resumed run rewrites it when it ends
            tell(proc, "start")
            proc.stdin.close()
            started = True
            watch(run_dir, lambda: proc.poll() is None, on_progress, cfg.stall_timeout_s)
            outcome = RunOutcome(run_dir, *simulation_status(proc, run_dir))
            # the run has ended and its results are on disk: the simulation process gets no teardown
            # (Ray's shutdown takes seconds, and Ray's SIGTERM handler writes a stack dump to the log)
            proc.kill()
            return outcome
        finally:
            stop_tree(proc, ("FLWR_HOME", str(flwr_home)), timeout=STOP_GRACE_S)
            if not started:  # stopped mid-start: Ray's raylet may have started its agents meanwhile
                reaper.sweep("FLWR_HOME", str(flwr_home), settle=0.5)
            if not proc.stdin.closed:
                proc.stdin.close()
    finally:
        reaper.stop(watcher)
        if ray_tmpdir is not None:
            if started:
                reaper.discard_ray_tmpdir(ray_tmpdir, run_dir)
            else:  # called off before it began: Ray's logs explain nothing the caller does not know
                shutil.rmtree(ray_tmpdir, ignore_errors=True)
        if not started and created is not None:
            shutil.rmtree(created, ignore_errors=True)


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


def final_status(run_id: int, env: dict[str, str], connection: str, run_dir: Path,
                 wrap: Sequence[str] = ()) -> tuple[str, str]:
    """A SuperLink run's outcome: the ServerApp's own ``summary.json`` status when it wrote one (it
    writes it after its last round, so Flower's teardown need not be waited for), else Flower's."""
    recorded = rundir.summary_status(run_dir)
    if recorded is not None:
        return recorded
    deadline = time.monotonic() + 60
    while True:
        status, details = run_status(run_id, env, connection, run_dir, wrap)
        if status.startswith("finished") or time.monotonic() > deadline:
            return status, details
        time.sleep(0.5)
