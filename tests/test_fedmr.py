"""FedMR, FedMut, Indep, IndepAggr (spec fedmr.md §8).

Order: pure recombination / mutation maths, then the server rules driven through the round's
protocol (``configure_round``/``aggregate_round``) with hand-built replies by partition id (no
training), then real Flower simulations (5 distinct configs, shared via the cache).
"""

from __future__ import annotations

import math
import tomllib

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord, RecordDict

from fedsuite.method.arrays import uniform_mean
from fedsuite.config import build_config
from fedsuite.method.replies import Reply
from fedsuite.method.wire import CHECKSUM_REQUEST, record_checksum, to_ndarrays, to_record
from strategies.fedmr import draw_permutations, make_units, recombine, segment_ids
from strategies.fedmut import mutate, mutation_beta, mutation_coefficients
from tests.conftest import FAST, assert_same_arrays, make_strategy


#: the methods' maths, not how messages travel: the in-process engine (``simulate``, tests/conftest.py)
pytestmark = pytest.mark.inprocess

# a small "model" with a conv, a BatchNorm (incl. its integer buffer) and a head, in state_dict order
SHAPES = {
    "conv.weight": (4, 3, 3, 3),
    "conv.bias": (4,),
    "bn1.weight": (4,),
    "bn1.bias": (4,),
    "bn1.running_mean": (4,),
    "bn1.running_var": (4,),
    "bn1.num_batches_tracked": (),
    "head.weight": (10, 4),
    "head.bias": (10,),
}


def random_model(rng: np.random.Generator, shapes=SHAPES) -> dict[str, np.ndarray]:
    out = {}
    for k, s in shapes.items():
        if k.endswith("num_batches_tracked"):
            out[k] = np.array(rng.integers(0, 1000), dtype=np.int64)
        else:
            out[k] = rng.normal(size=s).astype(np.float32)
    return out


def random_pool(k: int, seed: int = 0, shapes=SHAPES) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [random_model(rng, shapes) for _ in range(k)]


# ================================================================================================
# 1. recombination: pure functions
# ================================================================================================


@pytest.mark.parametrize("granularity", ["tensor", "module"])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 12])
def test_recombine_is_a_permutation_per_unit_and_keeps_lemma_4_4(granularity, k):
    """§8.1 items 1-3: each new tensor is one source tensor (identity, no arithmetic); every uploaded
    unit lands in exactly one new model; Σ_i new_i = Σ_i old_i and Σ_i ||new_i − x||² is unchanged."""
    pool = random_pool(k, seed=k)
    units = make_units(list(SHAPES), granularity)
    perms = draw_permutations(np.random.default_rng(k), len(units), k)
    new = recombine(pool, units, perms)
    assert len(new) == k and all(list(m) == list(SHAPES) for m in new)
    for unit in units:
        for key in unit:
            sources = [next(s for s in range(k) if new[i][key] is pool[s][key]) for i in range(k)]
            assert sorted(sources) == list(range(k))  # each source used exactly once
    x = random_model(np.random.default_rng(99))
    for key in SHAPES:
        old_stack = np.stack([m[key] for m in pool]).astype(np.float64)
        new_stack = np.stack([m[key] for m in new]).astype(np.float64)
        assert np.array_equal(np.sort(old_stack, axis=0), np.sort(new_stack, axis=0))  # multiset, exact
        np.testing.assert_allclose(new_stack.sum(0), old_stack.sum(0), rtol=1e-12, atol=1e-12)
    dist = lambda models: sum(float(np.sum((m[k_].astype(np.float64) - x[k_]) ** 2)) for m in models for k_ in SHAPES)
    assert dist(new) == pytest.approx(dist(pool), rel=1e-12)
    old_mean, new_mean = uniform_mean(pool, pool[0]), uniform_mean(new, pool[0])
    assert_same_arrays(old_mean, new_mean, exact=False)


def test_recombine_closed_form_k2():
    """§8.1 item 4: K = 2, units A=[a1,a2,a3], B=[b1,b2,b3], π = [(1,0),(0,1),(1,0)]."""
    a = {"l1": np.array([1.0]), "l2": np.array([2.0]), "l3": np.array([3.0])}
    b = {"l1": np.array([10.0]), "l2": np.array([20.0]), "l3": np.array([30.0])}
    perms = np.array([[1, 0], [0, 1], [1, 0]])
    new0, new1 = recombine([a, b], make_units(list(a)), perms)
    assert new0 == {"l1": b["l1"], "l2": a["l2"], "l3": b["l3"]}
    assert new1 == {"l1": a["l1"], "l2": b["l2"], "l3": a["l3"]}
    assert new0["l1"] is b["l1"] and new1["l2"] is b["l2"]


def test_recombine_k1_is_identity_and_identical_pool_stays_identical():
    """§8.1 item 5."""
    (model,) = random_pool(1)
    units = make_units(list(SHAPES))
    (out,) = recombine([model], units, draw_permutations(np.random.default_rng(0), len(units), 1))
    assert all(out[k] is model[k] for k in SHAPES)
    same = [model] * 6
    for m in recombine(same, units, draw_permutations(np.random.default_rng(1), len(units), 6)):
        assert_same_arrays(m, model)


