"""FedAvg's server rule, reply validation, and whole runs on Flower's real Simulation Engine."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict

from fedsuite.method.arrays import weighted_mean
from fedsuite.config import build_config
from fedsuite.method.replies import Reply, failure_reason
from fedsuite.method.strategy import RoundFailure, RoundLog
from fedsuite.method.wire import to_record
from tests.conftest import FAST, assert_same_arrays, make_strategy

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


#: w^0 of the FedAvg rules below (conftest's ``make_strategy``, with the run's failure bound: no UNIT_ROUND)
W0 = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32), "n": np.array(0, np.int64)}


def client_reply(pid: int, arrays: dict, n: int, **metrics) -> tuple[int, Reply]:
    """(partition id, its reply), as a transport hands them to ``aggregate_round``."""
    content = RecordDict({"arrays": to_record(arrays),
                          "metrics": MetricRecord({"num-examples": n, "train-loss": 1.0, **metrics})})
    return pid, Reply(content)


def error_reply(pid: int, reason: str) -> tuple[int, Reply]:
    return pid, Reply(error=reason)


def test_fedavg_is_the_hand_computed_weighted_mean():
    strategy = make_strategy("fedavg", W0, unit_round=False)
    rng = np.random.default_rng(0)
    models = [{"w": rng.normal(size=(2, 3)).astype(np.float32), "b": rng.normal(size=3).astype(np.float32),
               "n": np.array(10 * (i + 1), np.int64)} for i in range(3)]
    sizes = [10, 30, 60]
    replies = [client_reply(i, m, n) for i, (m, n) in enumerate(zip(models, sizes))]
    got, metrics = strategy.aggregate_round(1, dict(reversed(replies)))  # arrival order must not matter
    expected_w = (10 * models[0]["w"].astype(np.float64) + 30 * models[1]["w"] + 60 * models[2]["w"]) / 100
    np.testing.assert_allclose(got["w"], expected_w, rtol=1e-6)
    assert got["w"].dtype == np.float32
    assert got["n"].dtype == np.int64 and got["n"] == round((10 * 10 + 30 * 20 + 60 * 30) / 100)
    assert metrics["train-loss"] == pytest.approx(1.0)


def test_weighted_mean_is_order_independent_bitwise_after_sorting():
    strategy = make_strategy("fedavg", W0, unit_round=False)
    rng = np.random.default_rng(1)
    replies = [client_reply(i, {"w": rng.normal(size=(2, 3)).astype(np.float32), "b": np.ones(3, np.float32),
                                "n": np.array(1)}, 5 + i) for i in range(4)]
    a, _ = strategy.aggregate_round(1, dict(replies))
    b, _ = strategy.aggregate_round(1, dict(replies[::-1]))
    assert_same_arrays(a, b)


def test_bad_replies_are_dropped_and_logged_with_partition_id(caplog):
    strategy = make_strategy("fedavg", W0, unit_round=False)
    strategy.round_log = RoundLog(round=1)
    good = {"w": np.ones((2, 3), np.float32), "b": np.ones(3, np.float32), "n": np.array(1)}
    nan = {**good, "w": np.full((2, 3), np.nan, np.float32)}
    inf = {**good, "b": np.array([1, np.inf, 0], np.float32)}
    wrong_shape = {**good, "w": np.ones((3, 2), np.float32)}
    replies = [client_reply(0, good, 10), client_reply(1, nan, 10), client_reply(2, inf, 10),
               client_reply(3, wrong_shape, 10), error_reply(4, "client crashed")]
    with caplog.at_level("WARNING", logger="fedsuite"):
        arrays, _ = strategy.aggregate_round(1, dict(replies))
    np.testing.assert_array_equal(arrays["w"], good["w"])  # only the good reply counts
    assert strategy.round_log.dropped == [1, 2, 3, 4]  # in partition-id order, whatever the arrival order
    text = caplog.text
    assert "client 1: non-finite" in text and "client 2: non-finite" in text
    assert "client 3: array 'w' has shape" in text and "client crashed" in text


def test_round_failures_are_bounded_by_max_failed_fraction():
    """Missing, error and rejected replies all count against the cohort; past the bound (or with no
    accepted reply at all, whatever the bound) the round raises RoundFailure naming the clients."""
    good = {"w": np.ones((2, 3), np.float32), "b": np.ones(3, np.float32), "n": np.array(1)}
    replies = dict([client_reply(0, good, 10), client_reply(1, good, 10), error_reply(2, "boom")])
    for limit, fails in [(0.5, False), (0.25, True), (0.0, True)]:
        strategy = make_strategy("fedavg", W0, unit_round=False, max_failed_fraction=limit)
        strategy.round_log = RoundLog(round=1, cohort=[0, 1, 2, 3])  # client 3 never answers
        if fails:
            with pytest.raises(RoundFailure) as exc:
                strategy.aggregate_round(1, replies)
            assert exc.value.failed == [2, 3] and exc.value.first_error == "client error: boom"
            assert "round 1: 2 of 4 client replies failed (partitions 2, 3" in str(exc.value)
        else:
            arrays, _ = strategy.aggregate_round(1, replies)
            assert arrays is not None and strategy.round_log.failed == 2
            assert strategy.round_log.drop_reasons == {2: "client error: boom", 3: "no reply"}
    strategy = make_strategy("fedavg", W0, unit_round=False, max_failed_fraction=1.0)
    strategy.round_log = RoundLog(round=1, cohort=[0])
    with pytest.raises(RoundFailure):
        strategy.aggregate_round(1, dict([error_reply(0, "boom")]))


def test_failure_reason_unwraps_flowers_clientapp_exception():
    wrapped = ("<class 'flwr.clientapp.client_app.ClientAppException'>:<'\n"
               "Exception ClientAppException occurred. Message: CUDA out of memory'>")
    assert failure_reason(wrapped) == "CUDA out of memory"
    assert failure_reason("line one\nReply timed out") == "Reply timed out"


def test_cohort_sampling_is_seeded_by_partition_id():
    a = make_strategy("fedavg", W0, num_clients=20, cohort=5, unit_round=False)
    b = make_strategy("fedavg", W0, num_clients=20, cohort=5, unit_round=False)
    assert [a.sample_cohort(r) for r in range(1, 6)] == [b.sample_cohort(r) for r in range(1, 6)]
    assert len({tuple(a.sample_cohort(r)) for r in range(1, 6)}) > 1
    assert all(len(set(a.sample_cohort(r))) == 5 for r in range(1, 6))


def test_weighted_sum64_is_numpys_float64_loop_bit_for_bit(monkeypatch):
    """The torch, block-at-a-time accumulation is the plain loop ``acc += a.astype(float64) * (w/Σw)``
    bit for bit: blocks that do not divide the arrays, float32/float64/integer arrays, a 0-d buffer,
    a non-contiguous array and a read-only one (a view of an immutable buffer), no warning.
    The cast back agrees with numpy's ``astype`` on ties, subnormals and overflow."""
    import warnings

    from fedsuite.method import arrays as arrays_module

    monkeypatch.setattr(arrays_module, "SUM_BLOCK", 7)
    rng = np.random.default_rng(3)
    like = {"w": np.zeros((5, 3), np.float32), "d": np.zeros(11, np.float64), "t": np.zeros((4, 6), np.float32),
            "n": np.array(0, np.int64)}

    def client(i: int) -> dict[str, np.ndarray]:
        read_only = rng.normal(size=11) * 10.0 ** rng.integers(-30, 30, size=11)
        read_only.setflags(write=False)
        return {"w": rng.normal(size=(5, 3)).astype(np.float32), "d": read_only,
                "t": rng.normal(size=(6, 4)).astype(np.float32).T, "n": np.array(7 * i + 1)}

    replies, weights = [client(i) for i in range(5)], [3.0, 1.0, 0.5, 7.0, 2.25]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = arrays_module.weighted_sum64(replies, weights, like)
        mean = weighted_mean(replies, weights, like)
    total = sum(weights)
    for key, ref in like.items():
        acc = np.zeros(ref.shape, np.float64)
        for a, w in zip(replies, weights):
            acc += a[key].astype(np.float64) * (w / total)
        assert got[key].dtype == np.float64 and got[key].shape == ref.shape
        assert got[key].tobytes() == acc.tobytes(), key
        expected = np.rint(acc).astype(ref.dtype) if key == "n" else acc.astype(ref.dtype)
        assert mean[key].dtype == ref.dtype and mean[key].tobytes() == expected.tobytes(), key

    edges = np.array([1e-320, 3.4e38, 3.5e38, -0.0, np.inf, 1 + 2**-24, 1 + 3 * 2**-24, 1e-45, 7e-46])
    for dtype in (np.float32, np.float16):
        with np.errstate(over="ignore"):
            assert arrays_module.cast_like(edges, np.zeros(1, dtype)).tobytes() == edges.astype(dtype).tobytes()


