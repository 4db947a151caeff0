"""Shared fixtures. ``simulate`` runs a REAL Flower simulation (Flower's Simulation Engine with the
ServerApp and Ray-backed virtual clients, in its own process) through ``fedsuite.launch.start`` and
returns its run directory's contents.

A simulation costs ~10 s of fixed start-up on 2 cores (~20 CPU-seconds), so results are cached per test session
by config: tests that compare the same runs (e.g. "X with its knob at 0 equals FedAvg") share them.
Use ``FAST`` settings unless a test needs more.
"""

from __future__ import annotations

import atexit
import compileall
import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedsuite.launch import start as launch
from fedsuite.launch import processes
from fedsuite.deploy import superlink
from fedsuite.config import build_config
from fedsuite.records.rows import read_metrics

# One intra-op torch thread in every test process, as the clients train (num_cpus = 1). The suite
# runs three xdist workers on CI's two cores; a worker with torch's default of one thread per core
# spins at every OpenMP barrier on cores the other workers hold: one local round of FedAvg in
# tests/test_fednlr.py took 13 s on two threads and 0.2 s on one with both cores busy. Simulations
# and CLI processes set their own threads (training: num_cpus; central evaluation: the run's cores).
torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    """Compile this project's sources to bytecode once, before any test runs (in the controller, not in
    each xdist worker). The suite starts some 600 processes, most of them Python (CLIs, simulation
    processes, Ray actors, SuperNodes' ClientApps) importing fedsuite and its methods; where
    ``PYTHONDONTWRITEBYTECODE`` is set (as on this project's machines) none of them writes a cache,
    so each compiled the packages again (measured: importing the CLI, ClientApp, simulation and
    engine modules and the registry's methods took 3.06 CPU-s from source, 2.80 from bytecode;
    ``benchmarks/README.md``). An installed package has its bytecode from pip; an editable
    install's source has none until something writes it."""
    if not hasattr(config, "workerinput"):
        root = Path(__file__).resolve().parents[1]
        for package in ("fedsuite", "strategies", "clients"):  # pyproject.toml's packages
            compileall.compile_dir(root / package, quiet=2)


#: small, quick defaults for simulation tests: the generated benchmark at 30 of its 100 devices
#: (4846 training samples, 15 local steps a client and round: the runs test records and maths, and
#: the default's 32058 samples made a run's training 6.6 times as long), 10 clients, 4 per round
FAST: dict[str, Any] = {
    "dataset": "synthetic",
    "dataset_options": {"num_devices": 30},
    "model": "mlp",
    "partitioner": "dirichlet",
    "alpha": 0.5,
    "num_clients": 10,
    "clients_per_round": 4,
    "rounds": 2,
    "local_epochs": 1,
    "batch_size": 32,
    "lr": 0.05,
    "seed": 7,
}



def fast(**values: Any) -> dict[str, Any]:
    """``FAST`` with ``values`` over it; a test that names another dataset (and no options of its
    own) drops FAST's options of the synthetic benchmark."""
    out = {**FAST, **values}
    if out["dataset"] != FAST["dataset"] and "dataset_options" not in values:
        del out["dataset_options"]
    return out


# Strategy unit tests hand-build replies for part of the cohort on purpose (partial participation,
# dropped slots); they test the update rule on what arrived, not the failure bound, which
# tests/test_failures.py and tests/test_core.py cover.
UNIT_ROUND: dict[str, Any] = {"max_failed_fraction": 1.0}


@dataclass
class SimResult:
    run_dir: Path
    rows: list[dict[str, Any]]  # metrics.jsonl
    summary: dict[str, Any]
    checkpoint: dict[str, Any]  # {"round", "arrays", "strategy"}

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        return self.checkpoint["arrays"]

    def metrics_without_time(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "wall_seconds"} for r in self.rows]


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


RAY = shutil.which("ray", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}") or "ray"


