"""Part-A baselines: FedProx, SCAFFOLD, FedDyn, FedAdam, FedAvgM, FedYogi, FedExP, FedNova.

Unit tests first: each update rule against a small hand-computed case (strategy level through the
round's protocol, ``configure_round``/``aggregate_round``, with hand-built replies by partition id;
client level with ``make_task``). Then equivalences with FedAvg through real simulations (spec fedmrur.md §5
"Equivalences", fedinit.md §8 item 11, fedmr.md §8 item 20).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import MetricRecord, RecordDict

from clients.fedavg import FedAvgClient
from clients.feddyn import FedDynClient
from clients.fedprox import FedProxClient
from clients.scaffold import ScaffoldClient, control_variate_update
from conftest import FAST, assert_same_arrays, make_strategy, make_task
from fedsuite.method.replies import Reply
from fedsuite.method.training import run_local_training
from fedsuite.method.wire import to_record
from strategies.fedexp import fedexp_step_size
from strategies.fednova import nova_norm


#: the methods' maths, not how messages travel: the in-process engine (``simulate``, tests/conftest.py)
pytestmark = pytest.mark.inprocess

F32 = np.float32


# ------------------------------------------------------------------------------------------------
# helpers: a strategy (conftest's ``make_strategy``) on a hand-built 2-parameter "model", driven
# through its round's protocol
# ------------------------------------------------------------------------------------------------


def play_round(strategy, server_round: int, current: dict, uploads: dict, n=None, steps=None, extras=None):
    """configure_round with ``current``, then reply ``uploads[pid]`` for every sampled pid.

    Returns (what was sent, {partition id: content}; the new global arrays)."""
    sent = strategy.configure_round(server_round, {k: np.asarray(v, F32) for k, v in current.items()})
    replies = {}
    for pid in sent:
        if pid not in uploads:
            continue
        content = RecordDict({"arrays": to_record({k: np.asarray(v, F32) for k, v in uploads[pid].items()})})
        for name, arrays in (extras or {}).get(pid, {}).items():
            content[name] = to_record({k: np.asarray(v, F32) for k, v in arrays.items()})
        content["metrics"] = MetricRecord({"num-examples": int((n or {}).get(pid, 10)), "train-loss": 1.0,
                                           "num-steps": float((steps or {}).get(pid, 5)), "partition-id": pid})
        replies[pid] = Reply(content)
    arrays, _ = strategy.aggregate_round(server_round, replies)
    return sent, arrays


W0 = {"w": np.array([1.0, 2.0], F32), "b": np.array([0.5], F32)}


def test_helpers_drive_the_strategys_round():
    s = make_strategy("fedavg", W0)
    sent, new = play_round(s, 1, W0, {0: {"w": [3, 2], "b": [1]}, 1: {"w": [1, 6], "b": [0]}}, n={0: 10, 1: 30})
    assert sorted(sent) == [0, 1, 2, 3]  # every partition of the cohort got its content
    np.testing.assert_allclose(new["w"], [1.5, 5.0])
    np.testing.assert_allclose(new["b"], [0.25])


# ------------------------------------------------------------------------------------------------
# server rules, hand-computed
# ------------------------------------------------------------------------------------------------


def test_scaffold_server_step_control_variate_and_payload():
    s = make_strategy("scaffold", W0, num_clients=4, **{"scaffold.server_lr": 2.0})
    up = {0: {"w": [2, 2], "b": [0.5]}, 1: {"w": [1, 4], "b": [1.5]}}
    dcv = {0: {"delta-cv": {"w": [0.4, 0.0], "b": [1.0]}}, 1: {"delta-cv": {"w": [0.0, -0.8], "b": [1.0]}}}
    sent, new = play_round(s, 1, W0, up, n={0: 10, 1: 30}, extras=dcv)
    # round 1: every client receives c = 0 as "server-cv"
    assert all(np.array_equal(content["server-cv"]["w"].numpy(), [0, 0]) for content in sent.values())
    # uniform mean of Δ = ([1,0],[0,2])/2 = [0.5, 1]; w + 2 Δ̄
    np.testing.assert_allclose(new["w"], [2.0, 4.0])
    np.testing.assert_allclose(new["b"], [1.5])
    # c ← c + (1/C) Σ Δc_i with C = 4 (all clients, not the cohort)
    np.testing.assert_allclose(s.c["w"], [0.1, -0.2], rtol=1e-6)
    np.testing.assert_allclose(s.c["b"], [0.5])
    sent, _ = play_round(s, 2, new, {0: new}, extras={0: {"delta-cv": {"w": [0, 0], "b": [0]}}})
    np.testing.assert_allclose(sent[0]["server-cv"]["w"].numpy(), [0.1, -0.2], rtol=1e-6)
    # checkpoint round trip
    s2 = make_strategy("scaffold", W0, num_clients=4)
    s2.load_state_dict(copy.deepcopy(s.state_dict()))
    assert_same_arrays(s2.c, s.c)


def test_scaffold_examples_weighting_with_unit_lr_is_fedavgs_mean_bit_for_bit():
    up = {0: {"w": [2.1, 2.3], "b": [0.7]}, 1: {"w": [1.3, 4.9], "b": [1.1]}}
    n = {0: 7, 1: 13}
    _, fedavg = play_round(make_strategy("fedavg", W0), 1, W0, up, n=n)
    s = make_strategy("scaffold", W0, **{"scaffold.weighting": "examples"})
    _, scaffold = play_round(s, 1, W0, up, n=n, extras={p: {"delta-cv": {"w": [0, 0], "b": [0]}} for p in up})
    assert_same_arrays(scaffold, fedavg)


def test_feddyn_server_adds_mean_of_all_clients_h():
    s = make_strategy("feddyn", W0, num_clients=4)
    # round 1: Δ_0 = [1, 0, 0.5], Δ_1 = [0, 2, -0.5]; h̄ = ΣΔ/4 = [0.25, 0.5, 0]
    _, new = play_round(s, 1, W0, {0: {"w": [2, 2], "b": [1.0]}, 1: {"w": [1, 4], "b": [0.0]}})
    np.testing.assert_allclose(new["w"], [1.5 + 0.25, 3.0 + 0.5])  # uniform model mean + h̄
    np.testing.assert_allclose(new["b"], [0.5 + 0.0])
    # round 2, only client 2: Δ_2 = [0.4, 0.4, 0]; h̄ = [0.35, 0.6, 0]
    w1 = {k: v.copy() for k, v in new.items()}
    up = {2: {"w": w1["w"] + 0.4, "b": w1["b"]}}
    _, new2 = play_round(s, 2, w1, up)
    np.testing.assert_allclose(new2["w"], w1["w"] + 0.4 + [0.35, 0.6], rtol=1e-6)
    np.testing.assert_allclose(s.h["w"], [0.35, 0.6], rtol=1e-6)


@pytest.mark.parametrize("mode", ["delta", "model"])
def test_feddyn_server_with_relaxed_start_offset(mode):
    """With a relaxed start r_i = w_{i,0} − w^t, Δ_i = w_{i,K} − w_{i,0} and the model mean uses w_{i,K}."""
    s = make_strategy("feddyn", W0, num_clients=2)
    s.cfg = s.cfg.model_copy()
    object.__setattr__(s.cfg, "relaxed_init", type("RI", (), {"aggregation": mode})())
    w_start = {"w": [1.5, 2.0], "b": [0.5]}  # r = [0.5, 0, 0]
    w_k = {"w": [2.5, 3.0], "b": [1.0]}  # Δ = [1, 1, 0.5]
    upload = w_k if mode == "model" else {"w": [2.0, 3.0], "b": [1.0]}  # w^t + Δ
    offset = {"start-offset": {"w": [0.5, 0.0], "b": [0.0]}}
    _, new = play_round(s, 1, W0, {0: upload}, extras={0: offset})
    np.testing.assert_allclose(s.h["w"], [0.5, 0.5])  # ΣΔ / C
    np.testing.assert_allclose(new["w"], [2.5 + 0.5, 3.0 + 0.5])


def test_fedadam_first_step_is_hand_computed_without_bias_correction():
    """Spec fedinit.md §8 item 11: the first step is η·0.1Δ̄/(0.1|Δ̄| + ε) element-wise."""
    s = make_strategy("fedadam", W0)
    up = {0: {"w": [2.0, 2.0], "b": [0.3]}, 1: {"w": [1.0, 1.0], "b": [0.5]}}
    _, new = play_round(s, 1, W0, up, n={0: 10, 1: 30})
    d = np.array([0.25 * 1 + 0.75 * 0, -0.75])  # weighted mean − w^t
    expected = np.array([1.0, 2.0]) + 0.1 * 0.1 * d / (0.1 * np.abs(d) + 0.01)
    np.testing.assert_allclose(new["w"], expected, rtol=1e-6)
    db = 0.25 * 0.3 + 0.75 * 0.5 - 0.5
    np.testing.assert_allclose(new["b"], 0.5 + 0.1 * 0.1 * db / (0.1 * abs(db) + 0.01), rtol=1e-6)
    assert new["w"].dtype == np.float32


def test_fedadam_bias_correction_option_and_validated_mean():
    s = make_strategy("fedadam", W0, **{"fedadam.bias_correction": True})
    up = {0: {"w": [2.0, 2.0], "b": [0.5]}, 1: {"w": [np.nan, 9.0], "b": [0.5]}}  # client 1 is dropped
    _, new = play_round(s, 1, W0, up)
    d = np.array([1.0, 0.0])
    m, v = 0.1 * d, 0.01 * d**2
    eta = 0.1 * math.sqrt(1 - 0.99) / (1 - 0.9)  # Adam's correction at t = 1
    np.testing.assert_allclose(new["w"], [1.0, 2.0] + eta * m / (np.sqrt(v) + 0.01), rtol=1e-6)
    assert s.round_log.drop_reasons[1] == "non-finite values in arrays['w']"  # 2, 3: no reply


def assert_round_two_resumes_from_state(name: str, s, w1: dict) -> None:
    """Round 2 of strategy ``s`` (after round 1, which gave ``w1``) equals round 2 of a fresh ``name``
    strategy given ``s``'s state: the state is all the round needs."""
    resumed = make_strategy(name, W0)
    resumed.load_state_dict(copy.deepcopy(s.state_dict()))
    up2 = {0: {"w": w1["w"] + 1, "b": w1["b"]}, 1: {"w": w1["w"] - 0.5, "b": w1["b"] + 1}}
    _, a = play_round(s, 2, w1, up2)
    _, b = play_round(resumed, 2, w1, up2)
    assert_same_arrays(a, b)