def test_weighted_mean_helper_casts_integers():
    out = weighted_mean([{"x": np.array([1, 2])}, {"x": np.array([2, 5])}], [1, 1], {"x": np.array([0, 0])})
    assert out["x"].dtype == np.array([0]).dtype and out["x"].tolist() == [2, 4]


# ------------------------------------------------------------------------------------------------
# real simulations
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def flower_runs(simulate_batch):
    """This file's Flower runs, one batch (``launch.simulate_batch``: one simulation, one Ray node,
    one ClientApp actor): FedAvg for 3 rounds, the same again in another folder, and a run whose
    clients diverge (lr 1e30), which fails."""
    return simulate_batch([{"strategy": "fedavg", "rounds": 3}, {"strategy": "fedavg", "rounds": 3},
                           {"strategy": "fedavg", "rounds": 1, "lr": 1e30, "expect_failure": True}])


def test_end_to_end_simulation_writes_a_complete_run_directory(flower_runs):
    res = flower_runs[0]
    files = {p.name for p in res.run_dir.iterdir()}
    assert {"config.json", "metrics.jsonl", "summary.json", "checkpoint.pt", "accuracy.png"} <= files
    assert [r["round"] for r in res.rows] == [0, 1, 2, 3]
    for row in res.rows[1:]:
        assert len(row["cohort"]) == FAST["clients_per_round"]
        assert row["bytes_sent"] > 0 and row["bytes_received"] == row["bytes_sent"]
        assert math.isfinite(row["train_loss"]) and row["dropped"] == []
    assert res.summary["status"] == "completed" and res.summary["rounds_completed"] == 3
    # the synthetic benchmark is learnable: accuracy rises from chance
    assert res.rows[-1]["test_accuracy"] > res.rows[0]["test_accuracy"] + 0.1
    assert res.checkpoint["round"] == 3


