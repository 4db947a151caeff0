"""Baselines part B: FedRS, FedLC, CluSamp, CCVR, FedGen.

First the maths of each rule on hand-computed small cases (pure functions, hook level with
``make_task``, strategy level with hand-built ``ClientReply``s). Then equivalences through REAL
simulations on one shared setting (10 equal-size label-skewed clients, full participation, 2 rounds):
FedRS with α = 1, FedLC with τ = 0 and CluSamp with m = N equal-weight clients (every cluster one
client) are FedAvg bit for bit; CCVR trains exactly as FedAvg and only the evaluated head differs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ConfigRecord

from conftest import assert_same_arrays, make_strategy, make_task
from fedsuite.method.strategy import RoundLog
from fedsuite.method.wire import ClientReply, to_record


#: the methods' maths, not how messages travel: the in-process engine (``simulate``, tests/conftest.py)
pytestmark = pytest.mark.inprocess

F32 = np.float32


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Server-side rules run with the ServerApp's ``num_cpus`` threads (1); on a shared CPU more
    threads only oversubscribe it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def reply(pid: int, arrays: dict, n: int, extras: dict | None = None) -> ClientReply:
    return ClientReply(pid, {k: np.asarray(v, F32) for k, v in arrays.items()}, n, {"num-examples": float(n)}, extras or {})


# ------------------------------------------------------------------------------------------------
# FedRS
# ------------------------------------------------------------------------------------------------


def test_fedrs_scale_hand_computed():
    from clients.fedrs import restriction_scale

    counts = torch.tensor([3, 0, 2])
    assert restriction_scale(counts, 0.5).tolist() == [1.0, 0.5, 1.0]
    prop = restriction_scale(counts, 0.5, "proportional")
    assert torch.allclose(prop, torch.tensor([1.0, 0.5, 0.5 + 0.5 * 2 / 3]))


def test_fedrs_logits_hook_scales_absent_classes():
    from clients.fedrs import FedRSClient

    task, _ = make_task({"strategy": "fedrs", "partitioner": "dirichlet-equal", "alpha": 0.1}, pid=9)
    counts = torch.bincount(task.data.y, minlength=10)
    absent = counts == 0
    assert absent.any() and (~absent).any()  # client 9 of this split lacks some classes
    x = task.data.x[:16]
    z = task.model(x)
    zr = FedRSClient().logits(task, x)
    assert torch.equal(zr[:, ~absent], z[:, ~absent])
    assert torch.allclose(zr[:, absent], 0.5 * z[:, absent])
    task1, _ = make_task({"strategy": "fedrs", "fedrs.alpha": 1.0, "partitioner": "dirichlet-equal", "alpha": 0.1}, pid=9)
    assert torch.equal(FedRSClient().logits(task1, x), task1.model(x))  # α = 1: unchanged, bit for bit


# ------------------------------------------------------------------------------------------------
# FedLC
# ------------------------------------------------------------------------------------------------


def test_fedlc_shift_and_loss_hand_computed():
    from clients.fedlc import calibrated_loss, calibration_shift

    shift = calibration_shift(torch.tensor([16, 1, 0]), tau=1.0)
    assert torch.allclose(shift, torch.tensor([0.5, 1.0, 100.0], dtype=torch.float64))  # 0 clamped to 1e-8
    z = torch.tensor([[2.0, 1.0, 0.0]])
    cal = [2.0 - 0.5, 1.0 - 1.0, 0.0 - 100.0]
    expected = -(cal[0] - math.log(sum(math.exp(c) for c in cal)))
    assert calibrated_loss(z, torch.tensor([0]), shift).item() == pytest.approx(expected, rel=1e-6)


def test_fedlc_tau0_exact_and_uniform_counts_shift_invariant():
    from clients.fedlc import FedLCClient, calibrated_loss, calibration_shift

    task, _ = make_task({"strategy": "fedlc", "fedlc.tau": 0.0, "partitioner": "dirichlet-equal", "alpha": 0.1}, pid=9)
    x, y = task.data.x[:32], task.data.y[:32]
    assert torch.equal(FedLCClient().loss(task, x, y), F.cross_entropy(task.model(x), y))  # τ = 0: bit for bit
    z = torch.randn(8, 10, generator=torch.Generator().manual_seed(0))
    yy = torch.arange(8)
    uniform = calibration_shift(torch.full((10,), 37), tau=1.0)  # same shift for every class
    torch.testing.assert_close(calibrated_loss(z, yy, uniform), F.cross_entropy(z, yy))  # equal up to rounding


# ------------------------------------------------------------------------------------------------
# CluSamp
# ------------------------------------------------------------------------------------------------


def test_ward_linkage_matches_hand_computed_heights():
    from strategies.clusamp import ward_linkage

    x = np.array([0.0, 1.0, 3.0])
    z = ward_linkage(np.abs(x[:, None] - x[None, :]))
    assert z[0].tolist() == [0, 1, 1.0, 2]
    # Ward distance of {0,1} and {3}: sqrt(2·2·1/3)·|0.5 − 3| = sqrt(25/3)
    assert z[1][:2].tolist() == [2, 3] and z[1][2] == pytest.approx(math.sqrt(25 / 3)) and z[1][3] == 3


def test_clustered_distributions_two_groups_and_unbiased():
    from strategies.clusamp import pairwise_distance, sampling_distributions, ward_linkage, weight_clusters

    g = np.array([[0, 0], [0.1, 0], [5, 5], [5.1, 5]], dtype=F32)
    d = pairwise_distance(g, g, "L1")
    assert d[0, 2] == pytest.approx(10.0) and d[0, 1] == pytest.approx(0.1)
    z = ward_linkage(d)
    rng = np.random.default_rng(0)
    w = np.array([10, 10, 10, 10])
    clusters = weight_clusters(z, w, 2)
    assert clusters == [[0, 1], [2, 3]]
    r = sampling_distributions(clusters, w, 2, rng)
    assert sorted(map(tuple, r.tolist())) == [(0, 0, 0.5, 0.5), (0.5, 0.5, 0, 0)]
    for weights, m in [(np.array([5, 15, 10, 10]), 2), (np.array([50, 5, 3, 2]), 3), (np.array([1, 2, 3, 4]), 3)]:
        r = sampling_distributions(weight_clusters(z, weights, m), weights, m, rng)
        np.testing.assert_allclose(r.sum(1), 1.0)
        np.testing.assert_allclose(r.sum(0), m * weights / weights.sum())  # Σ_k r_{k,i} = m p_i


def test_clusamp_strategy_state_sampling_and_aggregation():
    w0 = {"a": np.zeros(2, F32), "b": np.zeros(1, F32)}
    s = make_strategy("clusamp", w0, num_clients=4, cohort=2)
    s.global_arrays = dict(w0)
    ups = {0: [0, 0, 1], 1: [0.1, 0, 1], 2: [5, 5, 1], 3: [5.1, 5, 1]}
    replies = [reply(p, {"a": u[:2], "b": u[2:]}, 10) for p, u in ups.items()]
    s.multiplicity = {}
    out = s.aggregate(1, replies)
    np.testing.assert_allclose(out["a"], [2.55, 2.5], rtol=1e-6)
    assert s.sizes.tolist() == [10, 10, 10, 10]
    np.testing.assert_allclose(s.dist[0], [0, 0.1, 10, 10.1], rtol=1e-6)  # L1 between g_i = w_i − w^t
    np.testing.assert_allclose(s.dist, s.dist.T)
    for rnd in range(2, 8):  # one client of each similarity group every round
        cohort = s.sample_cohort(rnd)
        assert len(cohort) == 2 and len({p // 2 for p in cohort}) == 2
        assert s.sample_cohort(rnd) == cohort  # deterministic in (seed, round, state)
    s2 = make_strategy("clusamp", w0, num_clients=4, cohort=2)
    s2.load_state_dict(s.state_dict())
    assert all(s2.draw(r) == s.draw(r) for r in range(2, 8))
    # a client drawn twice counts twice (data-size weights c_i n_i)
    s.multiplicity = {0: 2, 2: 1}
    out = s.aggregate(2, [replies[0], replies[2]])
    np.testing.assert_allclose(out["a"], (2 * np.array([0, 0]) + np.array([5, 5])) / 3, rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# CCVR
# ------------------------------------------------------------------------------------------------


def _stats_np(f: np.ndarray, y: np.ndarray, c: int) -> dict:
    counts = np.bincount(y, minlength=c)
    means = np.zeros((c, f.shape[1]))
    covs = np.zeros((c, f.shape[1], f.shape[1]))
    for k in range(c):
        if counts[k]:
            means[k] = f[y == k].mean(0)
        if counts[k] > 1:
            covs[k] = np.cov(f[y == k].T)
    return {"counts": counts, "means": means, "covs": covs}


def test_ccvr_client_feature_statistics_match_direct_computation():
    from clients.ccvr import CCVRClient

    task, cfg = make_task({"strategy": "ccvr"}, pid=1)
    stats = CCVRClient().statistics(task.model, task.data, cfg)
    for k, v in task.received.items():  # a statistics query trains nothing
        assert torch.equal(task.model.state_dict()[k], v)
    with torch.no_grad():
        task.model.eval()
        f = task.model.features(task.data.x.float()).double().numpy()
    ref = _stats_np(f, task.data.y.numpy(), 10)
    assert stats["counts"].tolist() == ref["counts"].tolist()
    np.testing.assert_allclose(stats["means"].numpy(), ref["means"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stats["covs"].numpy(), ref["covs"], rtol=1e-3, atol=1e-5)


def test_ccvr_merge_equals_pooled_statistics():
    from strategies.ccvr import merge_statistics

    rng = np.random.default_rng(1)
    f, y = rng.normal(size=(60, 3)), rng.integers(0, 3, 60)
    y[:3] = [0, 1, 2]
    parts = [slice(0, 25), slice(25, 60)]
    n, mu, sigma = merge_statistics([_stats_np(f[p], y[p], 3) for p in parts])
    ref = _stats_np(f, y, 3)
    assert n.tolist() == ref["counts"].tolist()
    np.testing.assert_allclose(mu, ref["means"], atol=1e-10)
    np.testing.assert_allclose(sigma, ref["covs"], atol=1e-10)


def test_ccvr_virtual_features_and_calibration_reduces_head_loss():
    from strategies.ccvr import calibrate_head, head_loss, sample_virtual

    n = np.array([5.0, 0.0, 8.0])
    mu = np.array([[1.0, -1.0], [0, 0], [-2.0, 3.0]])
    sigma = np.array([[[1.0, 0.5], [0.5, 2.0]], np.eye(2), [[0.3, 0.0], [0.0, 0.1]]])
    feats, labels = sample_virtual(n, mu, sigma, 20000, np.random.default_rng(0))
    assert feats.shape == (40000, 2) and feats.dtype == np.float32 and sorted(set(labels.tolist())) == [0, 2]
    for c in (0, 2):
        fc = feats[labels == c].astype(np.float64)
        np.testing.assert_allclose(fc.mean(0), mu[c], atol=0.05)
        np.testing.assert_allclose(np.cov(fc.T), sigma[c], atol=0.06)
    w, b = np.zeros((3, 2), F32), np.zeros(3, F32)
    w2, b2 = calibrate_head(w, b, feats[::20], labels[::20], epochs=3, lr=0.05, momentum=0.9, batch_size=64, seed=0)
    assert head_loss(w2, b2, feats, labels) < 0.5 * head_loss(w, b, feats, labels)


def test_ccvr_evaluation_arrays_and_state_round_trip():
    from clients.ccvr import feature_statistics

    s = make_strategy("ccvr", num_clients=4, cohort=2, **{"ccvr.virtual_per_class": 200, "ccvr.epochs": 2})
    task, _ = make_task({"strategy": "ccvr"}, pid=0)
    stats = {k: v.numpy() for k, v in feature_statistics(task.model, task.data, 10).items()}
    base = {k: v.detach().numpy().copy() for k, v in task.model.state_dict().items()}
    s.round_log = RoundLog()
    s.calibrate(2, base, [stats])
    ev = s.evaluation_arrays(base)
    assert not np.array_equal(ev["head.weight"], base["head.weight"])
    assert all(np.array_equal(ev[k], base[k]) for k in base if not k.startswith("head."))
    assert s.round_log.columns["ccvr_virtual_loss_after"] < s.round_log.columns["ccvr_virtual_loss_before"]
    other = {k: v + 1 for k, v in base.items()}
    assert all(np.array_equal(s.evaluation_arrays(other)[k], other[k]) for k in other)
    s2 = make_strategy("ccvr", num_clients=4, cohort=2)
    s2.load_state_dict(s.state_dict())
    for k in ("head.weight", "head.bias"):
        assert np.array_equal(s2.calibrated_head[k], s.calibrated_head[k])


# ------------------------------------------------------------------------------------------------
# FedGen
# ------------------------------------------------------------------------------------------------


def test_fedgen_losses_hand_computed():
    from strategies.fedgen import diversity_loss, label_weights, teacher_loss

    eps = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    out = torch.tensor([[0.0, 0.0, 0.0], [3.0, 0.0, 0.0]])
    # pairs (a≠b): noise 1, layer 1 -> mean over 4 pairs (2 of them zero) = 0.5
    assert diversity_loss(eps, out).item() == pytest.approx(math.exp(-0.5))
    w, q = label_weights(np.array([[3, 0, 1], [1, 0, 1]]))
    np.testing.assert_allclose(w.numpy(), [[0.75, 0.25], [0, 0], [0.5, 0.5]])
    assert q.tolist() == [0]  # only class 0 has a client with more than one sample
    feats, y = torch.tensor([[1.0, 0.0]]), torch.tensor([0])
    head = (torch.eye(2), torch.zeros(2))
    ce = math.log(1 + math.exp(-1.0))
    assert teacher_loss(feats, y, [head, head], torch.tensor([[0.75, 0.25], [0.5, 0.5]])).item() == pytest.approx(ce)


def test_fedgen_client_loss_and_label_counts():
    from clients.fedgen import FedGenClient, Generator, fedgen_regularizer

    task, _ = make_task({"strategy": "fedgen"}, pid=2)
    x, y = task.data.x[:32], task.data.y[:32]
    rule = FedGenClient()
    rule.start(task)
    assert torch.equal(rule.loss(task, x, y), F.cross_entropy(task.model(x), y))  # round 1: no generator, plain CE
    result = rule.finish(task)
    assert result.extras["label-counts"]["counts"].tolist() == torch.bincount(task.data.y, minlength=10).tolist()

    torch.manual_seed(3)
    gen = Generator(100, 10, int(task.model.head.in_features)).eval()
    state = {k: v.clone() for k, v in gen.state_dict().items()}
    conf = {"fedgen-alpha": 0.2, "fedgen-beta": 0.3, "fedgen-gen-batch": 16}
    task2, cfg = make_task({"strategy": "fedgen"}, pid=2, extras={"generator": state}, config=conf, seed=5)
    rule.start(task2)
    loss = rule.loss(task2, x, y)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        gen_y, _ = gen(y, generator=g)
        avail = torch.nonzero(torch.bincount(task2.data.y, minlength=10) > 0).flatten()
        y_s = avail[torch.randint(len(avail), (16,), generator=g)]
        gen_s, _ = gen(y_s, generator=g)
    z = task2.model(x)
    expected = F.cross_entropy(z, y) + fedgen_regularizer(task2.model.head, z, gen_y, gen_s, y_s, 0.2, 0.3, 16 / cfg.batch_size)
    torch.testing.assert_close(loss, expected)
    assert loss.item() != pytest.approx(F.cross_entropy(z, y).item())


def _teachers(strategy, k: int = 3):
    rng = np.random.default_rng(0)
    c, d = strategy.template["head.weight"].shape
    out = []
    for i in range(k):
        arrays = dict(strategy.template)
        arrays["head.weight"] = rng.normal(size=(c, d)).astype(F32)
        arrays["head.bias"] = rng.normal(size=c).astype(F32)
        counts = rng.integers(0, 50, size=c)
        out.append(reply(i, arrays, int(counts.sum()), {"label-counts": {"counts": counts}}))
    return out


def test_fedgen_generator_training_reduces_teacher_loss_and_state_round_trips():
    from strategies.fedgen import label_weights, teacher_loss

    s = make_strategy("fedgen", cohort=2, **{"fedgen.gen_lr": 1e-3, "fedgen.ensemble_epochs": 20})
    conf = s.train_config(3)
    assert conf["fedgen-alpha"] == pytest.approx(0.2 * 0.98**2) and conf["fedgen-gen-batch"] == 128
    assert "generator" not in s.client_payload(1, 0, to_record(s.template), ConfigRecord({})).array_records
    teachers = _teachers(s)
    heads = [(torch.from_numpy(r.arrays["head.weight"]), torch.from_numpy(r.arrays["head.bias"])) for r in teachers]
    weights, q = label_weights(np.stack([r.extras["label-counts"]["counts"] for r in teachers]))
    y = q[torch.randint(len(q), (256,), generator=torch.Generator().manual_seed(9))]
    eps = torch.rand(256, s.params.noise_dim, generator=torch.Generator().manual_seed(9))

    def fixed_loss(strategy) -> float:
        with torch.no_grad():
            strategy.generator.eval()
            return teacher_loss(strategy.generator(y, eps)[0], y, heads, weights).item()

    before = fixed_loss(s)
    s.round_log = RoundLog()
    new = s.aggregate(1, teachers)
    assert s.trained_rounds == 1 and fixed_loss(s) < before
    np.testing.assert_allclose(new["head.bias"], sum(r.num_examples * r.arrays["head.bias"] for r in teachers)
                               / sum(r.num_examples for r in teachers), rtol=1e-5)
    payload = s.client_payload(2, 0, to_record(s.template), ConfigRecord({}))
    assert set(payload["generator"].keys()) == set(s.generator.state_dict())

    s2 = make_strategy("fedgen", cohort=2, **{"fedgen.gen_lr": 1e-3, "fedgen.ensemble_epochs": 20})
    s2.load_state_dict(s.state_dict())
    assert_same_arrays(s2.generator_arrays(), s.generator_arrays())
    s.train_generator(teachers, 2)
    s2.train_generator(teachers, 2)  # same Adam moments -> same next generator
    assert_same_arrays(s2.generator_arrays(), s.generator_arrays())


# ------------------------------------------------------------------------------------------------
# real simulations: equal-size label-skewed clients, full participation, 2 rounds
# ------------------------------------------------------------------------------------------------

SIM = {"partitioner": "dirichlet-equal", "alpha": 0.1, "num_clients": 10, "clients_per_round": 10, "rounds": 2}


def _same_rounds(a, b):
    assert_same_arrays(a.arrays, b.arrays)
    for ra, rb in zip(a.rows, b.rows):
        assert ra["test_accuracy"] == rb["test_accuracy"] and ra.get("cohort") == rb.get("cohort")
        assert ra.get("train_loss") == rb.get("train_loss")


def test_fedrs_alpha1_is_fedavg(simulate):
    _same_rounds(simulate(strategy="fedrs", **SIM, **{"fedrs.alpha": 1.0}), simulate(strategy="fedavg", **SIM))


def test_fedlc_tau0_is_fedavg(simulate):
    _same_rounds(simulate(strategy="fedlc", **SIM, **{"fedlc.tau": 0.0}), simulate(strategy="fedavg", **SIM))


def test_clusamp_singleton_clusters_is_fedavg(simulate):
    clu = simulate(strategy="clusamp", **SIM)
    _same_rounds(clu, simulate(strategy="fedavg", **SIM))
    assert all(sorted(r["clusamp_draws"]) == list(range(10)) for r in clu.rows[1:])
    assert clu.checkpoint["strategy"]["method"]["dist"].shape == (10, 10) and clu.checkpoint["strategy"]["method"]["dist"].max() > 0


def test_ccvr_trains_as_fedavg_and_evaluates_calibrated_head(simulate):
    ccvr, avg = simulate(strategy="ccvr", **SIM), simulate(strategy="fedavg", **SIM)
    assert_same_arrays(ccvr.arrays, avg.arrays)  # calibration never reaches the training path
    assert ccvr.rows[1]["test_accuracy"] == avg.rows[1]["test_accuracy"]  # round 1 is not calibrated
    last = ccvr.rows[2]
    assert last["ccvr_stats_clients"] == 10
    assert last["ccvr_virtual_loss_after"] < last["ccvr_virtual_loss_before"]
    assert last["test_accuracy"] != avg.rows[2]["test_accuracy"]  # the evaluated model has the calibrated head
    assert set(ccvr.checkpoint["strategy"]["method"]["calibrated_head"]) == {"head.weight", "head.bias"}