def test_module_granularity_keeps_a_module_together_tensor_does_not():
    """§8.1 item 6: in "module" mode all bn1.* entries come from one source; in "tensor" mode two
    entries of one module come from the same source with probability ≈ 1/K."""
    k = 5
    pool = random_pool(k)
    units_m = make_units(list(SHAPES), "module")
    assert units_m == [["conv.weight", "conv.bias"],
                       ["bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"],
                       ["head.weight", "head.bias"]]
    src = lambda new, i, key: next(s for s in range(k) if new[i][key] is pool[s][key])
    rng = np.random.default_rng(3)
    for _ in range(20):
        new = recombine(pool, units_m, draw_permutations(rng, len(units_m), k))
        for i in range(k):
            for unit in units_m:
                assert len({src(new, i, key) for key in unit}) == 1
    units_t = make_units(list(SHAPES), "tensor")
    same, trials = 0, 2000
    for _ in range(trials):
        new = recombine(pool, units_t, draw_permutations(rng, len(units_t), k))
        same += src(new, 0, "bn1.weight") == src(new, 0, "bn1.running_var")
    assert abs(same / trials - 1 / k) < 0.03


def test_permutations_are_uniform_and_independent():
    """§8.1 item 7: over 20 000 draws (K = 10) P(new slot i takes unit from old slot s) ≈ 1/K
    (chi-square, 81 dof: 99.9% quantile ≈ 126) and two units' draws co-occur with ≈ 1/K²."""
    k, n = 10, 20000
    perms = draw_permutations(np.random.default_rng(2024), 2 * n, k)  # rows 2t, 2t+1: two units of draw t
    counts = np.zeros((k, k))
    for i in range(k):
        counts[i] = np.bincount(perms[0::2, i], minlength=k)
    expected = n / k
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 126, chi2
    both = np.mean((perms[0::2, 0] == 0) & (perms[1::2, 0] == 0))
    assert abs(both - 1 / k**2) < 0.004
    assert all(sorted(row) == list(range(k)) for row in perms[:100].tolist())


@pytest.mark.parametrize("n,x", [(9, 0.5), (9, 0.25), (10, 0.1), (10, 0.3), (119, 0.1), (97, 1 / 3), (10, 0.7), (119, 0.15)])
def test_segments_count_contiguity_and_shared_source(n, x):
    """§8.1 item 8, A24: ⌈1/x⌉ contiguous segments (unit j in ⌈j/(x·n)⌉); one source slot per segment."""
    seg = segment_ids(n, x)
    assert seg[0] == 0 and np.all(np.diff(seg) >= 0) and np.all(np.diff(seg) <= 1)
    assert seg.max() + 1 == math.ceil(round(1 / x, 9))
    j = np.arange(1, n + 1)
    assert np.array_equal(seg, np.ceil(j / (x * n) - 1e-9).astype(int) - 1)
    k = 4
    shapes = {f"u{i}": (3,) for i in range(n)}
    pool = random_pool(k, shapes=shapes)
    units = make_units(list(shapes))
    new = recombine(pool, units, draw_permutations(np.random.default_rng(n), n, k, seg))
    for i in range(k):
        for s in range(seg.max() + 1):
            keys = [f"u{u}" for u in np.flatnonzero(seg == s)]
            assert len({next(t for t in range(k) if new[i][key] is pool[t][key]) for key in keys}) == 1


def test_segment_extremes():
    """x = 1.0 shuffles whole models (Indep): every new model is exactly one old model; x ≤ 1/n or
    x = 0 is unit-wise recombination."""
    assert np.array_equal(segment_ids(12, 1.0), np.zeros(12, dtype=int))
    assert np.array_equal(segment_ids(12, 0.0), np.arange(12))
    assert np.array_equal(segment_ids(12, 1 / 12), np.arange(12))
    assert np.array_equal(segment_ids(12, 0.05), np.arange(12))
    k = 6
    pool = random_pool(k)
    units = make_units(list(SHAPES))
    new = recombine(pool, units, draw_permutations(np.random.default_rng(5), len(units), k, segment_ids(len(units), 1.0)))
    for m in new:
        assert sum(all(m[key] is old[key] for key in SHAPES) for old in pool) == 1


def test_dtypes_preserved_and_mean_casts_integer_buffers():
    """§8.1 item 9, A22."""
    pool = random_pool(3)
    pool[0]["bn1.num_batches_tracked"] = np.array(1, dtype=np.int64)
    pool[1]["bn1.num_batches_tracked"] = np.array(2, dtype=np.int64)
    pool[2]["bn1.num_batches_tracked"] = np.array(4, dtype=np.int64)
    units = make_units(list(SHAPES))
    for m in recombine(pool, units, draw_permutations(np.random.default_rng(0), len(units), 3)):
        assert {k: v.dtype for k, v in m.items()} == {k: v.dtype for k, v in pool[0].items()}
    mean = uniform_mean(pool, pool[0])
    assert mean["bn1.num_batches_tracked"].dtype == np.int64 and int(mean["bn1.num_batches_tracked"]) == 2
    assert mean["conv.weight"].dtype == np.float32