def test_same_seed_gives_identical_metrics(flower_runs):
    a, b = flower_runs[:2]  # two runs of one config, one after the other on the same ClientApp actor
    assert a.run_dir != b.run_dir
    assert a.metrics_without_time() == b.metrics_without_time()
    assert_same_arrays(a.arrays, b.arrays)


def test_simulation_trains_the_plain_pytorch_loops_model_bit_for_bit(flower_runs, data_root):
    """Flower's Simulation Engine (Ray actors, serialisation, the strategy's validated float64 mean,
    central evaluation) ends with the very model of FedAvg written directly in PyTorch
    (``benchmarks/harness.py::plain_fedavg``: the same cohorts, seeds and SGD steps, one client after
    another in this process), and every round's test accuracy is the same."""
    import sys

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from harness import plain_fedavg

    res = flower_runs[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the actors' arithmetic (num_cpus = 1)
    try:
        plain = plain_fedavg(build_config(values={**FAST, "data_root": str(data_root), "strategy": "fedavg",
                                                  "rounds": 3}), 3, torch.device("cpu"), log=False)
    finally:
        torch.set_num_threads(threads)
    assert_same_arrays(res.arrays, plain.state)
    assert [r["test_accuracy"] for r in res.rows[1:]] == plain.accuracy


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.0, 1e-3), (0.5, 0.1)])
def test_fedsuites_sgd_is_torch_optim_sgd_bit_for_bit(momentum, weight_decay):
    """``fedsuite.method.training.SGD`` (the local optimizer, without ``torch.optim``) steps a model exactly
    as ``torch.optim.SGD`` with the same settings: five steps, a parameter without a gradient in
    one of them (skipped, its momentum kept), every parameter and momentum buffer equal, bit for bit."""
    import copy

    import torch

    from fedsuite.method.training import SGD

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.GroupNorm(2, 4), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 4 * 4, 5))
    x, y = torch.randn(8, 3, 6, 6), torch.randint(0, 5, (8,))
    ours, theirs = copy.deepcopy(net), copy.deepcopy(net)
    opt_ours = SGD(ours.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay)
    for step in range(5):
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if step == 2:
                model[3].bias.grad = None
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(ours.parameters(), theirs.parameters()))
    if momentum:
        for p, q in zip(ours.parameters(), theirs.parameters()):
            assert torch.equal(opt_ours.state[p]["momentum_buffer"], opt_theirs.state[q]["momentum_buffer"])
    opt_ours.zero_grad()
    assert all(p.grad is None for p in ours.parameters())