def test_fedadam_state_round_trip_continues_identically():
    up1 = {0: {"w": [2.0, 2.0], "b": [0.3]}, 1: {"w": [1.0, 1.0], "b": [0.5]}}
    s = make_strategy("fedadam", W0)
    _, w1 = play_round(s, 1, W0, up1)
    assert_round_two_resumes_from_state("fedadam", s, w1)
    assert s.state_dict()["m_t"] is not None and s.state_dict()["v_t"] is not None


def test_fedyogi_first_step_hand_computed():
    s = make_strategy("fedyogi", W0)
    _, new = play_round(s, 1, W0, {0: {"w": [3.0, 1.0], "b": [0.5]}})
    d = np.array([2.0, -1.0])
    m = 0.1 * d
    v = 0 - 0.01 * d**2 * np.sign(0 - d**2)  # = 0.01 d²
    np.testing.assert_allclose(new["w"], [1.0, 2.0] + 0.01 * m / (np.sqrt(v) + 1e-3), rtol=1e-6)


def test_fedavgm_two_rounds_of_server_momentum_and_state():
    s = make_strategy("fedavgm", W0, **{"fedavgm.server_momentum": 0.5, "fedavgm.server_lr": 1.0})
    _, w1 = play_round(s, 1, W0, {0: {"w": [2.0, 2.0], "b": [0.5]}})
    np.testing.assert_allclose(w1["w"], [2.0, 2.0])  # v = g = w − mean; w − v
    state = copy.deepcopy(s.state_dict())
    _, w2 = play_round(s, 2, w1, {0: {"w": [2.0, 3.0], "b": [0.5]}})
    # g2 = [0, −1]; v = 0.5 [−1, 0] + [0, −1]; w2 = w1 − v = [2.5, 3]
    np.testing.assert_allclose(w2["w"], [2.5, 3.0])
    resumed = make_strategy("fedavgm", W0, **{"fedavgm.server_momentum": 0.5})
    resumed.load_state_dict(state)
    _, w2b = play_round(resumed, 2, w1, {0: {"w": [2.0, 3.0], "b": [0.5]}})
    assert_same_arrays(w2b, w2)


