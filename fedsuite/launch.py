"""Drive Flower's supported path for one run: a private SuperLink plus ``flwr run``.

``fedsuite simulate`` does, per run (see ../shared/notes/flower-1.41-note.md §2, §5):

1. writes a thin Flower app (a ``pyproject.toml`` whose ``[tool.flwr.app.config]`` is the resolved
   config) into ``<run>/app``; the components are the installed ``fedsuite`` apps;
2. starts ``flower-superlink --simulation`` in its own process group, with ``FLWR_HOME`` in the run
   directory, a free loopback port, runtime dependency installation disabled and telemetry off;
3. submits with ``flwr run <app> fedsuite --federation-config ...`` (Ray CPU/GPU shares per
   client from the config), follows ``flwr log --stream`` into ``<run>/flower.log`` and draws a
   progress bar from ``metrics.jsonl``;
4. reads the run's final status with ``flwr list`` (``flwr run``'s exit code hides a failed
   ServerApp), and stops every process it started, by process group.
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
from typing import Any, Callable, Iterator, Sequence

import psutil
import tomli_w

from fedsuite import reaper
from fedsuite.config import BaseRunConfig, to_run_config
from fedsuite.results import read_metrics
from fedsuite.runtime import RUN_DIR_KEY

CONNECTION = "fedsuite"

#: SIGTERM-to-SIGKILL grace when a run's processes are stopped. Everything a run produces is on disk
#: before its processes are stopped (checkpoint and rows written atomically, summary.json last), so
#: nothing is lost by not waiting for Flower's own teardown (flwr-simulation shutting Ray down took
#: 4.5 s of every run's wall time on 2 cores).
STOP_GRACE_S = 1.0


class LaunchError(RuntimeError):
    """The run could not be started or did not finish well."""


@dataclass
class RunOutcome:
    run_dir: Path
    status: str  # "finished:completed" | "finished:failed" | ...
    details: str

    @property
    def ok(self) -> bool:
        return self.status == "finished:completed"


def flower_env(flwr_home: Path, ray_address: str | None = None, ray_tmpdir: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # Flower's simulation process calls ray.init(), which joins the cluster named by RAY_ADDRESS:
    # set exactly when the run asks for one (fedsuite.raycluster), never inherited from the shell
    env.pop("RAY_ADDRESS", None)
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    # a private Ray keeps its session (sockets, logs) under RAY_TMPDIR/ray instead of the shared
    # /tmp/ray: removed with the run's processes, and a plain ray.init() elsewhere never finds it
    env.pop("RAY_TMPDIR", None)
    if ray_tmpdir is not None:
        env["RAY_TMPDIR"] = str(ray_tmpdir)
    env.update({
        "FLWR_HOME": str(flwr_home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        "RAY_DEDUP_LOGS": "0",
        "RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES": str(2 * 1024**3),
        "PYTHONUNBUFFERED": "1",
        # numpy's OpenBLAS single-threaded in Flower's processes: flwr-simulation runs the ServerApp
        # thread while Ray forks its daemons, and OpenBLAS's at-fork handler can then leave a
        # threaded BLAS call in another thread spinning forever (issue 16, item 1)
        "OPENBLAS_NUM_THREADS": "1",
    })
    # deterministic cuBLAS (torch.use_deterministic_algorithms needs it on CUDA); no effect on CPU
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # Flower starts flower-superexec / flwr-simulation by name: put this environment's scripts first
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
    private ``FLWR_HOME``: SuperExec, which Flower detaches into a new session, and Ray daemons
    re-parented to init)."""
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
def private_superlink(run_dir: Path, simulation: bool = True,
                      ray_address: str | None = None) -> Iterator[tuple[dict[str, str], str]]:
    """Start a SuperLink owned by this process; yield (env for flwr commands, connection name).

    Without ``ray_address`` the simulation starts a private Ray whose session directory lives in a
    short temporary directory of this run (Ray's socket paths must fit 107 bytes), discarded at the
    end; Ray's logs of a run that did not complete are kept in ``<run>/ray-logs``."""
    flwr_home = run_dir / ".flwr"
    port = free_port()
    address = f"127.0.0.1:{port}"
    write_connection(flwr_home, address)
    ray_tmpdir = Path(tempfile.mkdtemp(prefix="fsray-")) if simulation and not ray_address else None
    env = flower_env(flwr_home, ray_address, ray_tmpdir)
    log_path = run_dir / "superlink.log"
    cmd = [bin_path("flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port),
           "--disable-runtime-dependency-installation", "--database", str(flwr_home / "state.db")]
    if simulation:
        cmd.append("--simulation")
    # a run must not outlive this process: the SuperLink dies with it (PDEATHSIG) and a watcher in
    # its own session stops everything carrying our FLWR_HOME if this process is killed
    watcher = reaper.start(flwr_home, run_dir / "reaper.log", remove=ray_tmpdir)
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
        if ray_tmpdir is not None:
            reaper.discard_ray_tmpdir(ray_tmpdir, run_dir)


def submit(app_dir: Path, env: dict[str, str], connection: str, federation_config: str | None,
           wrap: Sequence[str] = ()) -> int:
    """``flwr run``; ``wrap`` prefixes every ``flwr`` command (e.g. ``ip netns exec NS``)."""
    cmd = [*wrap, bin_path("flwr"), "run", str(app_dir), connection, "--format", "json"]
    if federation_config:
        cmd += ["--federation-config", federation_config]
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


def follow(run_id: int, env: dict[str, str], connection: str, run_dir: Path,
           on_progress: Callable[[list[dict[str, Any]]], None] | None = None,
           stall_timeout_s: float = 0.0, wrap: Sequence[str] = ()) -> None:
    """Stream the run's logs into flower.log and report metrics as they land, until the run ends.

    The run has ended when the ServerApp has written ``summary.json`` (it does so last, also on
    failure) or when Flower's log stream closes. Flower's own teardown (Ray shutdown, ~3-5 s) is
    not waited for: the caller stops the whole process tree.

    Watchdog: progress is a new line in ``metrics.jsonl`` (round 0 = start-up done, then one per
    round); with ``stall_timeout_s > 0``, that long without progress raises :class:`StallError`.
    """
    summary = run_dir / "summary.json"
    with (run_dir / "flower.log").open("ab") as log_file:
        proc = subprocess.Popen([*wrap, bin_path("flwr"), "log", str(run_id), connection, "--stream"], env=env,
                                stdout=log_file, stderr=subprocess.STDOUT, cwd=run_dir, start_new_session=True,
                                preexec_fn=reaper.die_with_parent())
    seen = -1
    last_progress = time.monotonic()
    try:
        while proc.poll() is None and not summary.exists():
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
        if summary.exists():
            time.sleep(0.5)  # let the last log lines reach flower.log
    finally:
        stop_tree(proc, timeout=STOP_GRACE_S)
    if on_progress is not None:
        on_progress(read_metrics(run_dir, tolerant=True))


def federation_config(cfg: BaseRunConfig, num_supernodes: int | None = None) -> str:
    n = num_supernodes or cfg.num_clients
    return (f"num-supernodes={n} client-resources-num-cpus={cfg.num_cpus} "
            f"client-resources-num-gpus={float(cfg.num_gpus)} init-args-logging-level='ERROR' "
            f"init-args-log-to-driver=false")


def simulate(cfg: BaseRunConfig, run_dir: Path,
             on_progress: Callable[[list[dict[str, Any]]], None] | None = None,
             superlink: tuple[dict[str, str], str] | None = None) -> RunOutcome:
    """Run ``cfg`` on Flower's Simulation Engine; results land in ``run_dir``.

    ``superlink``: the ``(env, connection)`` of a simulation SuperLink that is already running
    (:func:`private_superlink`, entered once for many runs; its Ray cluster must be ``cfg``'s) to
    submit to, one run at a time, instead of starting one for this run: that saves a SuperLink and a
    SuperExec start per run (~4 s of CPU, ~2 s of wall time). The run's own Flower process
    (flwr-simulation) is stopped when the run has ended, as it is with a private SuperLink."""
    if superlink is not None and superlink[0].get("RAY_ADDRESS") != cfg.ray_address:
        raise LaunchError(f"the SuperLink's runs use the Ray cluster {superlink[0].get('RAY_ADDRESS')!r}, "
                          f"this run asks for {cfg.ray_address!r}")
    run_dir = run_dir.resolve()
    check_resumable(cfg, run_dir)  # before anything in an existing run directory is touched
    run_dir.mkdir(parents=True, exist_ok=True)
    app_dir = run_dir / "app"
    write_app(app_dir, cfg, run_dir)
    (run_dir / "summary.json").unlink(missing_ok=True)  # a resumed run rewrites it when it ends
    if superlink is not None:
        env, connection = superlink
        try:
            return _submit_and_follow(cfg, run_dir, app_dir, env, connection, on_progress)
        finally:
            reaper.terminate_all(simulation_processes(env["FLWR_HOME"]), STOP_GRACE_S)
    with private_superlink(run_dir, ray_address=cfg.ray_address) as (env, connection):
        return _submit_and_follow(cfg, run_dir, app_dir, env, connection, on_progress)


def _submit_and_follow(cfg: BaseRunConfig, run_dir: Path, app_dir: Path, env: dict[str, str], connection: str,
                       on_progress: Callable[[list[dict[str, Any]]], None] | None) -> RunOutcome:
    run_id = submit(app_dir, env, connection, federation_config(cfg))
    (run_dir / "flower-run-id").write_text(f"{run_id}\n")
    follow(run_id, env, connection, run_dir, on_progress, cfg.stall_timeout_s)
    status, details = final_status(run_id, env, connection, run_dir)
    return RunOutcome(run_dir, status, details)


def simulation_processes(flwr_home: str) -> list[psutil.Process]:
    """The flwr-simulation processes (a run's ServerApp and Simulation Engine) started by the
    SuperLink whose ``FLWR_HOME`` is ``flwr_home``."""
    found = []
    for p in psutil.process_iter():
        try:
            if any(a.endswith("flwr-simulation") for a in p.cmdline()[:2]) and p.environ().get("FLWR_HOME") == flwr_home:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def check_resumable(cfg: BaseRunConfig, run_dir: Path) -> None:
    """A run directory that already holds a run is continued only with a config its record allows
    (``fedsuite.config.check_resume``); raises ``ConfigError`` otherwise, having written nothing."""
    record = run_dir / "config.json"
    if not record.is_file():
        return
    import torch

    from fedsuite.config import check_resume

    ckpt = run_dir / "checkpoint.pt"
    done = int(torch.load(ckpt, weights_only=False)["round"]) if ckpt.is_file() else 0
    check_resume(json.loads(record.read_text()), cfg, done)


def final_status(run_id: int, env: dict[str, str], connection: str, run_dir: Path,
                 wrap: Sequence[str] = ()) -> tuple[str, str]:
    """The run's outcome: the ServerApp's own ``summary.json`` status when it wrote one (it writes it
    after its last round, so Flower's teardown need not be waited for), else Flower's status."""
    summary = run_dir / "summary.json"
    if summary.exists():
        ours = json.loads(summary.read_text())
        if ours.get("status") == "completed":
            return "finished:completed", ""
        if ours.get("status") == "failed" and "failure" in ours:  # stopped on failed client replies
            return "finished:failed", ours["failure"]["message"]
    deadline = time.monotonic() + 60
    while True:
        status, details = run_status(run_id, env, connection, run_dir, wrap)
        if status.startswith("finished") or time.monotonic() > deadline:
            return status, details
        time.sleep(0.5)