def test_local_training_imports_no_compiler():
    """Training a client (every kind of rule: plain SGD, a drift term, SAM with momentum, the
    neuron-wise rates) imports no ``torch._dynamo``: torch's optimizers and
    ``torch.use_deterministic_algorithms`` import that compiler, 1.3 CPU-seconds in every process
    that trains, which fedsuite never uses on a one-thread CPU client (``fedsuite.method.training.SGD``)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        f"sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]\n"
        "from conftest import make_task\n"
        "from fedsuite.method.plugins import active_plugins\n"
        "from fedsuite.method.training import run_local_training\n"
        "for strategy in ('fedavg', 'feddyn', 'scaffold', 'mofedsam', 'fednlr'):\n"
        "    probe, _ = make_task({'strategy': strategy})\n"  # SCAFFOLD's messages carry c (round 1: 0)
        "    cv = {'server-cv': {n: p.detach() * 0 for n, p in probe.model.named_parameters() if p.requires_grad}}\n"
        "    task, cfg = make_task({'strategy': strategy, 'momentum': 0.9, 'weight_decay': 1e-3},\n"
        "                          extras=cv if strategy == 'scaffold' else None)\n"
        "    run_local_training(cfg.method.client(plugins=active_plugins(cfg)), task)\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_central_evaluation_uses_the_cores_the_run_holds():
    from fedsuite.launch.processes import available_cores
    from fedsuite.engine.round_engine import evaluation_threads

    private = build_config(values={**FAST, "num_cpus": 1})
    shared = build_config(values={**FAST, "num_cpus": 1, "ray_address": "127.0.0.1:6379"})
    assert evaluation_threads(private) == available_cores() >= 1  # a private Ray holds the run's cores
    assert evaluation_threads(shared) == 1  # a shared cluster's other runs may be training meanwhile


def test_runs_at_once_get_disjoint_shares_of_the_cores():
    """``--jobs N``: N slices of the cores, sizes within one of each other, together every core;
    more runs than cores take a core each in turn; one job is not pinned."""
    from fedsuite.launch.processes import core_slices

    assert core_slices(1, [0, 1]) is None
    assert core_slices(2, [0, 1]) == [{0}, {1}]
    assert core_slices(4, [5, 3]) == [{3}, {5}, {3}, {5}]
    for jobs, n in ((2, 16), (3, 16), (5, 7), (3, 4)):
        slices = core_slices(jobs, range(n))
        assert len(slices) == jobs and set().union(*slices) == set(range(n)), (jobs, n)
        assert sum(len(s) for s in slices) == n and max(map(len, slices)) - min(map(len, slices)) <= 1, (jobs, n)


def test_divergent_clients_fail_the_run_loudly(flower_runs):
    """A learning rate of 1e30 makes every client's model non-finite: every reply is rejected, never
    averaged, and a round with no accepted reply fails the run with the clients and the reason."""
    res = flower_runs[2]
    failure = res.summary["failure"]
    assert res.summary["status"] == "failed" and failure["round"] == 1
    assert len(failure["partition_ids"]) == FAST["clients_per_round"]
    assert "non-finite values" in failure["first_error"]
    assert [r["round"] for r in res.rows] == [0] and res.checkpoint == {}


@pytest.mark.skipif(not (SHARED_DATA / "FashionMNIST" / "raw").is_dir(), reason="../shared/data is not present")
def test_fmnist_real_data_learns_above_chance(simulate, tmp_path_factory):
    root = tmp_path_factory.mktemp("fmnist-root")
    (root / "FashionMNIST").symlink_to(SHARED_DATA / "FashionMNIST")
    res = simulate(strategy="fedavg", dataset="fmnist", model="cnn", data_root=str(root), num_clients=40,
                   clients_per_round=4, rounds=3, partitioner="dirichlet", alpha=0.5, lr=0.05, batch_size=32,
                   eval_batch_size=2000, engine="inprocess")  # the data is tested here, not the engine
    assert res.rows[-1]["test_accuracy"] > 0.45  # chance is 0.10


def test_report_groups_seeds_and_finds_rounds_to_target(tmp_path):
    import json as _json

    from fedsuite.records.recording import RunRecorder
    from fedsuite.records.results import report

    for seed, accs in ((0, [0.1, 0.5, 0.7]), (1, [0.1, 0.6, 0.9])):
        d = tmp_path / f"s{seed}"
        d.mkdir()
        cfg = build_config(values={"seed": seed}).active_dump()
        (d / "config.json").write_text(_json.dumps(cfg))
        rec = RunRecorder(d)
        for rnd, acc in enumerate(accs):
            rec.append({"round": rnd, "test_accuracy": acc, "wall_seconds": 1.0})
        rec.finish("completed")
        assert (d / "accuracy.png").stat().st_size > 1000
    rows, curves = report([tmp_path / "s0", tmp_path / "s1"], target=0.65, last=1)
    assert len(rows) == 1 and rows[0]["seeds"] == 2
    assert rows[0]["final_mean"] == pytest.approx(0.8) and rows[0]["final_std"] == pytest.approx(0.02 ** 0.5)  # sample std
    assert rows[0]["rounds_to_target"] == pytest.approx(2.0) and rows[0]["reached"] == "2/2"


def test_round_log_columns_merge():
    """Strategies and plug-ins add columns to one typed log; adding never drops another's columns."""
    log = RoundLog(round=3, cohort=[1, 2])
    log.add({"a": 1})
    log.add({"nlr-mu-l1": 2.0})
    log.drop(2, "boom")
    log.drop(2, "later reason")
    assert log.row()["a"] == 1 and log.row()["nlr-mu-l1"] == 2.0
    assert log.row()["failure_reasons"] == {"2": "boom"} and log.dropped == [2, 2]