def ray_env(**extra: str) -> dict[str, str]:
    """This environment for a ``ray`` command: no inherited RAY_ADDRESS, no usage stats."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", **extra})
    return env


_WARM = None  # this test process's warm process for fedsuite commands (fedsuite.launch.warm), started on first use


def fedsuite_run(args: list[str], *, cwd: Path | str | None = None, env: dict[str, str] | None = None,
                 timeout: float | None = None) -> subprocess.CompletedProcess:
    """``python -m fedsuite.cli.main ARGS`` as ``subprocess.run(..., capture_output=True, text=True)``
    runs it: a process of its own with its exit code, standard output and standard error, forked
    from a warm process (``fedsuite.launch.warm``, the same that starts a queue's runs) that has imported
    torch, the methods and the CLI once for this test process, instead of 2.5 CPU-seconds of imports
    a command. For a command whose output or timing is the test's subject from a fresh interpreter
    (what a command imports, what it prints while importing), keep ``subprocess``."""
    with tempfile.TemporaryDirectory(prefix="fedsuite-cli-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc = fedsuite_start(args, out, stderr=err, env=env, cwd=cwd)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        return subprocess.CompletedProcess(args, code, out.read_text(), err.read_text())


def fedsuite_start(args: list[str], log: Path, *, stderr: Path | None = None, env: dict[str, str] | None = None,
                   cwd: Path | str | None = None, new_session: bool = False):
    """``python -m fedsuite.cli.main ARGS`` started as ``subprocess.Popen`` would, forked from this test
    process's warm process (see :func:`fedsuite_run`): its output appended to ``log`` (standard error
    to ``stderr`` if given), in a session of its own with ``new_session`` (a signal to its process
    group reaches it and what it starts, nothing of the test's). Returns what ``Popen`` offers the
    tests: ``pid``, ``poll()``, ``wait(timeout)``, ``returncode``."""
    global _WARM
    from fedsuite.launch.warm import WarmStarter

    if _WARM is None:
        _WARM = WarmStarter()
        atexit.register(_WARM.close)
    return _WARM.start([sys.executable, "-m", "fedsuite.cli.main", *args], Path(log), None,
                       dict(os.environ if env is None else env), stderr=stderr,
                       cwd=None if cwd is None else Path(cwd), new_session=new_session)


def start_ray_node(log: Path, num_cpus: int, worker_ports: tuple[int, int], head_port: int | None = None,
                   address: str | None = None, temp_dir: str | None = None,
                   env: dict[str, str] | None = None) -> subprocess.Popen:
    """A real Ray node (``ray start --block``, its own process group, stopped with ``stop_tree``): a
    head on ``head_port`` or a worker joining ``address``. Its workers use ``worker_ports`` (a range
    of its own: Ray's default 10002-19999 is shared with the private Ray of every simulation running
    beside it). A head gets its own ``temp_dir``, so a private ``ray.init()`` never finds and joins it.
    No log monitor: it forwards workers' output to drivers, and fedsuite's drivers take none
    (``log_to_driver=False``); a worker node's ran the whole session at ~8 CPU-s (measured)."""
    role = (["--head", "--port", str(head_port), "--include-dashboard", "false", "--temp-dir", temp_dir]
            if address is None else ["--address", address])
    cmd = [RAY, "start", "--block", *role, "--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus),
           "--num-gpus", "0", "--min-worker-port", str(worker_ports[0]), "--max-worker-port", str(worker_ports[1]),
           "--include-log-monitor", "false"]
    return subprocess.Popen(cmd, env=env or ray_env(), stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_for_ray(address: str, node: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while subprocess.run([RAY, "status", "--address", address], capture_output=True, env=ray_env()).returncode:
        assert node.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(1)


@pytest.fixture(scope="session")
def worker_ray_cluster(tmp_path_factory, worker_id):
    """The Ray cluster this xdist worker's ``simulate`` runs use: one node, one CPU, started once.

    A simulation's private Ray costs ~8 s of CPU in daemons (GCS, raylet, monitor, dashboard head,
    log monitor, two agents) before any client runs, and one ClientApp actor per CPU, each ~8 s of
    imports and warm-up. The worker's simulations run one after another, so they share one node,
    and one CPU means one actor per run. Runs through ``--ray-address`` are the product path of
    ``tests/test_raycluster.py``; the private-Ray path stays covered by every CLI-driven test."""
    index = int(worker_id[2:]) if worker_id.startswith("gw") else 99
    base = tmp_path_factory.mktemp("worker-ray")
    temp_dir = tempfile.mkdtemp(prefix="fsw", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    port = superlink.free_port()
    address = f"127.0.0.1:{port}"
    lo = 30000 + index * 50  # 30000-34999: clear of tests/test_raycluster.py's 20000-29999
    head = start_ray_node(base / "head.log", 1, (lo, lo + 49), head_port=port, temp_dir=temp_dir)
    try:
        wait_for_ray(address, head, base / "head.log")
        yield address
    finally:
        processes.stop_tree(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def simulate(request, cached_simulate):
    """simulate(**overrides) -> SimResult, the session-cached runs of ``cached_simulate``. In a
    test marked ``inprocess`` (a file's ``pytestmark = pytest.mark.inprocess``) the runs use the
    in-process engine unless the call names an engine: such a file tests the methods' maths or the
    records, not how messages travel, and the in-process engine gives Flower's numbers bit for bit
    (tests/test_registry_e2e.py)."""
    if request.node.get_closest_marker("inprocess") is None:
        return cached_simulate
    return functools.partial(cached_simulate, engine="inprocess")


@pytest.fixture(scope="session")
def cached_simulate(tmp_path_factory, data_root, worker_ray_cluster):
    """simulate(**overrides) -> SimResult; overrides are RunConfig keys (dotted for sections).
    ``expect_failure=True``: the run must end failed (the result holds what it left behind).
    CPU runs on Flower's engine join this worker's Ray cluster (``worker_ray_cluster``) unless
    ``ray_address`` is given; ``engine="inprocess"`` runs the round engine in this test process."""
    cache: dict[str, SimResult] = {}
    base = tmp_path_factory.mktemp("runs")

    def run(*, expect_failure: bool = False, **overrides: Any) -> SimResult:
        values = fast(**{"data_root": str(data_root), **overrides})
        key = json.dumps(values, sort_keys=True, default=str)
        if key in cache:
            return cache[key]
        on_cpu = not values.get("num_gpus") and values.get("device", "cpu") == "cpu"  # the node has no GPU
        on_ray = values.get("engine", "flower") == "flower"
        cfg = build_config(values={"ray_address": worker_ray_cluster, **values} if on_cpu and on_ray else values)
        run_dir = base / f"run{len(cache):03d}"
        outcome = launch.simulate(cfg, run_dir)
        error = (run_dir / "error.txt").read_text() if (run_dir / "error.txt").exists() else outcome.details
        if expect_failure:
            assert not outcome.ok, f"simulation was expected to fail but ended {outcome.status}"
        else:
            assert outcome.ok, f"simulation failed ({outcome.status}): {error}"
        cache[key] = sim_result(run_dir)
        return cache[key]

    return run


def sim_result(run_dir: Path) -> SimResult:
    """What a finished run left in ``run_dir``."""
    ckpt = run_dir / "checkpoint.pt"
    return SimResult(
        run_dir=run_dir,
        rows=read_metrics(run_dir),
        summary=json.loads((run_dir / "summary.json").read_text()),
        checkpoint=torch.load(ckpt, weights_only=False) if ckpt.is_file() else {},
    )


@pytest.fixture(scope="session")
def simulate_batch(tmp_path_factory, data_root, worker_ray_cluster):
    """simulate_batch([overrides, ...]) -> [SimResult, ...]: the runs (``fast`` settings with each
    one's overrides) one after another in one Flower simulation on this worker's Ray node
    (``fedsuite.launch.start.simulate_batch``); each must complete, except one whose overrides hold
    ``expect_failure=True``, which must fail."""
    base = tmp_path_factory.mktemp("batch")

    def run(many: list[dict[str, Any]]) -> list[SimResult]:
        expect_failure = [bool(values.get("expect_failure")) for values in many]
        runs = [(build_config(values={"ray_address": worker_ray_cluster, **fast(
                     data_root=str(data_root), **{k: v for k, v in values.items() if k != "expect_failure"})}),
                 Path(tempfile.mkdtemp(prefix="run", dir=base))) for values in many]
        outcomes = launch.simulate_batch(runs)
        for outcome, fails in zip(outcomes, expect_failure):
            assert outcome.ok != fails, f"{outcome.run_dir} ended {outcome.status}: {outcome.details}"
        return [sim_result(outcome.run_dir) for outcome in outcomes]

    return run


def deployment_app(tmp_path: Path, data_root: Path, **values: Any):
    """A run for a Deployment Engine test: the FAST setup with 2 partitions, both sampled every round
    (``values`` override), its run directory and its Flower app (``launch.write_app``).
    Returns (cfg, run_dir, app_dir)."""
    cfg = build_config(values=fast(**{"data_root": str(data_root), "num_clients": 2, "clients_per_round": 2, **values}))
    run_dir = (tmp_path / "run").resolve()
    run_dir.mkdir()
    launch.write_app(run_dir / "app", cfg, run_dir)
    return cfg, run_dir, run_dir / "app"


def tree_snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file and folder under ``folder`` (a run's ``.flwr`` left out: Flower's home, not the
    run's record) with its modification time and, for a file, its content's hash: equal snapshots
    mean nothing was written, changed, added or removed."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()
                                         if p.is_file() else "folder")
            for p in sorted(folder.rglob("*")) if ".flwr" not in p.relative_to(folder).parts}


def assert_same_state(a: Any, b: Any, where: str = "state") -> None:
    """Two checkpoint states (nested dicts and lists of arrays, tensors and plain values) are equal,
    arrays bit for bit."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{where}: keys {list(a)} != {list(b) if isinstance(b, dict) else b}"
        for k in a:
            assert_same_state(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif isinstance(a, (np.ndarray, torch.Tensor)):
        x, y = (np.asarray(v.cpu() if isinstance(v, torch.Tensor) else v) for v in (a, b))
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y, equal_nan=True), f"{where} differs"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_client_state(run_a: Path, run_b: Path) -> None:
    """Two runs' ``client-state`` folders hold the same files with the same arrays, bit for bit."""
    files_a, files_b = (sorted(p.relative_to(r / "client-state") for p in (r / "client-state").rglob("*")
                               if p.is_file()) for r in (run_a, run_b))
    assert files_a == files_b
    for rel in files_a:
        assert_same_state(torch.load(run_a / "client-state" / rel, weights_only=False),
                          torch.load(run_b / "client-state" / rel, weights_only=False), str(rel))


def assert_same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray], exact: bool = True) -> None:
    assert list(a) == list(b)
    for k in a:
        if exact:
            assert np.array_equal(a[k], b[k]), f"array {k} differs"
        else:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)


#: where ``make_task`` keeps its client's state when the test names no folder (a fresh folder per
#: task, so no two tasks share state); removed when the test process exits
TASK_STATE_SCRATCH = tempfile.TemporaryDirectory(prefix="fedsuite-task-state-")


def make_task(cfg_values: dict[str, Any] | None = None, *, pid: int = 0, server_round: int = 1,
              extras: dict[str, dict[str, torch.Tensor]] | None = None, config: dict[str, Any] | None = None,
              state_dir: Path | None = None, seed: int = 0):
    """A LocalTask for one client of the FAST synthetic setup, built without Flower: for unit tests of
    client rules and plug-ins. Returns (task, cfg). ``cfg_values`` override FAST (dotted keys allowed)."""
    from fedsuite import models
    from fedsuite.engine import runtime
    from fedsuite.method.state import ClientState
    from fedsuite.method.training import LocalData, LocalTask

    values = fast(**{"data_root": tempfile.gettempdir() + "/fedsuite-test-data", **(cfg_values or {})})
    cfg = build_config(values=values)
    bundle = runtime.load_bundle(cfg)
    idx = torch.tensor(runtime.client_indices(cfg, bundle, pid), dtype=torch.int64)
    data = LocalData(x=bundle.x_train[idx], y=bundle.y_train[idx], bundle=bundle, augment="none")
    torch.manual_seed(cfg.seed)
    model = models.make_model(cfg, bundle)
    received = {k: v.detach().clone() for k, v in model.state_dict().items()}
    conf = {"server-round": server_round, "lr": cfg.lr, **(config or {})}
    task = LocalTask(
        model=model, received=received, extras=extras or {}, config=conf, cfg=cfg, data=data,
        state=ClientState(None, state_dir or Path(tempfile.mkdtemp(dir=TASK_STATE_SCRATCH.name)), pid, server_round), partition_id=pid,
        server_round=server_round, lr=float(conf["lr"]), device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(seed),
    )
    return task, cfg


def make_strategy(name: str = "fedavg", initial: dict[str, Any] | None = None, *, num_clients: int = 4,
                  cohort: int | None = None, unit_round: bool = True, evaluate: bool = False,
                  build_model: bool = False, run_dir: Path | None = None, **values: Any):
    """Method ``name``'s server rule for a unit test, built without Flower as the ServerApp builds one
    (``cfg.method.strategy(ServerSetup(...))``): FAST with ``num_clients`` partitions (node 1000 + p
    holds partition p), a cohort of ``cohort`` (default: every client), :data:`UNIT_ROUND` unless
    ``unit_round=False``, and ``values`` over them (dotted keys allowed). w^0 is a copy of ``initial``
    (hand-built arrays or lists, taken as given) or, when None, the run's own (``initial_arrays``).
    The setup's ``partition_size`` counts the run's real partition; ``evaluate=True`` and
    ``build_model=True`` add the ServerApp's central evaluation on the test split and its model
    builder, ``run_dir`` its run folder (all on ``strategy.setup``). The dataset is loaded only when
    one of these needs it."""
    from fedsuite import models
    from fedsuite.engine import runtime
    from fedsuite.method.strategy import ServerSetup
    from fedsuite.method.training import arrays_evaluator

    cfg = build_config(values=fast(**{"data_root": tempfile.gettempdir() + "/fedsuite-test-data", "strategy": name,
                                      "num_clients": num_clients, "clients_per_round": cohort or num_clients,
                                      **(UNIT_ROUND if unit_round else {}), **values}))
    bundle = functools.cache(lambda: runtime.load_bundle(cfg))
    w0 = models.initial_arrays(cfg, bundle()) if initial is None else initial
    check = arrays_evaluator(models.make_model(cfg, bundle()), bundle().x_test, bundle().y_test, bundle(),
                             cfg.eval_batch_size) if evaluate else None
    setup = ServerSetup(cfg=cfg, node_to_pid={1000 + p: p for p in range(num_clients)},
                        initial={k: np.array(v) for k, v in w0.items()}, evaluate=check, run_dir=run_dir,
                        build_model=(lambda: models.make_model(cfg, bundle())) if build_model else None,
                        partition_size=lambda pid: len(runtime.client_indices(cfg, bundle(), pid)))
    return cfg.method.strategy(setup)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the marks into groups
def pytest_collection_modifyitems(items):
    """Keep each test file on one xdist worker (its tests share cached simulations). A test that
    carries its own ``xdist_group`` mark keeps it: that is how a test joins another file's group to
    share that file's cached simulations (each xdist worker has its own cache).

    Then the groups are put in the order the workers are to take them (``--no-loadscope-reorder``:
    xdist hands out whole groups in the order of their first test): first the groups holding a test
    marked ``long`` (minutes of real processes, kills and timeouts), in file order, then the rest
    by number of tests, most first (xdist's own order). A long test taken last would leave the
    other workers idle while it runs; taken first, it runs beside the many short ones."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        item.add_marker(pytest.mark.xdist_group(item.module.__name__))

    def group(item) -> str:  # xdist's scope of a test under --dist loadgroup
        mark = item.get_closest_marker("xdist_group")
        return mark.kwargs.get("name", mark.args[0] if mark.args else "default") if mark else item.nodeid

    size: dict[str, int] = {}
    has_long: set[str] = set()
    for item in items:
        size[group(item)] = size.get(group(item), 0) + 1
        if item.get_closest_marker("long") is not None:
            has_long.add(group(item))
    items.sort(key=lambda item: (0, 0) if group(item) in has_long else (1, -size[group(item)]))  # stable
