"""The simulation process of one run: Flower's Simulation Engine and the ServerApp, in one process.

``fedsuite simulate`` starts it (``fedsuite.launch.start``) for a run whose thin Flower app
(``launch.write_app``) it names on stdin; ``python -m fedsuite.launch.simulation APP_DIR`` runs such an
app folder directly. It does what Flower's own
``flwr-simulation`` does once the SuperLink has handed it a run: it reads the app's config, then
calls Flower's Simulation Engine (``flwr.simulation.run_simulation._run_simulation``, the function
``flwr-simulation`` calls), which starts the ServerApp in a thread and the ClientApps as Ray actors
(a private Ray, or the cluster named by ``RAY_ADDRESS``). Same engine, same apps, same contexts
(``context.run_config`` is the app's config, ``context.node_config`` holds ``partition-id``).

What it leaves out is the control plane a simulation does not need: a SuperLink, SuperExec,
``flwr run``, ``flwr log`` and ``flwr list`` (five processes and about 5 s of start-up on 2 cores,
``benchmarks/README.md``). The run's outcome is the ServerApp's ``summary.json`` and this process's
exit code (0 completed; 1 the ServerApp or the engine raised, traceback in ``error.txt`` and on
stderr, or it was stopped by SIGTERM: no ``summary.json`` then, the run stays partial; 3 called
off before it began); its log is its stdout, which the launcher writes to
``<run>/flower.log``: Flower's lines and fedsuite's (:func:`log_to_output`: the start, each round,
a resume, warnings and failures).

The launcher starts it as ``python -m fedsuite.launch.simulation --await-start`` before the run
is named (``launch.start_simulation_process``: the CLI does so at its first line, so the imports
here use the second core while the CLI imports and builds the config), then names the run on
stdin, checks its data while Ray starts, and sends ``start`` (:func:`run`); without those lines the
process ends with code 3 and nothing has run.

The Deployment Engine (real SuperNodes) keeps Flower's SuperLink path: ``flwr run`` against it.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Flower's run id for a simulation that no SuperLink registered (any positive 64-bit value works;
#: node ids are drawn at random per run by the engine)
RUN_ID = 1


#: ``ray.init`` arguments: Ray quiet (errors only, client prints not forwarded), no dashboard
RAY_INIT_ARGS = {"logging_level": "ERROR", "log_to_driver": False, "include_dashboard": False}


def backend_config(cfg) -> dict:
    """Flower's Ray backend settings for ``cfg``: one ClientApp actor per ``num_cpus`` cores (and
    ``num_gpus`` GPU share)."""
    return {
        "client_resources": {"num_cpus": int(cfg.num_cpus), "num_gpus": float(cfg.num_gpus)},
        "init_args": dict(RAY_INIT_ARGS),
    }


def start_ray() -> None:
    """Start a private Ray (or join the cluster ``RAY_ADDRESS`` names) as Flower's ``RayBackend``
    would, with the same arguments; the backend then finds Ray initialised and uses it. Called
    first, so Ray's start (about 2.5 s on 2 cores, most of it waiting for its daemons) overlaps this
    process's imports instead of following them.

    As ``RayBackend.init_ray``, the actors get this driver's import path (the fedsuite on
    ``PYTHONPATH``). A private Ray's raylet is this process's child and its workers inherit
    ``os.environ``, so no job ``runtime_env`` is needed: with one, Ray leaves the workers it
    prestarts for the job idle and starts new ones for the actors (0.6 s later, and 0.3 CPU-s
    each wasted on 2 cores). A cluster's workers on other machines get the path by ``runtime_env``.

    A private Ray starts without the daemons a simulation never uses (:func:`lean_private_ray`), and
    with the cores this process may use (``processes.available_cores``: its affinity), where Ray
    would count every core of the machine: under ``taskset``, a cpuset or a queue's share
    (``processes.core_slices``) it would start more client actors than there are cores for them."""
    import ray

    from fedsuite.launch.processes import available_cores

    pythonpath = os.pathsep.join([*sys.path, *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ["PYTHONPATH"] = pythonpath
    joins_cluster = bool(os.environ.get("RAY_ADDRESS"))
    runtime_env = {"runtime_env": {"env_vars": {"PYTHONPATH": pythonpath}}} if joins_cluster else {}
    if not joins_cluster:
        lean_private_ray()
    ray.init(**runtime_env, **RAY_INIT_ARGS, **({} if joins_cluster else {"num_cpus": available_cores()}))


def lean_private_ray() -> None:
    """Make this process's private Ray start without the three Python daemons a simulation never
    uses; ``ray.init`` offers no switch for them (``ray start --head`` has ``--no-monitor``).

    * The API server. With ``include_dashboard=False`` Ray still starts its dashboard process as
      an "API server" that loads only the usage-statistics module (ray-project/ray#26042), and
      ``ray.init`` waits until that process has published its address: 0.5-1.4 s of every start on
      2 cores, and 0.6 CPU-s. Its only clients are job submission, the state API and usage
      statistics. Ray treats the skipped step as an API server that failed to start, which it
      tolerates when the dashboard was not asked for.
    * The autoscaler monitor (``monitor.py``, 0.4 CPU-s): it scales a cluster by its autoscaling
      config, and a private Ray has none (``RayParams.no_monitor``, what ``--no-monitor`` sets).
    * The log monitor (``log_monitor.py``, 0.4 CPU-s): it streams the workers' log files to the
      driver, and ``RAY_INIT_ARGS`` turn that off (``log_to_driver=False``); the files are still
      written in Ray's session folder (``RayParams.include_log_monitor``).

    Together about 1.4 CPU-s, all of it while the run starts (``benchmarks/README.md``).

    And the driver learns of its raylet as soon as it has registered: ``ray.init`` asks the GCS for
    the node through a call that sleeps a whole second whenever the raylet is not registered yet,
    and it never is at the first ask (it waits for its agents' ports), so every start lost 0-1 s
    (:func:`get_node_once_registered`). A cluster joined with ``RAY_ADDRESS`` is left as it was
    started."""
    from fedsuite.upstream import RayNode, ray_services

    RayNode.start_api_server = skip_api_server
    RayNode.start_monitor = skip_daemon
    RayNode.start_log_monitor = skip_daemon
    if not hasattr(ray_services.get_node, "__wrapped__"):
        ray_services.get_node = get_node_once_registered(ray_services.get_node)


def skip_api_server(node, *, include_dashboard, raise_on_failure) -> None:
    """``ray._private.node.Node.start_api_server`` for a simulation's private Ray: starts nothing."""


def skip_daemon(node) -> None:
    """``Node.start_monitor`` and ``Node.start_log_monitor`` for a simulation's private Ray: start nothing."""


def get_node_once_registered(get_node: Callable[[str, str], dict]) -> Callable[[str, str], dict]:
    """``ray._private.services.get_node`` (the node's record from the GCS, which ``ray.init`` asks
    for right after it started the raylet) that first waits, polling every 20 ms, until the GCS
    lists the node. Ray's own call (``GlobalStateAccessor::GetNode``) retries with a one-second
    sleep while the node is missing; at 2.5 s into a start the raylet registers about 0.7 s after
    the first ask, so ``ray.init`` idled up to a second (1.85 s -> 1.47 s alone on 2 cores)."""

    @functools.wraps(get_node)
    def once_registered(gcs_address: str, node_id: str) -> dict:
        from fedsuite.upstream import GcsClient

        gcs = GcsClient(address=gcs_address)
        deadline = time.monotonic() + 30  # Ray's own limit for a raylet to register (raylet_start_wait_time_s)
        while time.monotonic() < deadline and not any(
                node.hex() == node_id for node in gcs.get_all_node_info(timeout=5)):
            time.sleep(0.02)
        return get_node(gcs_address, node_id)  # at once now; past the deadline Ray's call reports it

    return once_registered


def use_light_actor() -> None:
    """Make Flower's Ray backend host the ClientApps in ``fedsuite.launch.ray_actor.ClientAppActor``, the same
    actor as Flower's without the import of ``flwr.simulation`` in every worker (about 1 CPU-s per
    actor, see that module). The backend looks the class up in its module when it builds the pool."""
    from fedsuite.launch.ray_actor import ClientAppActor
    from fedsuite.upstream import flower_ray_backend

    flower_ray_backend.ClientAppActor = ClientAppActor


def import_apps() -> None:
    """Import what the run needs (Flower's engine, the ServerApp, the ClientApp): in a thread, while
    the main thread starts Ray. An import that fails here fails again, loudly, where it is used."""
    try:
        from fedsuite.upstream import run_simulation_engine  # noqa: F401

        import fedsuite.engine.client_app  # noqa: F401
        import fedsuite.engine.server_app  # noqa: F401
    except Exception:  # re-raised by the same import in run()
        pass


def run(app_dir: Path | None) -> None:
    """Run the app in ``app_dir`` on Flower's Simulation Engine; returns when the ServerApp has ended,
    raises what the ServerApp or the engine raised.

    Started by the launcher (``app_dir`` None; ``launch.start_simulation_process``, which gives it
    an unnamed temporary file as its output until then), the process imports the apps at once, then
    reads the run from stdin: a JSON line naming the app folder, the run's log and its environment
    (``processes.run_env``); it moves its output to that log, starts Ray, and waits for a ``start``
    line (the launcher checks the data meanwhile). Without either line it ends before anything ran
    (:class:`CalledOff`)."""
    importer = threading.Thread(target=import_apps, name="import-apps", daemon=True)
    importer.start()
    named_later = app_dir is None
    if named_later:
        app_dir = take_run()
    log_to_output()
    start_ray()
    importer.join()
    note_stop_requests()
    if named_later and sys.stdin.readline().strip() != "start":
        raise CalledOff("the launcher called the run off before it began")

    from flwr.app import Context, RecordDict
    from flwr.common import EventType

    from fedsuite.engine.runtime import app_runs, split_run_config
    from fedsuite.upstream import (
        NOOP_FEDERATION_ID,
        SUPERLINK_NODE_ID,
        FlowerRun,
        TaskIdentity,
        get_fused_config_from_dir,
        run_simulation_engine,
    )

    use_light_actor()
    run_config = get_fused_config_from_dir(app_dir, {})
    server_app, client_app = app_components(app_dir)
    cfg, _ = split_run_config(app_runs(run_config)[0])  # a batch's runs share what the engine is built from
    flower_run = FlowerRun.create_empty(run_id=RUN_ID)
    flower_run.primary_task_id = 1
    flower_run.federation_id = NOOP_FEDERATION_ID
    # the identity the ServerApp's messages are sent under: the SuperLink's node, as in flwr-simulation
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, RUN_ID, SUPERLINK_NODE_ID
    context = Context(run_id=RUN_ID, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                      run_config=run_config)
    run_simulation_engine(
        num_supernodes=cfg.num_clients, exit_event=EventType.FLWR_SIMULATION_RUN_LEAVE,
        server_app_attr=server_app, client_app_attr=client_app,
        backend_config=backend_config(cfg), app_dir=str(app_dir), run=flower_run,
        server_app_context=context, is_app=True,
    )


#: the format of fedsuite's lines in the run's log (Flower's own lines keep theirs)
LOG_FORMAT = "%(levelname)-8s %(asctime)s fedsuite: %(message)s"


def log_to_output() -> None:
    """fedsuite's log (the ``fedsuite`` logger: the ServerApp's start, each round, a resume, the
    method's warnings, a failure) at INFO on this process's output, the run's ``flower.log``. Flower
    logs nothing at INFO in a healthy simulation, and the ``fedsuite`` logger had no handler (only
    Python's last resort for warnings): the log of a completed run was empty."""
    import logging

    logger = logging.getLogger("fedsuite")
    if not any(getattr(handler, "fedsuite_run_log", False) for handler in logger.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        handler.fedsuite_run_log = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


#: seconds an orderly stop may take before the process leaves at once (exit code 1, as a stop)
STOP_GRACE_S = 10.0


def note_stop_requests(grace_s: float = STOP_GRACE_S) -> None:
    """On SIGTERM (a stop, or the launcher's death: PDEATHSIG), set ``engine.stop_requested``
    first, then do what the handler before did (Ray's driver handler: ``sys.exit``, which tears the
    engine and its actors down). The ServerApp thread then sees its clients vanish; with the flag set
    it records no failure, and the run stays partial. Called in the main thread, after ``ray.init``
    (which installs its own handler).

    The orderly teardown talks to Ray; when the launcher died, its reaper may have stopped the private
    Ray's daemons first, and Ray's calls then wait on a GCS that is gone (a loaded CI machine showed a
    simulation process outliving its killed CLI that way). So a stop gets ``grace_s`` seconds, then
    the process leaves at once (``os._exit(1)``): nothing is lost, the checkpoint of the last finished
    round is already on disk (written atomically), as after a SIGKILL."""
    from fedsuite.engine.round_engine import stop_requested

    before = signal.getsignal(signal.SIGTERM)

    def leave_after_grace() -> None:
        time.sleep(grace_s)
        # no flush of sys.stdout/sys.stderr here: the signal may have interrupted the main thread
        # inside a write, holding the stream's lock, and a flush would wait for it forever (a
        # clean-clone run saw the process outlive its grace that way); the run's processes write
        # unbuffered (PYTHONUNBUFFERED), and what a forced exit drops a SIGKILL would drop too
        os._exit(1)

    def on_sigterm(signum: int, frame: Any) -> None:
        if not stop_requested.is_set():
            threading.Thread(target=leave_after_grace, name="stop-grace", daemon=True).start()
        stop_requested.set()
        if callable(before):
            before(signum, frame)
        else:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)


def app_components(app_dir: Path) -> tuple[str, str]:
    """The app's ServerApp and ClientApp (``[tool.flwr.app.components]`` of its ``pyproject.toml``,
    as ``flwr run`` reads them): fedsuite's own in a run's app folder (``launch.write_app``), or a
    user's ServerApp beside fedsuite's ClientApp (``fedsuite.engine.server_app.method_strategy``)."""
    from fedsuite.upstream import get_project_config

    components = get_project_config(app_dir)["tool"]["flwr"]["app"]["components"]
    return components["serverapp"], components["clientapp"]


class CalledOff(Exception):
    """The launcher ended the run before it began: nothing ran, nothing to report."""


def take_run() -> Path:
    """Read the run the launcher names (one JSON line on stdin: ``app``, ``log``, ``env``), take its
    environment (its ``FLWR_HOME`` marks the Ray processes started next as the run's), move this
    process's output to the run's log (what it wrote before, read back from its temporary file, first),
    and work in the run's folder; returns the app folder."""
    line = sys.stdin.readline()
    if not line.strip():
        raise CalledOff("the launcher ended before it named a run")
    run = json.loads(line)
    os.environ.update(run["env"])
    sys.stdout.flush()
    sys.stderr.flush()
    size = os.fstat(1).st_size
    earlier = os.pread(1, size, 0) if size else b""
    log = os.open(run["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(log, earlier)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    app_dir = Path(run["app"])
    os.chdir(app_dir.parent)
    return app_dir


def main(argv: list[str]) -> int:
    if argv == ["--await-start"]:  # started by the launcher, the run named later
        app_dir = None
    elif len(argv) == 1 and Path(argv[0]).is_dir():
        app_dir = Path(argv[0]).resolve()
    else:
        print("usage: python -m fedsuite.launch.simulation APP_DIR (a run's app folder, fedsuite.launch.start.write_app), "
              "or --await-start (fedsuite.launch.start.start_simulation_process)", file=sys.stderr)
        return 2
    try:
        run(app_dir)
    except CalledOff:
        return 3
    except BaseException:  # the ServerApp wrote error.txt and summary.json (failed) where it could
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        return 1
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # the run's results are on disk: leave without Ray's orderly shutdown (seconds on 2 cores); the
    # launcher stops the private Ray's daemons, and a shared cluster ends this driver's actors itself
    os._exit(code)