def _dispatch(strategy, server_round: int) -> list[tuple]:
    contents = strategy.configure_round(server_round, strategy.global_arrays)
    out = []
    for pid, content in contents.items():
        records = {name: {k: v.numpy().tobytes() for k, v in rec.items()} for name, rec in content.array_records.items()}
        out.append((pid, dict(content["config"]), records))
    return out


def test_every_method_sends_the_round_it_is_given(tmp_path):
    """The engine counts global rounds (a resume after round 3 asks for round 4): every method's
    round 4 sends the same cohort, config (server-round 4, lr decayed three times, slots) and arrays
    from two strategies built alike, whatever rounds the other has run (none here)."""
    from fedsuite.method import registry

    for name in registry.methods():
        sent = []
        for offset in (0, 3):
            strategy = make_strategy(name, num_clients=FAST["num_clients"], cohort=FAST["clients_per_round"],
                                     unit_round=False, build_model=True, run_dir=tmp_path / f"{name}-{offset}",
                                     lr_decay=0.9)
            sent.append(_dispatch(strategy, 4))
        assert sent[0] == sent[1], name
        assert all(conf["server-round"] == 4 and conf["lr"] == pytest.approx(FAST["lr"] * 0.9**3)
                   for _, conf, _ in sent[0]), name


def test_a_node_that_never_answers_the_handshake_fails_the_run(monkeypatch):
    """The ServerApp's handshake on Flower's in-memory grid with three registered nodes and no engine
    to answer (built as Flower's simulation builds them): past ``HANDSHAKE_TIMEOUT_S`` it raises,
    naming how many nodes are missing, instead of going on with a partial node -> partition map."""
    import importlib

    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.superlink.grid import InMemoryGrid

    import fedsuite.engine.nodes as nodes
    import fedsuite.engine.server_app as server_app

    flower_sim = importlib.import_module("flwr.simulation.run_simulation")
    vce = importlib.import_module("flwr.server.superlink.fleet.vce.vce_api")
    factory = flower_sim.LinkStateFactory(flower_sim.FLWR_IN_MEMORY_DB_NAME, flower_sim.NoOpFederationManager(),
                                          flower_sim.ObjectStoreFactory())
    run = Run.create_empty(run_id=1)
    run.primary_task_id, run.federation_id = 1, NOOP_FEDERATION_ID
    state = factory.state()
    state.run_ids[1] = flower_sim.RunRecord(run=run)
    state.task_store[1] = flower_sim.Task(task_id=1, run_id=1)
    # the identity the ServerApp sends under, as fedsuite.launch.simulation sets it (restored afterwards)
    for field, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", SUPERLINK_NODE_ID)):
        monkeypatch.setattr(TaskIdentity, field, value)
    vce._register_nodes(3, factory)
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    server_app.tune_grid(grid)
    monkeypatch.setattr(nodes, "HANDSHAKE_TIMEOUT_S", 0.5)

    handshake = nodes.Handshake(grid, 3)
    assert len(handshake.pending) == 3
    with pytest.raises(RuntimeError, match="3 nodes did not answer the handshake within 0.5 s"):
        handshake.partition_ids()