# --- the server optimisers' steps (fedsuite.method.server_opt) against their rules, in float64 -----------

OPT = {"lr": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 0.01}


def opt_rounds(rounds: int = 5, seed: int = 0):
    """w^0 (float32 arrays and an int64 buffer) and the rounds' means x̄_t, as the step gets them."""
    rng = np.random.default_rng(seed)
    w0 = {"w": rng.normal(size=(3, 7)).astype(F32), "b": rng.normal(size=4).astype(F32),
          "count": np.arange(3, dtype=np.int64)}
    steps = [{"w": rng.normal(scale=0.1, size=(3, 7)), "b": rng.normal(scale=0.01, size=4),
              "count": rng.integers(1, 9, size=3)} for _ in range(rounds)]
    return w0, steps


def run_steps(step, state, w0, steps, **kw):
    """Each round's (w^t, x̄_t, w^{t+1}) through ``step``; x̄_t = w^t + the round's move, in w's dtypes."""
    w, out = w0, []
    for t, move in enumerate(steps, start=1):
        mean = {k: (w[k] + move[k]).astype(w[k].dtype) for k in w}
        lr = kw["lr"](t) if callable(kw.get("lr")) else kw["lr"]
        new, state = step(state, w, mean, **{**kw, "lr": lr})
        out.append((w, mean, new))
        w = new
    return out, state


