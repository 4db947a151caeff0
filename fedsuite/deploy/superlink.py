"""A run on Flower's Deployment Engine: a SuperLink, ``flwr run``, ``flwr log``, ``flwr list``.

The ServerApp runs under a SuperLink and the ClientApps on SuperNodes; ``fedsuite simulate`` does not
use any of this (``fedsuite.launch.start``). The tests (``tests/test_deployment.py``,
``tests/test_multihost.py``) and the containers (``docker/``) share these helpers:

* :func:`write_connection`: the ``flwr`` CLI's connection in ``$FLWR_HOME/config.toml`` (plain HTTP
  on loopback, or TLS verified against the federation's CA);
* :func:`private_superlink`: a loopback SuperLink owned by this process (tests);
* :func:`submit` (``flwr run``), :func:`follow` (``flwr log --stream`` into ``flower.log``, watched as
  a simulation is), :func:`final_status` (the ServerApp's ``summary.json``, else ``flwr list``:
  ``flwr run``'s exit code hides a failed ServerApp), :func:`wait_finished`.

As commands of the CLI, for people and for the containers' scripts (``docker/entrypoint.sh``,
``docker/superlink.sh``, ``docker/submit.sh``), which then carry no copy of this logic::

    fedsuite connection FLWR_HOME ADDRESS [--root-certificates CA] [--name NAME]
    fedsuite submit APP_DIR CONNECTION [--run-config CONFIG]

``submit`` (:func:`submit_and_follow`) submits the app, streams its log to stdout, waits for Flower's final status and exits 0
only if the run finished:completed (1 otherwise); its lines start with ``submit:``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from fedsuite.launch import reaper
from fedsuite.records import rundir
from fedsuite.launch.watch import LaunchError, watch
from fedsuite.launch.processes import STOP_GRACE_S, bin_path, flower_env, stop_tree

#: the connection name fedsuite writes into ``$FLWR_HOME/config.toml``
CONNECTION = "fedsuite"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def _json_from(text: str) -> Any:
    """The JSON document in a ``flwr ... --format json`` output (anything printed before it skipped)."""
    return json.loads(text[text.index("{"):])


def submit(app_dir: Path, env: dict[str, str], connection: str, wrap: Sequence[str] = (),
           run_config: str | None = None) -> int:
    """``flwr run`` to a SuperLink (``run_config``: its ``--run-config``); the run's id.
    ``wrap`` prefixes every ``flwr`` command (e.g. ``ip netns exec NS``)."""
    cmd = [*wrap, bin_path("flwr"), "run", str(app_dir), connection,
           *(["--run-config", run_config] if run_config is not None else []), "--format", "json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=app_dir)
    try:
        data = _json_from(out.stdout)
    except ValueError:  # no JSON at all, or not valid
        raise LaunchError(f"flwr run failed (code {out.returncode}): {out.stdout.strip()} {out.stderr.strip()}") from None
    if not data.get("success", True) or "run-id" not in data:
        raise LaunchError(f"flwr run refused the run: {data.get('error-message', data)}")
    return int(data["run-id"])


def run_status(run_id: int, env: dict[str, str], connection: str, cwd: Path,
               wrap: Sequence[str] = ()) -> tuple[str, str]:
    """Flower's (status, details) of a SuperLink run (``flwr list``); ``unknown`` if it cannot tell."""
    out = subprocess.run([*wrap, bin_path("flwr"), "list", connection, "--run-id", str(run_id), "--format", "json"],
                         env=env, capture_output=True, text=True, cwd=cwd)
    try:
        run = _json_from(out.stdout)["runs"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return "unknown", out.stdout + out.stderr
    return str(run.get("status", "unknown")), str(run.get("status-details", ""))


def wait_finished(run_id: int, env: dict[str, str], connection: str, cwd: Path, wrap: Sequence[str] = (),
                  timeout: float = 60.0, poll: float = 0.5) -> tuple[str, str]:
    """:func:`run_status` once Flower says ``finished:...``, or as it stands after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        status, details = run_status(run_id, env, connection, cwd, wrap)
        if status.startswith("finished") or time.monotonic() > deadline:
            return status, details
        time.sleep(poll)


def follow(run_id: int, env: dict[str, str], connection: str, run_dir: Path,
           on_progress: Callable[[list[dict[str, Any]]], None] | None = None,
           stall_timeout_s: float = 0.0, wrap: Sequence[str] = ()) -> None:
    """Stream a SuperLink run's logs (``flwr log --stream``) into flower.log and watch it
    (``fedsuite.launch.watch.watch``) until it ends. Flower's own teardown is not waited for: the caller stops the
    processes."""
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


def final_status(run_id: int, env: dict[str, str], connection: str, run_dir: Path,
                 wrap: Sequence[str] = ()) -> tuple[str, str]:
    """A SuperLink run's outcome: the ServerApp's own ``summary.json`` status when it wrote one (it
    writes it after its last round, so Flower's teardown need not be waited for), else Flower's."""
    recorded = rundir.summary_status(run_dir)
    if recorded is not None:
        return recorded
    return wait_finished(run_id, env, connection, run_dir, wrap)


def submit_and_follow(app_dir: Path, connection: str, run_config: str) -> int:
    """``docker/submit.sh``: submit, stream the log to stdout, exit code 0 only if Flower reports the
    run finished:completed. The ServerApp runs on the SuperLink's machine, so there is no run
    directory here to watch: Flower's status is the outcome."""
    env, cwd = dict(os.environ), Path.cwd()
    try:
        run_id = submit(app_dir, env, connection, run_config=run_config)
    except LaunchError as exc:  # "flwr run refused the run: ..." or "flwr run failed (code N): ..."
        print(f"submit: error: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"submit: run {run_id} submitted; following its log", flush=True)
    subprocess.run([bin_path("flwr"), "log", str(run_id), connection, "--stream"], env=env)
    status, _ = wait_finished(run_id, env, connection, cwd, timeout=120.0, poll=2.0)
    print(f"submit: run {run_id}: {status}", flush=True)
    return 0 if status == "finished:completed" else 1