PRESTARTED_WORKER_PROBE = """
import os, sys, time
import psutil, ray
from flwr.app import Context, Message, RecordDict
from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
from flwr.supercore.task_identity import TaskIdentity
from fedsuite.launch.simulation import backend_config, start_ray, use_light_actor
from fedsuite.config import build_config

start_ray()
use_light_actor()
driver_path = list(sys.path)

# the job has no runtime_env: one would make Ray start fresh workers for the actors instead of
# taking the ones it prestarts for the driver (whether and when Ray prestarts them is Ray's timing,
# not asserted here)
assert not dict(ray.get_runtime_context().runtime_env), ray.get_runtime_context().runtime_env
ray_processes = [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)]

def app_fn():  # stands in for the ClientApp: its reply says where it ran and what that worker imported
    return lambda message, context: (os.getpid(), list(sys.path), sorted(sys.modules))

# Flower's backend, built as its simulation engine builds it, on the running Ray; a message sent
# under the identity fedsuite.launch.simulation gives the ServerApp
TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
backend = RayBackend(backend_config(build_config(values={"num_cpus": 1})))
backend.build(app_fn)
(pid, actor_path, modules), _ = backend.process_message(
    Message(RecordDict(), dst_node_id=7, message_type="query"),
    Context(run_id=1, node_id=7, node_config={"partition-id": 3}, state=RecordDict(), run_config={}))
assert pid != os.getpid(), "the actor ran in the driver, not in a Ray worker"
missing = [p for p in driver_path if p and p not in actor_path]
assert not missing, f"the actor cannot import what the driver can: {missing}"
heavy = [m for m in modules if m.split(".")[0] in ("sqlalchemy", "alembic") or m.startswith("flwr.simulation")]
assert not heavy, f"the actor's worker imported Flower's simulation package and its SQL state: {heavy[:8]}"
unused = [c for c in ray_processes if any(d in c for d in ("dashboard/dashboard.py", "monitor.py"))]
# ray.init found its raylet through the prompt lookup, which gives Ray's own record of the node
from ray._private import services
node = ray._private.worker.global_worker.node
assert getattr(services.get_node, "__wrapped__", None), "ray.init asked for its node through Ray's one-second retry"
assert services.get_node(node.gcs_address, node.node_id) == services.get_node.__wrapped__(node.gcs_address, node.node_id)
assert any("raylet" in c for c in ray_processes) and not unused, f"Ray started daemons no simulation uses: {unused}"
print("ok")
"""