# ================================================================================================
# 2. FedMut maths
# ================================================================================================


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7, 10])
@pytest.mark.parametrize("beta", [0.0, 0.3])
def test_fedmut_coefficient_counts(k, beta):
    """§8.3 item 20: per unit exactly ⌊K/2⌋ models get +αΔ and ⌊K/2⌋ get (−1+β)αΔ; odd K: one gets w_glb."""
    c = mutation_coefficients(np.random.default_rng(k), 50, k, beta)
    for row in c:
        assert np.sum(row == 1.0) == k // 2
        assert np.sum(row == -1.0 + beta) == k // 2
        assert np.sum(row == 0.0) == k % 2
        if k % 2:
            assert row[-1] == 0.0
    if k >= 4:  # positions vary between units
        assert len({tuple(r) for r in c.tolist()}) > 1


def test_fedmut_pool_mean_and_zero_delta():
    """β_r = 0: mean of the mutated pool = w_glb (any K); Δ = 0: every model equals w_glb bit for bit;
    β_r > 0: mean = w_glb + α β ⌊K/2⌋/K · Δ."""
    rng = np.random.default_rng(1)
    w_glb, w_old = random_model(rng), random_model(rng)
    delta = {k: w_glb[k].astype(np.float64) - w_old[k] for k in SHAPES if not k.endswith("tracked")}
    for k in (2, 5, 10):
        pool = mutate(w_glb, delta, mutation_coefficients(rng, len(SHAPES), k, 0.0), 5.0)
        mean = uniform_mean(pool, w_glb)
        assert_same_arrays(mean, w_glb, exact=False)
        assert all(m["bn1.num_batches_tracked"] is w_glb["bn1.num_batches_tracked"] for m in pool)
        beta = 0.3
        pool = mutate(w_glb, delta, mutation_coefficients(rng, len(SHAPES), k, beta), 5.0)
        for key, d in delta.items():
            got = np.mean([m[key].astype(np.float64) for m in pool], axis=0)
            np.testing.assert_allclose(got, w_glb[key] + 5.0 * beta * (k // 2) / k * d, rtol=1e-5, atol=1e-5)
        zero = {key: np.zeros_like(d) for key, d in delta.items()}
        for m in mutate(w_glb, zero, mutation_coefficients(rng, len(SHAPES), k, beta), 5.0):
            assert_same_arrays(m, w_glb)


def test_fedmut_beta_schedule():
    assert mutation_beta(1, 0.3, 100) == pytest.approx(0.3)
    assert mutation_beta(51, 0.3, 100) == pytest.approx(0.15)
    assert mutation_beta(101, 0.3, 100) == 0.0 and mutation_beta(500, 0.3, 100) == 0.0
    assert mutation_beta(1, 0.3, 0) == 0.0


# ================================================================================================
# 3. server rules with hand-built messages (no training)
# ================================================================================================

NUM_CLIENTS, K = 10, 4


#: the server rules below (conftest's ``make_strategy``): NUM_CLIENTS partitions, a cohort of K,
#: w^0 the small model of :data:`SHAPES`
POOL = {"initial": random_model(np.random.default_rng(1000)), "num_clients": NUM_CLIENTS, "cohort": K}


def fake_train(received: dict[str, np.ndarray], pid: int, server_round: int) -> dict[str, np.ndarray]:
    """A deterministic stand-in for local training: distinct per client and round."""
    out = {}
    for k, v in received.items():
        if np.issubdtype(v.dtype, np.integer):
            out[k] = v + 10
        else:
            shift = np.sin(np.arange(v.size, dtype=np.float32).reshape(v.shape) + pid * 1.3 + server_round * 0.7)
            out[k] = (v * 0.9 + 0.1 * shift).astype(v.dtype)
    return out


def reply_to(pid: int, content: RecordDict, arrays: dict[str, np.ndarray], n: int,
             checksum: int | None = None) -> Reply:
    """Partition ``pid``'s reply to the ``content`` it was sent: ``arrays``, ``n`` examples and the
    checksum of what it received (or ``checksum``)."""
    metrics = {"num-examples": n, "train-loss": 1.0, "num-steps": 3.0, "partition-id": pid,
               "received-checksum": record_checksum(content["arrays"]) if checksum is None else checksum}
    return Reply(RecordDict({"arrays": to_record(arrays), "metrics": MetricRecord(metrics)}))


def configure(strategy, server_round: int) -> dict[int, RecordDict]:
    """configure_round from the strategy's w^t: {partition id: the content sent to it}."""
    return strategy.configure_round(server_round, strategy.global_arrays)


def play_round(strategy, server_round: int, drop: set[int] = frozenset(), shuffle: int | None = None, sizes=None):
    """configure_round -> fake clients -> aggregate_round. Returns (sent {pid: (slot, arrays)},
    uploaded {pid: arrays}, returned global)."""
    contents = configure(strategy, server_round)
    sent, uploaded, replies = {}, {}, {}
    for pid, content in contents.items():
        received = to_ndarrays(content["arrays"])
        sent[pid] = (int(content["config"]["slot"]), received)
        if pid in drop:
            continue
        uploaded[pid] = fake_train(received, pid, server_round)
        replies[pid] = reply_to(pid, content, uploaded[pid], (sizes or {}).get(pid, 10 + pid))
    if shuffle is not None:
        order = list(replies)
        replies = {order[i]: replies[order[i]] for i in np.random.default_rng(shuffle).permutation(len(order))}
    arrays, _ = strategy.aggregate_round(server_round, replies)
    return sent, uploaded, arrays


def payloads_identical(sent) -> bool:
    first = next(iter(sent.values()))[1]
    return all(all(np.array_equal(a[k], first[k]) for k in first) for _, a in sent.values())


def payloads_pairwise_distinct(sent) -> bool:
    arrs = [a for _, a in sent.values()]
    return all(not all(np.array_equal(arrs[i][k], arrs[j][k]) for k in SHAPES)
               for i in range(len(arrs)) for j in range(i + 1, len(arrs)))


def test_payload_diversity_and_slots():
    """§8.2 item 10: R1 = 0: round 1 sends K identical payloads (copies of w^0) with slots 0..K-1;
    from round 2 on the payloads differ pairwise; each client gets exactly its slot's pool model."""
    s = make_strategy("fedmr", **POOL)
    sent, _, _ = play_round(s, 1)
    assert sorted(slot for slot, _ in sent.values()) == list(range(K))
    assert payloads_identical(sent) and all(np.array_equal(a["head.weight"], s.template["head.weight"]) for _, a in sent.values())
    pool_before = list(s.pool)
    sent, _, _ = play_round(s, 2)
    assert sorted(slot for slot, _ in sent.values()) == list(range(K))
    assert payloads_pairwise_distinct(sent)
    for slot, arrays in sent.values():
        assert_same_arrays(arrays, pool_before[slot])


def test_stage_boundary_round_arithmetic():
    """§8.2 item 11, A4: R1 = 3: rounds 1..4 dispatch identical payloads, round 5 is the first with
    different ones; after rounds ≤ 3 every pool entry equals the returned (uniform-mean) global."""
    s = make_strategy("fedmr", **POOL, **{"fedmr.first_stage_rounds": 3})
    for r in range(1, 6):
        sent, uploaded, glob = play_round(s, r)
        if r <= 4:
            assert payloads_identical(sent), r
        else:
            assert payloads_pairwise_distinct(sent)
        if r <= 3:
            assert s.round_log.columns["stage"] == 1
            assert all(m is s.pool[0] for m in s.pool)
            assert_same_arrays(s.pool[0], glob)
            assert_same_arrays(glob, uniform_mean([uploaded[p] for p in sorted(uploaded)], s.template))  # uniform, A5
        else:
            assert s.round_log.columns["stage"] == 2


def test_stage1_weighting_num_examples_is_fedavg_mean():
    s = make_strategy("fedmr", **POOL, **{"fedmr.first_stage_rounds": 2, "fedmr.stage1_weighting": "num_examples"})
    sizes = {p: 5 + 7 * p for p in range(NUM_CLIENTS)}
    _, uploaded, glob = play_round(s, 1, sizes=sizes)
    from fedsuite.method.arrays import weighted_mean

    pids = sorted(uploaded)
    assert_same_arrays(glob, weighted_mean([uploaded[p] for p in pids], [sizes[p] for p in pids], s.template))
    assert all(m is s.pool[0] for m in s.pool)


def test_reordered_replies_give_the_same_pool():
    """§8.2 item 12: replies map to slots by partition id, so their order does not matter."""
    a, b = make_strategy("fedmr", **POOL), make_strategy("fedmr", **POOL)
    for r in (1, 2, 3):
        _, _, ga = play_round(a, r)
        _, _, gb = play_round(b, r, shuffle=r)
        assert_same_arrays(ga, gb)
        for ma, mb in zip(a.pool, b.pool):
            assert_same_arrays(ma, mb)


def test_failed_slot_keeps_dispatched_model():
    """§8.2 item 13, A21: a slot without reply keeps the model it was sent; the pool keeps size K and
    the global is the uniform mean over all K slots, the failed one included."""
    s = make_strategy("fedmr", **POOL)
    play_round(s, 1)
    cohort = s.sample_cohort(2)
    lost = cohort[1]
    sent, uploaded, glob = play_round(s, 2, drop={lost})
    assert len(s.pool) == K and s.round_log.columns["failed_slots"] == [sent[lost][0]]
    slots = [None] * K
    for pid, (slot, arrays) in sent.items():
        slots[slot] = uploaded.get(pid, arrays)
    assert_same_arrays(glob, uniform_mean(slots, s.template))
    # Indep does not recombine: the failed slot literally still holds what it was sent
    ind = make_strategy("indep", **POOL)
    play_round(ind, 1)
    sent, uploaded, _ = play_round(ind, 2, drop={lost})
    for pid, (slot, arrays) in sent.items():
        assert_same_arrays(ind.pool[slot], uploaded.get(pid, arrays))


def test_global_is_mean_of_pool_before_and_after_recombination():
    """§8.2 item 14 / Lemma 4.4: the returned global = uniform mean of the uploaded pool = mean of
    the recombined pool; integer buffers are cast back."""
    s = make_strategy("fedmr", **POOL)
    for r in (1, 2, 3):
        sent, uploaded, glob = play_round(s, r)
        by_slot = [uploaded[pid] for pid, _ in sorted(sent.items(), key=lambda kv: kv[1][0])]
        assert_same_arrays(glob, uniform_mean(by_slot, s.template))
        assert_same_arrays(glob, uniform_mean(s.pool, s.template), exact=False)
        assert glob["bn1.num_batches_tracked"].dtype == np.int64


def test_bytes_per_round_equal_fedavg():
    """§8.2 item 15: K model downloads and K uploads per round, like FedAvg."""
    s = make_strategy("fedmr", **POOL)
    model_bytes = sum(len(a.data) for a in to_record(s.template).values())
    for r in (1, 2):
        play_round(s, r)
        assert s.round_log.bytes_sent == K * model_bytes
        assert s.round_log.bytes_received == K * model_bytes


def test_checksum_mismatch_is_detected():
    """Every payload asks for the client's checksum; a wrong one is a mismatch, and a reply without
    one (a declared record of the pool methods, ``POOL_RECORDS``) is a failed reply naming it."""
    s = make_strategy("fedmr", **POOL)
    contents = configure(s, 1)
    assert all(c["config"][CHECKSUM_REQUEST] is True for c in contents.values())
    replies = {pid: reply_to(pid, c, fake_train(to_ndarrays(c["arrays"]), 0, 1), 10, checksum=(12345 if i == 0 else None))
               for i, (pid, c) in enumerate(contents.items())}
    ignored = list(replies)[1]
    del replies[ignored].content["metrics"]["received-checksum"]  # a client that ignored the request
    s.aggregate_round(1, replies)
    assert s.round_log.columns["checksum_mismatches"] == 1
    assert s.round_log.drop_reasons == {ignored: "metrics lack 'received-checksum'"}
    assert len(set(s.round_log.columns["payload_checksums"])) == 1


def test_state_dict_round_trip_resumes_exactly(tmp_path):
    """Pool + per-round seeded draws: a strategy restored from a checkpoint after round 2 plays
    rounds 3-4 exactly like the uninterrupted one (also for FedMut's w_old)."""
    for name, params in (("fedmr", {"fedmr.first_stage_rounds": 1}), ("fedmut", {})):
        a = make_strategy(name, **POOL, **params)
        for r in (1, 2):
            play_round(a, r)
        torch.save({"strategy": a.state_dict(), "arrays": a.global_arrays}, tmp_path / f"{name}.pt")
        ckpt = torch.load(tmp_path / f"{name}.pt", weights_only=False)
        b = make_strategy(name, **POOL, **params)
        b.load_state_dict(ckpt["strategy"])
        b.global_arrays = ckpt["arrays"]
        for r in (3, 4):
            sa, _, ga = play_round(a, r)
            sb, _, gb = play_round(b, r)
            assert {p: v[0] for p, v in sa.items()} == {p: v[0] for p, v in sb.items()}
            for p in sa:
                assert_same_arrays(sa[p][1], sb[p][1])
            assert_same_arrays(ga, gb)


def test_seed_changes_permutations_and_slot_deal():
    a, b = make_strategy("fedmr", **POOL, seed=1), make_strategy("fedmr", **POOL, seed=2)
    assert a.assign_slots(5, a.sample_cohort(5)) != b.assign_slots(5, b.sample_cohort(5)) or a.sample_cohort(5) != b.sample_cohort(5)


def test_no_training_keeps_every_pool_model_at_w0():
    """§8.3 item 18 (lr = 0): clients return what they received, so every payload, pool model and
    global stays w^0 in both stages."""
    s = make_strategy("fedmr", **POOL, **{"fedmr.first_stage_rounds": 1})
    for r in (1, 2, 3):
        contents = configure(s, r)
        for c in contents.values():
            assert_same_arrays(to_ndarrays(c["arrays"]), s.template)
        replies = {pid: reply_to(pid, c, to_ndarrays(c["arrays"]), 10) for pid, c in contents.items()}
        glob, _ = s.aggregate_round(r, replies)
        assert_same_arrays(glob, s.template)
        for model in s.pool:
            assert_same_arrays(model, s.template)


def test_experiment_configs_load():
    """experiments/fedmr/*.toml (the run configs; tables.toml and claims-*.toml are ``fedsuite
    reproduce``'s targets) are valid RunConfigs with Table 1's settings (spec §4)."""
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "experiments" / "fedmr"
    files = sorted(f for f in folder.glob("*.toml") if "targets" not in tomllib.loads(f.read_text()))
    assert len(files) == 10
    for f in files:
        cfg = build_config(f)
        assert cfg.strategy == "fedmr" and cfg.lr == 0.01 and cfg.momentum == 0.9 and cfg.batch_size == 50
        if f.name == "cpu_fmnist.toml":
            assert (cfg.dataset, cfg.alpha, cfg.num_clients, cfg.cohort_size) == ("fmnist", 0.1, 100, 10)
            continue
        assert cfg.rounds == 500 and cfg.local_epochs == 5 and cfg.eval_every == 10
        assert cfg.fedmr.first_stage_rounds == (0 if cfg.model == "cnn" else 100)
        assert cfg.cohort_size == (18 if cfg.dataset == "femnist" else 10)
        if cfg.dataset == "cifar100":
            assert cfg.dataset_options["label_mode"] == "coarse"


def test_fedmr_p1_is_indep_like():
    """§8.3 item 19: with segment_fraction = 1.0 every dispatched model is bit-identical to one
    model uploaded in the previous round."""
    s = make_strategy("fedmr", **POOL, **{"fedmr.segment_fraction": 1.0})
    _, uploaded, _ = play_round(s, 1)
    sent, _, _ = play_round(s, 2)
    for _, arrays in sent.values():
        assert sum(all(np.array_equal(arrays[k], up[k]) for k in SHAPES) for up in uploaded.values()) == 1


def test_indep_and_indep_aggr_share_the_pool():
    """Indep keeps slot lineages (slot i is re-sent exactly what it uploaded) and reports slot
    ``eval_slot``; IndepAggr trains the identical pool and reports its uniform mean."""
    ind, agg = make_strategy("indep", **POOL, **{"indep.eval_slot": 2}), make_strategy("indep-aggr", **POOL)
    prev = None
    for r in (1, 2, 3):
        sent_i, up_i, gi = play_round(ind, r)
        sent_a, _, ga = play_round(agg, r)
        if prev is not None:
            for pid, (slot, arrays) in sent_i.items():
                assert_same_arrays(arrays, prev[slot])
        prev = list(ind.pool)
        for mi, ma in zip(ind.pool, agg.pool):
            assert_same_arrays(mi, ma)
        assert_same_arrays(gi, ind.pool[2])
        assert_same_arrays(ga, uniform_mean(agg.pool, agg.template))
    with pytest.raises(ValueError, match="eval_slot"):
        make_strategy("indep", **POOL, **{"indep.eval_slot": K})


def test_fedmut_strategy_round():
    """FedMut: the returned global is the uniform mean of the uploads; the next pool is
    w_glb + α c Δ with Δ = w_glb − w_old; after T_mut rounds (β = 0) its mean is w_glb."""
    s = make_strategy("fedmut", **POOL, **{"fedmut.mut_bound": 1})
    w0 = s.template
    sent, uploaded, glob = play_round(s, 1)
    assert payloads_identical(sent)
    assert_same_arrays(glob, uniform_mean([uploaded[p] for p in sorted(uploaded)], w0))
    beta = 0.3
    assert s.round_log.columns["mutation_beta"] == pytest.approx(beta)
    for key in SHAPES:
        if key.endswith("tracked"):
            continue
        delta = glob[key].astype(np.float64) - w0[key]
        vals = sorted({round(float(((m[key].astype(np.float64) - glob[key]) / 5.0 / delta).flat[0]), 4) for m in s.pool})
        assert vals == [round(-1 + beta, 4), 1.0]
    sent, _, glob2 = play_round(s, 2)
    assert payloads_pairwise_distinct(sent) and s.round_log.columns["mutation_beta"] == 0.0
    assert_same_arrays(uniform_mean(s.pool, w0), glob2, exact=False)


def test_fedmut_radius_zero_is_uniform_aggregation():
    """α = 0: every mutated model is w_glb, so FedMut is FedMR's stage 1 (uniform FedAvg) round for round."""
    mut = make_strategy("fedmut", **POOL, **{"fedmut.radius": 0.0})
    mr = make_strategy("fedmr", **POOL, **{"fedmr.first_stage_rounds": 10})
    for r in (1, 2, 3):
        sm, _, gm = play_round(mut, r)
        sr, _, gr = play_round(mr, r)
        assert_same_arrays(gm, gr)
        for p in sm:
            assert_same_arrays(sm[p][1], sr[p][1])
        for model in mut.pool:
            assert_same_arrays(model, gm)


# ================================================================================================
# 4. real Flower simulations (5 configs: fedavg, fedmr, fedmr again, fedmr stage-1, fedmut)
# ================================================================================================


def _check_per_client_models(res, stage2_from: int):
    for row in res.rows[1:]:
        assert row["checksum_mismatches"] == 0 and row["failed_slots"] == []
        crcs = row["payload_checksums"]
        assert len(crcs) == FAST["clients_per_round"] and None not in crcs
        if row["round"] < stage2_from:
            assert len(set(crcs)) == 1, row
        else:
            assert len(set(crcs)) == len(crcs), row


def test_sim_fedmr_clients_train_the_model_built_for_them(simulate):
    """(a) Every client reports the CRC of what it received; the server finds zero mismatches; round
    1 payloads are K copies of w^0 and round 2's are K different recombined models; the final global
    is the mean of the checkpointed pool."""
    res = simulate(strategy="fedmr")
    _check_per_client_models(res, stage2_from=2)
    assert [r["stage"] for r in res.rows[1:]] == [2, 2]
    pool = res.checkpoint["strategy"]["method"]["pool"]
    assert len(pool) == FAST["clients_per_round"]
    assert_same_arrays(res.arrays, uniform_mean(pool, res.arrays), exact=False)
    assert res.summary and res.rows[-1]["test_accuracy"] is not None


def test_sim_fedmut_clients_train_the_model_built_for_them(simulate):
    res = simulate(strategy="fedmut")
    _check_per_client_models(res, stage2_from=2)
    assert res.rows[1]["mutation_beta"] == pytest.approx(0.3)


def test_sim_fedmr_stage1_only_is_fedavg_bit_for_bit(simulate):
    """(b) spec §8.3 item 17: with R1 ≥ rounds and data-size weights FedMR is FedAvg exactly (same
    cohorts, client seeds, weights and summation order) on a Dirichlet (unequal-size) partition."""
    mr = simulate(strategy="fedmr", **{"fedmr.first_stage_rounds": 2, "fedmr.stage1_weighting": "num_examples"})
    avg = simulate(strategy="fedavg")
    _check_per_client_models(mr, stage2_from=99)
    assert_same_arrays(mr.arrays, avg.arrays)
    for a, b in zip(mr.rows, avg.rows):
        assert a["test_accuracy"] == b["test_accuracy"] and a["test_loss"] == b["test_loss"]
        assert a.get("cohort") == b.get("cohort")


def test_sim_fedmr_diagnostics_row_and_figures(simulate, tmp_path):
    """(d) ``fedmr.diagnostics=true`` in a real run: each round's row has the pool mean's test accuracy
    and loss equal to those the ServerApp measured for the evaluated global model, K per-model
    accuracies (trained and sent next), K movements, one distance per state_dict entry; the run
    directory has diagnostics.png and ``fedsuite report`` writes one for the run."""
    from typer.testing import CliRunner

    from fedsuite.cli.main import app

    res = simulate(strategy="fedmr", **{"fedmr.diagnostics": True})
    k = FAST["clients_per_round"]
    assert len(res.rows) == FAST["rounds"] + 1
    for row in res.rows[1:]:
        assert row["pool_mean_accuracy"] == row["test_accuracy"] and row["pool_mean_loss"] == row["test_loss"]
        assert len(row["pool_accuracy"]) == len(row["pool_loss"]) == len(row["next_accuracy"]) == k
        assert len(row["client_movement"]) == k and all(m > 0 for m in row["client_movement"])
        assert set(row["pool_layer_distance"]) == set(res.arrays) and row["pool_distance"] > 0
        assert sorted(row["slot_clients"]) == row["cohort"]
    png = b"\x89PNG"
    assert (res.run_dir / "diagnostics.png").read_bytes()[:4] == png
    out = CliRunner().invoke(app, ["report", str(res.run_dir), "--output-dir", str(tmp_path)])
    assert out.exit_code == 0, out.stdout
    assert (tmp_path / f"diagnostics-{res.run_dir.name}.png").read_bytes()[:4] == png


def test_sim_fedmr_seeded_runs_identical(simulate):
    """(c) Same seed, separate run: identical metrics, global model and pool."""
    a = simulate(strategy="fedmr")
    b = simulate(strategy="fedmr", run_name="fedmr-again")
    assert a.run_dir != b.run_dir
    assert a.metrics_without_time() == b.metrics_without_time()
    assert_same_arrays(a.arrays, b.arrays)
    for ma, mb in zip(a.checkpoint["strategy"]["method"]["pool"], b.checkpoint["strategy"]["method"]["pool"]):
        assert_same_arrays(ma, mb)


@pytest.mark.parametrize("name", ["fedmr", "fedmut", "indep"])
def test_pool_methods_keep_neuron_lr_diagnostics(name):
    """A pool method with ``--neuron-lr`` writes both its own columns (checksums, slots) and the
    plug-in's cohort means of the clients' ``nlr-*`` metrics into the round's metrics row."""
    s = make_strategy(name, **POOL, **{"neuron_lr.preset": "paper_main"})
    replies = {}
    for pid, content in configure(s, 1).items():
        reply = reply_to(pid, content, fake_train(to_ndarrays(content["arrays"]), pid, 1), 10)
        reply.content["metrics"]["nlr-mu-l1"] = 1.0 + pid
        replies[pid] = reply
    pids = list(replies)
    s.aggregate_round(1, replies)
    columns = round_columns(s)
    assert "payload_checksums" in columns and "checksum_mismatches" in columns
    assert columns["nlr-mu-l1"] == pytest.approx(1.0 + np.mean(pids))


def round_columns(strategy) -> dict:
    return dict(strategy.round_log.columns)


# ================================================================================================
# 5. pool diagnostics (issue 14): distances, per-model and pool-mean test accuracy, movement
# ================================================================================================


def test_pool_distances_closed_form_and_zero_for_equal_models():
    """d_l = mean over pairs of ||u_s[l] − u_t[l]||, d = mean over pairs of the joint norm; K equal
    models give exactly 0 everywhere."""
    from strategies.pool import model_distance, pool_distances

    a = {"w": np.array([0.0, 0.0], dtype=np.float32), "b": np.array([0.0], dtype=np.float32)}
    b = {"w": np.array([3.0, 4.0], dtype=np.float32), "b": np.array([0.0], dtype=np.float32)}
    c = {"w": np.array([0.0, 0.0], dtype=np.float32), "b": np.array([12.0], dtype=np.float32)}
    d, per = pool_distances([a, b, c], ["w", "b"])
    # pairs (a,b), (a,c), (b,c): w-distances 5, 0, 5; b-distances 0, 12, 12; joint 5, 12, 13
    assert per == pytest.approx({"w": 10 / 3, "b": 24 / 3}) and d == pytest.approx(30 / 3)
    assert model_distance(b, c, ["w", "b"]) == pytest.approx(13.0)
    model = random_model(np.random.default_rng(5))
    keys = [k for k in SHAPES if not k.endswith("tracked")]
    d, per = pool_distances([dict(model) for _ in range(5)], keys)
    assert d == 0.0 and set(per) == set(keys) and all(v == 0.0 for v in per.values())
    assert pool_distances([model], keys) == (0.0, {k: 0.0 for k in keys})


def test_pool_diagnostics_columns():
    """Round 1, clients return what they got (K equal models): every distance and movement is exactly
    0 and every pool model scores the pool mean's accuracy. Round 2 (stage 1, R1 = 2; distinct
    uploads): K accuracies, the pool mean's accuracy is that of the returned global (the model the
    ServerApp evaluates), the models sent next are all that global. Round 3 (stage 2): the models
    sent next are the recombined ones, scored one by one; movement is ||v_s − w_s|| per slot."""
    # FedMR over the FAST synthetic task with the ServerApp's real evaluation on the test split
    s = make_strategy("fedmr", num_clients=NUM_CLIENTS, cohort=K, evaluate=True,
                      **{"fedmr.diagnostics": True, "fedmr.first_stage_rounds": 2})
    evaluate = s.setup.evaluate
    contents = configure(s, 1)
    s.aggregate_round(1, {pid: reply_to(pid, c, to_ndarrays(c["arrays"]), 10) for pid, c in contents.items()})
    col = round_columns(s)
    assert col["pool_distance"] == 0.0 and set(col["pool_layer_distance"]) == set(s.template)
    assert all(v == 0.0 for v in col["pool_layer_distance"].values())
    assert col["client_movement"] == [0.0] * K
    assert col["pool_accuracy"] == [col["pool_mean_accuracy"]] * K
    assert sorted(col["slot_clients"]) == s.sample_cohort(1)
    for r in (2, 3):
        sent, uploaded, glob = play_round(s, r)
        col = round_columns(s)
        assert len(col["pool_accuracy"]) == len(col["pool_loss"]) == len(col["next_accuracy"]) == K
        assert col["pool_mean_accuracy"] == evaluate(glob)["accuracy"]
        assert col["pool_mean_loss"] == evaluate(glob)["loss"]
        by_slot = {slot: pid for pid, (slot, _) in sent.items()}
        assert col["slot_clients"] == [by_slot[i] for i in range(K)]
        for i in range(K):
            pid = by_slot[i]
            assert col["pool_accuracy"][i] == evaluate(uploaded[pid])["accuracy"]
            assert col["client_movement"][i] == pytest.approx(
                float(np.sqrt(sum(np.sum((uploaded[pid][k].astype(np.float64) - sent[pid][1][k]) ** 2) for k in s.template))))
            assert col["next_accuracy"][i] == evaluate(s.pool[i])["accuracy"]
        assert col["pool_distance"] > 0 and all(v > 0 for v in col["pool_layer_distance"].values())
        if r == 2:
            assert col["next_accuracy"] == [col["pool_mean_accuracy"]] * K
    with pytest.raises(ValueError, match="evaluate"):
        make_strategy("fedmr", **POOL, **{"fedmr.diagnostics": True})  # a setup without evaluation
    off = make_strategy("fedmr", **POOL)  # off by default: no evaluation, no columns
    play_round(off, 1)
    assert not any(c.startswith(("pool_", "next_", "client_movement")) for c in round_columns(off))


def test_fedmr_warns_at_its_failure_setting_only():
    """The setting issue 14's study saw fail (momentum above 0.5 on a label-skewed partition, with or
    without an aggregation stage) gets a run-start warning naming the risk and the setting that
    trains; momentum 0.5 or IID gets none, nor do methods that declare no warnings."""
    def risks(**values):
        cfg = build_config(values={**FAST, "strategy": "fedmr", **values})
        return cfg.method.risks(cfg)

    (warning,) = risks(momentum=0.9)
    assert "momentum 0.9" in warning and "--set momentum=0.5" in warning
    assert len(risks(momentum=0.9, **{"fedmr.first_stage_rounds": 40})) == 1  # decays after the switch
    assert risks(momentum=0.5) == [] and risks(momentum=0.0) == []
    assert risks(momentum=0.9, partitioner="iid") == []
    cfg = build_config(values={**FAST, "strategy": "fedavg"})
    assert cfg.method.risks(cfg) == []