@pytest.mark.parametrize("bias_correction", [False, True])
def test_adam_step_follows_adams_rule_in_float64(bias_correction):
    from fedsuite.method.server_opt import Moments, adam_lr, adam_step

    p = OPT
    eta = lambda t: adam_lr(p["lr"], p["beta1"], p["beta2"], t, bias_correction=bias_correction)
    for t in range(1, 200):  # η_t is Adam's (or η), to within an ulp or two
        want = p["lr"] * math.sqrt(1 - p["beta2"] ** t) / (1 - p["beta1"] ** t) if bias_correction else p["lr"]
        assert eta(t) == pytest.approx(want, rel=1e-15)
    w0, steps = opt_rounds()
    out, state = run_steps(adam_step, Moments(), w0, steps, **{**p, "lr": eta})
    m = {k: 0.0 for k in w0}
    v = {k: 0.0 for k in w0}
    for t, (w, mean, new) in enumerate(out, start=1):
        want_eta = p["lr"] * math.sqrt(1 - p["beta2"] ** t) / (1 - p["beta1"] ** t) if bias_correction else p["lr"]
        for k in w0:
            d = mean[k].astype(np.float64) - w[k].astype(np.float64)
            m[k] = p["beta1"] * m[k] + (1 - p["beta1"]) * d
            v[k] = p["beta2"] * v[k] + (1 - p["beta2"]) * d**2
            want = w[k].astype(np.float64) + want_eta * m[k] / (np.sqrt(v[k]) + p["tau"])
            assert new[k].dtype == w0[k].dtype
            if k == "count":  # integer buffers go through the rule and are rounded back
                np.testing.assert_array_equal(new[k], np.rint(want))
            else:
                np.testing.assert_allclose(new[k], want, rtol=1e-5, atol=1e-6, err_msg=f"{k}, round {t}")
    np.testing.assert_allclose(state.m["w"], m["w"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(state.v["w"], v["w"], rtol=1e-5, atol=1e-9)


def test_yogi_step_follows_yogis_rule_in_float64():
    from fedsuite.method.server_opt import Moments, yogi_step

    p = {**OPT, "tau": 1e-3}
    w0, steps = opt_rounds()
    out, _ = run_steps(yogi_step, Moments(), w0, steps, **p)
    m = {k: 0.0 for k in w0}
    v = {k: 0.0 for k in w0}
    for t, (w, mean, new) in enumerate(out, start=1):
        for k in ("w", "b"):
            d = mean[k].astype(np.float64) - w[k].astype(np.float64)
            m[k] = p["beta1"] * m[k] + (1 - p["beta1"]) * d
            v[k] = v[k] - (1 - p["beta2"]) * d**2 * np.sign(v[k] - d**2)
            want = w[k].astype(np.float64) + p["lr"] * m[k] / (np.sqrt(v[k]) + p["tau"])
            np.testing.assert_allclose(new[k], want, rtol=1e-5, atol=1e-6, err_msg=f"{k}, round {t}")


@pytest.mark.parametrize("beta1", [0.0, 0.9])
def test_adagrad_step_follows_adagrads_rule_in_float64(beta1):
    from fedsuite.method.server_opt import Moments, adagrad_step

    p = {"lr": OPT["lr"], "beta1": beta1, "tau": 1e-3}
    w0, steps = opt_rounds()
    out, state = run_steps(adagrad_step, Moments(), w0, steps, **p)
    m = {k: 0.0 for k in w0}
    v = {k: 0.0 for k in w0}
    for t, (w, mean, new) in enumerate(out, start=1):
        for k in w0:
            d = mean[k].astype(np.float64) - w[k].astype(np.float64)
            m[k] = beta1 * m[k] + (1 - beta1) * d
            v[k] = v[k] + d**2  # the sum of squares never forgets (Adagrad)
            want = w[k].astype(np.float64) + p["lr"] * m[k] / (np.sqrt(v[k]) + p["tau"])
            assert new[k].dtype == w0[k].dtype
            if k == "count":
                np.testing.assert_array_equal(new[k], np.rint(want))
            else:
                np.testing.assert_allclose(new[k], want, rtol=1e-5, atol=1e-6, err_msg=f"{k}, round {t}")
    np.testing.assert_allclose(state.v["w"], v["w"], rtol=1e-5, atol=1e-9)


def test_fedadagrad_first_step_hand_computed_and_resumes_from_its_state():
    s = make_strategy("fedadagrad", W0)
    _, w1 = play_round(s, 1, W0, {0: {"w": [3.0, 1.0], "b": [0.5]}})
    d = np.array([2.0, -1.0])  # β₁ = 0: m = Δ, v = Δ², so each coordinate moves η Δ / (|Δ| + τ)
    np.testing.assert_allclose(w1["w"], [1.0, 2.0] + 0.1 * d / (np.abs(d) + 1e-3), rtol=1e-6)
    assert_round_two_resumes_from_state("fedadagrad", s, w1)


@pytest.mark.parametrize("lr, beta", [(1.0, 0.9), (0.7, 0.5), (0.5, 0.0)])
def test_momentum_step_follows_fedavgms_rule_in_float64(lr, beta):
    """Integer buffers too: their iterate is kept unrounded, the model carries its rounding."""
    from fedsuite.method.server_opt import Momentum, momentum_step

    w0, steps = opt_rounds(6)
    out, state = run_steps(momentum_step, Momentum(), w0, steps, lr=lr, beta=beta)
    x = {k: a.astype(np.float64) for k, a in w0.items()}
    v = None
    for t, (w, mean, new) in enumerate(out, start=1):
        g = {k: x[k] - mean[k].astype(np.float64) for k in x}
        v = g if v is None else {k: beta * v[k] + g[k] for k in g}
        x = {k: x[k] - lr * v[k] for k in x}
        np.testing.assert_allclose(new["w"], x["w"], rtol=1e-5, atol=1e-6, err_msg=f"round {t}")
        np.testing.assert_allclose(new["b"], x["b"], rtol=1e-5, atol=1e-6, err_msg=f"round {t}")
        np.testing.assert_array_equal(new["count"], np.rint(x["count"]))
        assert new["count"].dtype == np.int64
    np.testing.assert_allclose(state.unrounded["count"], x["count"], rtol=1e-12)
    assert set(state.unrounded) == {"count"} and (state.v is None) == (beta == 0.0)


def test_momentum_with_unit_lr_and_no_momentum_is_the_mean_and_fedavgm_then_is_fedavg():
    from fedsuite.method.server_opt import Momentum, momentum_step

    w0, steps = opt_rounds(1)
    mean = {k: (w0[k] + steps[0][k]).astype(w0[k].dtype) for k in w0}
    new, state = momentum_step(Momentum(), w0, mean, lr=1.0, beta=0.0)
    assert all(new[k] is mean[k] for k in mean) and state == Momentum()
    ups = [{0: {"w": [2.0, 2.1], "b": [0.3]}, 1: {"w": [0.7, 1.0], "b": [0.5]}},
           {0: {"w": [1.3, 2.2], "b": [0.1]}, 2: {"w": [1.0, 1.9], "b": [0.9]}}]
    n = {0: 10, 1: 30, 2: 7}
    fedavg, fedavgm = make_strategy("fedavg", W0), make_strategy(
        "fedavgm", W0, **{"fedavgm.server_lr": 1.0, "fedavgm.server_momentum": 0.0})
    a = b = W0
    for t, up in enumerate(ups, start=1):
        _, a = play_round(fedavg, t, a, up, n=n)
        _, b = play_round(fedavgm, t, b, up, n=n)
        assert_same_arrays(a, b)


@pytest.mark.parametrize("which", ["adam", "yogi", "adagrad", "momentum"])
def test_optimiser_state_round_trips_and_steps_mutate_nothing(which):
    from fedsuite.method import server_opt as so

    step, state0, kw = {
        "adam": (so.adam_step, so.Moments(), OPT),
        "yogi": (so.yogi_step, so.Moments(), OPT),
        "adagrad": (so.adagrad_step, so.Moments(), {"lr": 0.3, "beta1": 0.5, "tau": 1e-3}),
        "momentum": (so.momentum_step, so.Momentum(), {"lr": 0.7, "beta": 0.9}),
    }[which]
    w0, steps = opt_rounds(6)
    w0_before = copy.deepcopy(w0)
    out, _ = run_steps(step, state0, w0, steps, **kw)
    _, state3 = run_steps(step, state0, w0, steps[:3], **kw)
    saved = state3.state_dict()
    saved_before = copy.deepcopy(saved)
    resumed, _ = run_steps(step, type(state0).from_state_dict(saved), out[2][2], steps[3:], **kw)
    for (_, _, a), (_, _, b) in zip(out[3:], resumed):  # resumed from the state: the same, bit for bit
        assert_same_arrays(a, b)
    assert_same_arrays(w0, w0_before)  # the steps changed neither their inputs nor a saved state
    for key, arrays in saved_before.items():
        if arrays is not None:
            assert_same_arrays(saved[key], arrays)


#: sha256 (first 16 hex digits) of every round's w^{t+1} of :func:`drive_optimiser`, computed with
#: the Flower-backed strategies these replaced (fedsuite 3b36b88): the rewrite is bit for bit
GOLDEN = {
    "fedadam": "46596a3408e7f932",
    "fedadam-bc": "d177d4f0bf1b8473",
    "fedyogi": "81b12db379a973d8",
    "fedavgm": "5aa704b70baa5fd9",
    "fedavgm-lr": "d63a3a93d24f45dc",
}
GOLDEN_VALUES = {
    "fedadam": {"fedadam.server_lr": 1.0, "fedadam.beta1": 0.5, "fedadam.beta2": 0.9, "fedadam.tau": 1e-3},
    "fedadam-bc": {"fedadam.bias_correction": True},
    "fedyogi": {"fedyogi.server_lr": 0.3, "fedyogi.tau": 1e-2},
    "fedavgm": {},
    "fedavgm-lr": {"fedavgm.server_lr": 0.7, "fedavgm.server_momentum": 0.5},
}


def drive_optimiser(case: str, rounds: int = 12) -> str:
    """``rounds`` rounds of the case's strategy on a small model with an int64 buffer, one client
    (so each round's mean is its reply, exactly); the digest of every round's new global model."""
    import hashlib

    name = case.split("-")[0]
    rng = np.random.default_rng(7)
    w = {"w": rng.normal(size=(20, 50)).astype(F32), "b": np.zeros(20, F32), "count": np.array(0, np.int64),
         "n": np.arange(4, dtype=np.int64)}
    s = make_strategy(name, w, num_clients=1, **GOLDEN_VALUES[case])
    digest = hashlib.sha256()
    for t in range(1, rounds + 1):
        assert list(s.configure_round(t, w)) == [0]
        up = {k: (a + rng.integers(1, 9, size=a.shape) if a.dtype == np.int64
                  else a + rng.normal(scale=0.1, size=a.shape)).astype(a.dtype) for k, a in w.items()}
        content = RecordDict({"arrays": to_record(up), "metrics": MetricRecord(
            {"num-examples": 10, "train-loss": 1.0, "num-steps": 5.0, "partition-id": 0})})
        w, _ = s.aggregate_round(t, {0: Reply(content)})
        for k, a in w.items():
            digest.update(k.encode() + str(a.dtype).encode() + np.ascontiguousarray(a).tobytes())
    return digest.hexdigest()[:16]


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_server_optimisers_reproduce_the_flower_backed_results_bit_for_bit(case):
    assert drive_optimiser(case) == GOLDEN[case]


def test_fedexp_step_size_hand_computed_and_at_least_one():
    e = [{"w": np.array(v, float)} for v in ([1, 0, 0], [0, 1, 0], [0, 0, 1])]
    # Σp‖Δ‖² = 1, ‖Δ̄‖² = 1/3  =>  η = 1 / (2 (1/3 + ε))
    assert fedexp_step_size(e, [1, 1, 1], ["w"], 1e-3) == pytest.approx(1 / (2 * (1 / 3 + 1e-3)))
    same = [{"w": np.array([1.0, -2.0])}] * 3
    assert fedexp_step_size(same, [1, 2, 3], ["w"], 0.0) == 1.0  # identical updates: η = 1
    assert fedexp_step_size(e, [1, 1, 1], ["w"], 1e9) == 1.0


def test_fedexp_server_extrapolates_and_evaluates_the_two_iterate_average():
    w0 = {"w": np.zeros(3, F32)}
    s = make_strategy("fedexp", w0, num_clients=3)
    up = {0: {"w": [1, 0, 0]}, 1: {"w": [0, 1, 0]}, 2: {"w": [0, 0, 1]}}
    _, new = play_round(s, 1, w0, up)
    eta = 1 / (2 * (1 / 3 + 1e-3))
    np.testing.assert_allclose(new["w"], np.full(3, eta / 3), rtol=1e-6)
    assert s.round_log.columns["fedexp_eta_g"] == pytest.approx(eta)
    evaluated = s.evaluation_arrays(new)
    np.testing.assert_allclose(evaluated["w"], np.full(3, eta / 6), rtol=1e-6)


def test_fednova_normalises_by_step_counts():
    s = make_strategy("fednova", W0, num_clients=2)
    up = {0: {"w": [2.0, 2.0], "b": [0.5]}, 1: {"w": [1.0, 5.0], "b": [0.5]}}
    _, new = play_round(s, 1, W0, up, n={0: 10, 1: 10}, steps={0: 1, 1: 3})
    # τ_eff = 2; w + 2 (0.5 Δ_0/1 + 0.5 Δ_1/3) with Δ_0 = [1, 0], Δ_1 = [0, 3]
    np.testing.assert_allclose(new["w"], [1.0 + 1.0, 2.0 + 1.0], rtol=1e-6)
    assert s.round_log.columns["fednova_tau_eff"] == 2.0


def test_fednova_equal_steps_is_fedavg_bit_for_bit_and_momentum_norm():
    up = {0: {"w": [2.1, 2.3], "b": [0.7]}, 1: {"w": [1.3, 4.9], "b": [1.1]}}
    n, steps = {0: 7, 1: 13}, {0: 4, 1: 4}
    _, fedavg = play_round(make_strategy("fedavg", W0), 1, W0, up, n=n)
    _, nova = play_round(make_strategy("fednova", W0), 1, W0, up, n=n, steps=steps)
    assert_same_arrays(nova, fedavg)
    # momentum ρ = 0.5, τ = 2: d_1 = g_1, d_2 = g_2 + ρ g_1 → coefficients 1.5 + 1 = 2.5
    assert nova_norm(2, 0.5) == pytest.approx(2.5)
    assert nova_norm(7, 0.0) == 7.0


# ------------------------------------------------------------------------------------------------
# client rules (hook level, make_task)
# ------------------------------------------------------------------------------------------------


def _trainable(task):
    return {n: p for n, p in task.model.named_parameters() if p.requires_grad}


def _full_batch_grad(task, at: dict) -> dict:
    """∇ of the mean cross-entropy over ALL of the client's data at parameters ``at``."""
    model = copy.deepcopy(task.model)
    model.load_state_dict(at)
    x, y = next(task.data.batches(len(task.data), torch.Generator().manual_seed(0)))
    F.cross_entropy(model(x), y).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _local_round(rule, cfg_values=None, **kw):
    task, _ = make_task(cfg_values, **kw)
    return task, run_local_training(rule, task)


@pytest.mark.parametrize("rule, values", [
    (FedProxClient, {"strategy": "fedprox", "fedprox.mu": 0.0}),
    (FedDynClient, {"strategy": "feddyn", "feddyn.alpha": 0.0}),
    (ScaffoldClient, {"strategy": "scaffold"}),
])
def test_client_rule_with_its_knob_at_zero_is_plain_sgd_bit_for_bit(rule, values):
    """FedProx μ=0, FedDyn λ=0 (spec fedinit.md §8 item 11) and SCAFFOLD with c = c_i = 0 (round 1)."""
    small = {"momentum": 0.5, "weight_decay": 1e-3}  # FAST client 0: ~480 samples, a quick round
    _, ref = _local_round(FedAvgClient(), small)
    extras = {}
    if rule is ScaffoldClient:  # round 1's message carries c = 0 (SCAFFOLD's declared "server-cv")
        probe, _ = make_task({**values, **small})
        extras = {"extras": {"server-cv": {n: torch.zeros_like(p).detach() for n, p in _trainable(probe).items()}}}
    task, out = _local_round(rule(), {**values, **small}, **extras)
    assert out.metrics["num-steps"] > 3
    assert_same_arrays({k: v.numpy() for k, v in out.arrays.items()}, {k: v.numpy() for k, v in ref.arrays.items()})
    assert out.metrics["train-loss"] == ref.metrics["train-loss"]


def test_fedprox_loss_and_gradient_include_the_proximal_term_to_the_start_point():
    task, _ = make_task({"strategy": "fedprox", "fedprox.mu": 0.5})
    task.start_point = {k: v.detach().clone() for k, v in task.model.state_dict().items()}
    with torch.no_grad():
        for p in task.params:
            p.add_(0.1)
    x, y = next(task.data.batches(32, torch.Generator().manual_seed(1)))
    ce = F.cross_entropy(task.model(x), y)
    ce.backward()
    ce_grads = {n: p.grad.clone() for n, p in _trainable(task).items()}
    task.model.zero_grad(set_to_none=True)
    loss = FedProxClient().loss(task, x, y)
    numel = sum(p.numel() for p in task.params)
    assert float(loss.detach()) == pytest.approx(float(ce.detach()) + 0.25 * 0.01 * numel, rel=1e-5)
    loss.backward()
    for n, p in _trainable(task).items():
        torch.testing.assert_close(p.grad, ce_grads[n] + 0.5 * 0.1, rtol=1e-4, atol=1e-6)


def test_scaffold_one_full_batch_step_and_option_ii_update(tmp_path):
    """K = 1: w_1 = w_0 − η(g + c − c_i), hence c_i⁺ = c_i − c − Δ/(η) = ∇ℓ(w_0) (the option-II idea)."""
    probe, _ = make_task({"strategy": "scaffold"})
    names = list(_trainable(probe))
    gen = torch.Generator().manual_seed(3)
    c = {n: 0.01 * torch.randn(p.shape, generator=gen) for n, p in _trainable(probe).items()}
    c_i = {n: 0.01 * torch.randn(p.shape, generator=gen) for n, p in _trainable(probe).items()}
    task, _ = make_task({"strategy": "scaffold", "batch_size": 100000}, extras={"server-cv": c}, state_dir=tmp_path)
    task.state.save_arrays("scaffold-ci", c_i)
    w0 = {k: v.clone() for k, v in task.model.state_dict().items()}
    g = _full_batch_grad(task, w0)
    out = run_local_training(ScaffoldClient(), task)
    assert out.metrics["num-steps"] == 1
    for n in names:
        torch.testing.assert_close(out.arrays[n], w0[n] - task.lr * (g[n] + c[n] - c_i[n]), rtol=1e-5, atol=1e-6)
    saved = task.state.load_arrays("scaffold-ci")
    for n in names:
        torch.testing.assert_close(saved[n], g[n], rtol=1e-3, atol=1e-5)
        torch.testing.assert_close(out.extras["delta-cv"][n], saved[n] - c_i[n])


def test_scaffold_update_with_neuron_wise_rates_divides_elementwise():
    c_i, c = {"w": torch.tensor([[1.0, 1.0], [1.0, 1.0]])}, {"w": torch.zeros(2, 2)}
    delta = {"w": torch.tensor([[-2.0, -2.0], [-2.0, -2.0]])}
    out = control_variate_update(c_i, c, delta, steps=2, lr=0.5, scales={"w": torch.tensor([[1.0], [2.0]])})
    torch.testing.assert_close(out["w"], torch.tensor([[3.0, 3.0], [2.0, 2.0]]))  # 1 + 2/(2·0.5·s)
    same = control_variate_update(c_i, c, delta, steps=0, lr=0.5)
    torch.testing.assert_close(same["w"], c_i["w"])


def test_feddyn_one_full_batch_step_and_h_update(tmp_path):
    """w_1 = w_0 − η(∇ℓ + λ(h_i − w_0) + (wd + λ) w_0) and h_i ← h_i + Δ_i (spec fedinit.md §5)."""
    alpha, wd = 0.1, 0.01
    values = {"strategy": "feddyn", "feddyn.alpha": alpha, "batch_size": 100000, "weight_decay": wd}
    task, _ = make_task(values, state_dir=tmp_path)
    gen = torch.Generator().manual_seed(5)
    h = {n: 0.1 * torch.randn(p.shape, generator=gen) for n, p in _trainable(task).items()}
    task.state.save_arrays("feddyn-h", h)
    w0 = {k: v.clone() for k, v in task.model.state_dict().items()}
    g = _full_batch_grad(task, w0)
    out = run_local_training(FedDynClient(), task)
    saved = task.state.load_arrays("feddyn-h")
    for n in h:
        expected = w0[n] - task.lr * (g[n] + alpha * (h[n] - w0[n]) + (wd + alpha) * w0[n])
        torch.testing.assert_close(out.arrays[n], expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(saved[n], h[n] + (out.arrays[n] - w0[n]))
    assert "start-offset" not in out.extras  # started at w^t: nothing extra to upload


def test_feddyn_uploads_the_start_offset_when_the_start_point_moved():
    class Moved(FedDynClient):
        def start(self, task):
            super().start(task)
            with torch.no_grad():
                for p in task.params:
                    p.add_(0.25)

    task, out = _local_round(Moved(), {"strategy": "feddyn", "num_clients": 100, "feddyn.alpha": 0.1})
    for n, r in out.extras["start-offset"].items():
        torch.testing.assert_close(r, torch.full_like(r, 0.25))


# ------------------------------------------------------------------------------------------------
# equivalences with FedAvg through REAL simulations (same seed; 6 distinct runs)
# ------------------------------------------------------------------------------------------------

R1 = {"rounds": 1}
# equal sizes → equal local step counts in every round; 2 rounds, default FedNova knobs: the same
# run is tests/test_registry_e2e.py's end-to-end run of fednova (it joins this file's xdist group)
IID = {"rounds": 2, "partitioner": "iid"}


def _same_round(a, b) -> None:
    assert_same_arrays(a.arrays, b.arrays)
    keys = ("round", "test_accuracy", "test_loss", "train_loss", "cohort")
    assert [{k: r.get(k) for k in keys} for r in a.rows] == [{k: r.get(k) for k in keys} for r in b.rows]


def test_fedprox_mu_zero_is_fedavg_end_to_end(simulate):
    _same_round(simulate(strategy="fedprox", **{"fedprox.mu": 0.0}, **R1), simulate(strategy="fedavg", **R1))


def test_scaffold_round_one_is_fedavg_end_to_end(simulate):
    """c = c_i = 0 in round 1 (spec fedmrur.md §5 equivalences); examples weighting as FedAvg's."""
    run = simulate(strategy="scaffold", **{"scaffold.weighting": "examples"}, **R1)
    fedavg = simulate(strategy="fedavg", **R1)
    _same_round(run, fedavg)
    assert run.rows[1]["bytes_sent"] > 1.9 * fedavg.rows[1]["bytes_sent"]  # c goes down with w^t
    c = run.checkpoint["strategy"]["method"]["c"]
    assert any(np.abs(v).sum() > 0 for v in c.values())  # but the server's c has moved
    assert any((run.run_dir / "client-state").glob("client-*/scaffold-ci.r1.pt"))  # versioned by round (fedsuite/method/state.py)


def test_fednova_with_equal_step_counts_is_fedavg_end_to_end(simulate):
    run = simulate(strategy="fednova", **IID)
    _same_round(run, simulate(strategy="fedavg", **IID))  # both rounds
    assert [r["fednova_tau_eff"] for r in run.rows[1:]] == pytest.approx([math.ceil(483 / FAST["batch_size"])] * 2)  # IID: 483-484 samples, 16 steps each


def test_fedexp_with_its_step_clipped_to_one_is_fedavg_end_to_end(simulate):
    run = simulate(strategy="fedexp", **{"fedexp.epsilon": 1e9, "fedexp.eval_average": False}, **R1)
    _same_round(run, simulate(strategy="fedavg", **R1))
    assert run.rows[1]["fedexp_eta_g"] == 1.0