def test_the_clientapp_actors_start_in_the_workers_ray_prestarted_and_import_only_what_clients_need():
    """A private Ray (``fedsuite.launch.simulation.start_ray`` without ``RAY_ADDRESS``) prestarts workers
    as the driver connects; the ClientApp actors can take those only if the job has no
    ``runtime_env`` (one makes Ray start new workers: 0.6 s later and 0.3 CPU-s per idle worker on 2
    cores), so the job has none, and the actors must still import what the driver can
    (``PYTHONPATH``, as Flower's RayBackend). Whether Ray has prestarted a worker by the time the
    actor starts is Ray's timing and is not asserted (it failed a clean-clone run under load).
    The actor Flower's backend builds after ``use_light_actor`` is ``fedsuite.launch.ray_actor``'s: it
    passes the app's reply through, and its worker never imports ``flwr.simulation`` (whose
    ``__init__`` pulls in SQLAlchemy and Alembic, about 1 CPU-s per actor). And the private Ray runs
    without the API server ``ray.init`` would otherwise start and wait for, the autoscaler monitor
    and the log monitor, and ``ray.init`` found its raylet through the lookup that polls instead of
    sleeping a second (``simulation.lean_private_ray``)."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    ray_tmp = tempfile.mkdtemp(prefix="fsray-")  # short: Ray's socket paths must fit 107 bytes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = ray_tmp
    try:
        probe = subprocess.run([sys.executable, "-c", PRESTARTED_WORKER_PROBE], env=env, cwd=ray_tmp,
                               capture_output=True, text=True, timeout=240)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert probe.returncode == 0 and probe.stdout.strip().endswith("ok"), probe.stdout + probe.stderr[-3000:]


def test_fedsuites_clientapp_actor_runs_a_clientapp_as_flowers_does():
    """``fedsuite.launch.ray_actor.ClientAppActor`` stands in for Flower's in the Ray backend: on the same
    call, both return the same triple, wrap an app's error in the same ``ClientAppException`` and
    let a ``LoadClientAppError`` through (the engine tells the two apart)."""
    from flwr.clientapp.client_app import ClientAppException, LoadClientAppError
    from flwr.simulation.ray_transport.ray_actor import ClientAppActor as FlowerActor

    from fedsuite.launch.ray_actor import ClientAppActor

    ours, flowers = ClientAppActor.__ray_actor_class__(), FlowerActor.__ray_actor_class__()

    def replying():
        return lambda message, context: ("reply to", message, context)

    def failing():
        def app(message, context):
            raise ValueError(f"no partition {context}")
        return app

    def unloadable():
        raise LoadClientAppError("no such app")

    assert ours.run(replying, "msg", "3", "ctx") == flowers.run(replying, "msg", "3", "ctx") == (
        "3", ("reply to", "msg", "ctx"), "ctx")
    raised = []
    for actor in (ours, flowers):
        with pytest.raises(ClientAppException) as info:
            actor.run(failing, "msg", "3", "ctx")
        raised.append((str(info.value), type(info.value.__cause__)))
        with pytest.raises(LoadClientAppError, match="no such app"):
            actor.run(unloadable, "msg", "3", "ctx")
    assert raised[0] == raised[1] and raised[0][1] is ValueError and "no partition ctx" in raised[0][0]


def test_simulation_grid_checks_for_replies_every_10_ms():
    """The ServerApp tunes Flower's in-memory grid (built here as Flower's simulation engine builds it): the
    attribute it sets is the one ``send_and_receive`` sleeps on, so a Flower change cannot make the
    tuning a silent no-op."""
    import importlib
    import inspect

    from flwr.superlink.grid import InMemoryGrid

    from fedsuite.engine.server_app import SIMULATION_PULL_INTERVAL_S, tune_grid

    flower_sim = importlib.import_module("flwr.simulation.run_simulation")  # the module, not its function
    grid = InMemoryGrid(flower_sim.LinkStateFactory(flower_sim.FLWR_IN_MEMORY_DB_NAME,
                                                    flower_sim.NoOpFederationManager(),
                                                    flower_sim.ObjectStoreFactory()))
    assert "time.sleep(self.pull_interval)" in inspect.getsource(InMemoryGrid.send_and_receive)
    tune_grid(grid)
    assert grid.pull_interval == SIMULATION_PULL_INTERVAL_S == 0.01


def test_the_simulation_process_starts_ray_as_flowers_backend_would():
    """``fedsuite.launch.simulation.start_ray`` starts Ray before Flower's ``RayBackend`` is built, with the
    backend's own arguments, so Ray's start overlaps the process's imports. That is only a head start
    if the backend then uses the running Ray instead of starting another: a Flower change that drops
    the check, or a backend config whose init arguments differ from ours, fails here."""
    import inspect

    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    from fedsuite.launch.simulation import RAY_INIT_ARGS, backend_config

    assert "if not ray.is_initialized():" in inspect.getsource(RayBackend.init_ray)
    cfg = build_config(values={"num_cpus": 2, "num_gpus": 0.5})
    assert backend_config(cfg) == {"client_resources": {"num_cpus": 2, "num_gpus": 0.5},
                                   "init_args": RAY_INIT_ARGS}
