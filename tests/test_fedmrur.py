"""FedMRUR and its SAM / momentum family (fedsam, fedasam, fedcm, mofedsam): spec fedmrur.md §8.

Order: closed-form maths of the regulariser, SAM/ASAM/momentum helpers, client rules at hook level
(``make_task``, full local rounds compared with ``torch.equal``), the server rule with hand-built
replies, then real Flower simulations (5 configs) for the equivalences end to end.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from clients.fedasam import FedASAMClient
from clients.fedcm import FedCMClient
import clients.fedmrur
from clients.fedmrur import (HYPERBOLIC, FedMRURClient, euclidean_sq_dist, gradient_share, lift, lorentz_inner,
                             lorentz_sq_dist, manifold_regularizer)
from clients.fedsam import FedSAMClient
from clients.mofedsam import MoFedSAMClient
from clients.sam import asam_perturbation, mix_momentum, sam_perturbation
from fedsuite.method.arrays import tensor_norm, weighted_mean
from fedsuite.method.training import ClientRule, LocalData, run_local_training
from fedsuite.method.wire import MOMENTUM, ClientReply
from tests.conftest import assert_same_arrays, make_strategy, make_task


#: the methods' maths, not how messages travel: the in-process engine (``simulate``, tests/conftest.py)
pytestmark = pytest.mark.inprocess


def naive_sq_dist(z: torch.Tensor, zh: torch.Tensor, beta: float) -> torch.Tensor:
    """−2β − 2⟨lift(z), lift(ẑ)⟩_𝓛 evaluated literally (eq. 4)."""
    return -2 * beta - 2 * lorentz_inner(lift(z, beta), lift(zh, beta))


# ------------------------------------------------------------------------------------------------
# 8.1 the regulariser
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.1, 1.0, 10.0])
def test_lift_lies_on_hyperboloid(beta):
    z = torch.randn(20, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 5
    inner = lorentz_inner(lift(z, beta), lift(z, beta))
    tol = 1e-9 * (1 + (z * z).sum(-1))
    assert torch.all((inner + beta).abs() <= tol)


def test_distance_closed_forms():
    t = lambda *v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    d = lorentz_sq_dist(t(3.0, 4.0), t(0.0, 0.0), 1.0)
    assert d.item() == pytest.approx(2 * math.sqrt(26) - 2, rel=1e-12)  # 8.198039...
    reg, _ = manifold_regularizer(t(3.0, 4.0), t(0.0, 0.0), beta=1.0, sigma=1e4)
    assert reg.item() == pytest.approx(1.00082014, rel=1e-8)
    # equal norms: d² = ‖z − ẑ‖² = 2
    assert lorentz_sq_dist(t(1.0, 0.0), t(0.0, 1.0), 1.0).item() == pytest.approx(2.0, rel=1e-12)
    # collinear, different norms: much smaller than the Euclidean 100
    d5 = lorentz_sq_dist(t(10.0, 0.0), t(20.0, 0.0), 1.0).item()
    assert d5 == pytest.approx(0.497205, abs=1e-6)
    assert euclidean_sq_dist(t(10.0, 0.0), t(20.0, 0.0)).item() == 100.0  # Table 8 variant differs


def test_distance_properties_and_stable_form_equals_naive():
    g = torch.Generator().manual_seed(0)
    for beta in (0.1, 1.0, 5.0):
        z = torch.randn(200, 16, dtype=torch.float64, generator=g) * 3
        zh = torch.randn(200, 16, dtype=torch.float64, generator=g) * 3
        d = lorentz_sq_dist(z, zh, beta)
        assert torch.all(d >= 0)
        torch.testing.assert_close(d, lorentz_sq_dist(zh, z, beta), rtol=1e-12, atol=1e-12)  # symmetric
        torch.testing.assert_close(d, naive_sq_dist(z, zh, beta), rtol=1e-9, atol=1e-9)
        assert torch.all(d <= euclidean_sq_dist(z, zh) + 1e-9)  # d² ≤ ‖z − ẑ‖²
        assert torch.all(lorentz_sq_dist(z, z.clone(), beta) == 0)  # d²(z, z) = 0 exactly
        # equal norms: d² = ‖z − ẑ‖²
        zeq = zh / zh.norm(dim=-1, keepdim=True) * z.norm(dim=-1, keepdim=True)
        torch.testing.assert_close(lorentz_sq_dist(z, zeq, beta), euclidean_sq_dist(z, zeq), rtol=1e-9, atol=1e-9)


def test_distance_stable_in_float32_for_large_norms():
    g = torch.Generator().manual_seed(3)
    z64 = torch.rand(64, 512, dtype=torch.float64, generator=g) * 100  # ‖z‖ ~ 1.3e3, post-ReLU-like
    for noise in (1e-3, 1e-1, 10.0):
        zh64 = (z64 + noise * torch.randn(64, 512, dtype=torch.float64, generator=g)).clamp_min(0)
        ref = lorentz_sq_dist(z64, zh64, 1.0)
        d32 = lorentz_sq_dist(z64.float(), zh64.float(), 1.0)
        assert torch.isfinite(d32).all() and (d32 >= 0).all()
        torch.testing.assert_close(d32.double(), ref, rtol=2e-3, atol=1e-6)
    # huge and opposite vectors: no NaN/inf, still ≥ 0
    big = torch.full((4, 512), 1e5)
    for other in (big * 1.0001, -big, torch.zeros_like(big)):
        d = lorentz_sq_dist(big, other, 1.0)
        assert torch.isfinite(d).all() and (d >= 0).all()
    # the exponent is clamped: R stays finite even for d² ≫ σ
    reg, _ = manifold_regularizer(big, -big, beta=1.0, sigma=1e4)
    assert torch.isfinite(reg) and reg.item() == pytest.approx(math.exp(50.0), rel=1e-5)


def test_regularizer_gradient_is_zero_at_the_global_model():
    task, _ = make_task({"strategy": "fedmrur", "fedmrur.gamma": 0.5})
    rule = FedMRURClient()
    rule.run_start(task)
    x, y = next(task.data.batches(32, task.generator))
    rule.prepare_batch(task, x, y)
    z = task.model.features(x)
    reg, d2 = manifold_regularizer(z, rule.z_global, beta=1.0, sigma=1e4)
    assert torch.all(d2 == 0) and reg.item() == 1.0
    grads = torch.autograd.grad(reg, task.params, allow_unused=True)
    assert all(g is None or torch.all(g == 0) for g in grads)
    # ... and it is not zero once the local model has moved
    with torch.no_grad():
        for p in task.params:
            p.add_(0.1 * torch.randn_like(p))
    z = task.model.features(x)
    reg, d2 = manifold_regularizer(z, rule.z_global, beta=1.0, sigma=1.0)
    assert d2.min() > 0 and reg.item() > 1.0
    grads = torch.autograd.grad(reg, task.params, allow_unused=True)
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


# ------------------------------------------------------------------------------------------------
# 8.2 SAM / ASAM / momentum helpers and client steps
# ------------------------------------------------------------------------------------------------


def test_sam_perturbation_has_norm_rho():
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, 3, generator=g), torch.randn(7, generator=g) * 100]
    for rho in (0.05, 0.5, 2.0):
        e = sam_perturbation(grads, rho)
        assert tensor_norm(e).item() == pytest.approx(rho, rel=1e-6)
        for ei, gi in zip(e, grads):  # direction of g
            torch.testing.assert_close(ei, gi * (rho / tensor_norm(grads)), rtol=1e-5, atol=1e-9)
    assert all(torch.all(ei == 0) for ei in sam_perturbation(grads, 0.0))


def test_asam_perturbation_formula():
    g = torch.Generator().manual_seed(1)
    names = ["fc.weight", "fc.bias"]
    params = [torch.randn(4, 3, generator=g), torch.randn(4, generator=g)]
    grads = [torch.randn(4, 3, generator=g), torch.randn(4, generator=g)]
    rho, eta = 0.1, 0.01
    t = params[0].abs() + eta
    tg = [t * grads[0], grads[1]]
    norm = torch.sqrt((tg[0] ** 2).sum() + (tg[1] ** 2).sum())
    e = asam_perturbation(names, params, grads, rho, eta)
    torch.testing.assert_close(e[0], rho * t * t * grads[0] / norm)
    torch.testing.assert_close(e[1], rho * grads[1] / norm)  # T = 1 on non-weight tensors
    # ‖T⁻¹ e‖ = ρ: the perturbation has radius ρ in the adaptive norm
    assert tensor_norm([e[0] / t, e[1]]).item() == pytest.approx(rho, rel=1e-5)


def test_mix_momentum():
    g = torch.Generator().manual_seed(2)
    grads = [torch.randn(6, generator=g), torch.randn(2, 2, generator=g)]
    mom = [torch.randn(6, generator=g), None]
    exact = [x.clone() for x in grads]
    mix_momentum(exact, mom, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(exact, grads))  # α = 1: u = g bit for bit
    mixed = [x.clone() for x in grads]
    mix_momentum(mixed, mom, 0.3)
    torch.testing.assert_close(mixed[0], 0.3 * grads[0] + 0.7 * mom[0])
    torch.testing.assert_close(mixed[1], 0.3 * grads[1])  # absent m = 0


def _momentum_for(task, seed: int = 5, scale: float = 0.5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: scale * torch.randn(p.shape, generator=g) for n, p in task.model.named_parameters()}


def _small_task(values: dict, n: int = 96, **kwargs):
    """make_task with the client's data cut to its first ``n`` samples (3 steps of 32), for speed."""
    task, cfg = make_task(values, **kwargs)
    task.data = LocalData(x=task.data.x[:n], y=task.data.y[:n], bundle=task.data.bundle, augment=task.data.augment)
    return task, cfg


def _round(rule, values: dict, momentum_seed: int | None = 5, server_round: int = 2):
    """One full local round of ``rule`` on (part of) the FAST client 0, optionally with a momentum."""
    task, _ = _small_task(values, server_round=server_round)
    if momentum_seed is not None:
        task.extras[MOMENTUM] = _momentum_for(task, momentum_seed)
    result = run_local_training(rule, task)
    return result, task


def _assert_same_round(a, b):
    ra, rb = a[0], b[0]
    assert list(ra.arrays) == list(rb.arrays)
    for k in ra.arrays:
        assert torch.equal(ra.arrays[k], rb.arrays[k]), k
    assert ra.metrics["train-loss"] == rb.metrics["train-loss"]
    assert ra.metrics["num-steps"] == rb.metrics["num-steps"]


def test_sam_second_pass_uses_perturbed_gradient_and_restores_weights():
    task, _ = make_task({"strategy": "mofedsam", "mofedsam.rho": 0.5})
    rule = MoFedSAMClient()
    rule.run_start(task)
    x, y = next(task.data.batches(32, task.generator))
    before = [p.detach().clone() for p in task.params]
    loss = rule.loss(task, x, y)
    loss.backward()
    g = [p.grad.clone() for p in task.params]
    rule.sam_second_pass(task, task.params, 0.5, lambda: rule.loss(task, x, y))
    assert all(torch.equal(p, w) for p, w in zip(task.params, before))  # restored exactly
    e = rule.perturbation
    assert tensor_norm(e).item() == pytest.approx(0.5, rel=1e-5)
    # reference: the gradient of the loss at w + e, computed on a copy
    ref_task, _ = make_task({"strategy": "mofedsam"})
    with torch.no_grad():
        for p, gi in zip(ref_task.params, g):
            p.add_(0.5 * gi / (tensor_norm(g) + 1e-7))
    rule.loss(ref_task, x, y).backward()
    for p, q in zip(task.params, ref_task.params):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)


def test_fedcm_one_step_matches_formula():
    """One local step with momentum: w − η(α g + (1−α) m + λ w) (spec §2.3, §8.2 items 10, 12)."""
    vals = {"strategy": "fedcm", "fedcm.alpha": 0.3, "fedcm.clip_norm": 0.0, "weight_decay": 0.01, "lr": 0.1}
    task, _ = make_task(vals)
    mom = _momentum_for(task)
    task.extras[MOMENTUM] = mom
    rule = FedCMClient()
    rule.run_start(task)
    opt = rule.run_make_optimizer(task)
    x, y = next(task.data.batches(32, task.generator))
    w0 = {n: p.detach().clone() for n, p in task.model.named_parameters()}
    ref, _ = make_task(vals)
    ClientRule().loss(ref, x, y).backward()
    grads = {n: p.grad for n, p in ref.model.named_parameters()}
    rule.step(task, opt, x, y)
    for n, p in task.model.named_parameters():
        expected = w0[n] - 0.1 * (0.3 * grads[n] + 0.7 * mom[n] + 0.01 * w0[n])
        torch.testing.assert_close(p.detach(), expected, rtol=1e-5, atol=1e-6)


def test_fedcm_pure_momentum_displacement():
    """With γ = ρ = 0 and a zero data gradient (lr-free check): K steps move w by −K η (1−α) m."""
    vals = {"strategy": "fedcm", "fedcm.alpha": 0.25, "fedcm.clip_norm": 0.0, "lr": 0.05}
    task, _ = _small_task(vals, n=90)
    mom = _momentum_for(task)
    task.extras[MOMENTUM] = mom

    class ZeroLoss(FedCMClient):
        def loss(self, task, x, y):
            return 0.0 * super().loss(task, x, y)

    w0 = {n: p.detach().clone() for n, p in task.model.named_parameters()}
    result = run_local_training(ZeroLoss(), task)
    k = result.metrics["num-steps"]
    assert k == math.ceil(90 / 32) == 3  # K_i = E·⌈n_i/B⌉ (spec §8.2 item 13)
    for n, _ in task.model.named_parameters():
        torch.testing.assert_close(result.arrays[n] - w0[n], -k * 0.05 * 0.75 * mom[n], rtol=1e-4, atol=1e-6)


def test_fedmrur_logs_distances_and_is_finite():
    rule = FedMRURClient()
    result, task = _round(rule, {"strategy": "fedmrur", "fedmrur.sigma": 1.0, "lr": 0.2})
    m = result.metrics
    assert m["fedmrur-d2-max"] >= m["fedmrur-d2-mean"] > 0  # the local model moved within the round
    assert m["fedmrur-R-mean"] >= 1.0
    assert all(torch.isfinite(v).all() for v in result.arrays.values())
    assert rule.global_model is None  # the frozen w^t is released with the round


# --- the regulariser's activity: its share of the step (issue 39, item 2) ---------------------


def test_gradient_share_closed_form():
    """‖∇ term‖ / ‖∇ base‖ over all parameters jointly: base = a·w + ‖v‖², term = c (b·w) gives
    ‖c b‖ / ‖(a, 2v)‖; a zero term gives 0, and the graph stays usable for the step's backward."""
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    v = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    a, b, c = torch.tensor([2.0, 0.0, 1.0]), torch.tensor([1.0, 2.0, 2.0]), 0.25
    base = (a * w).sum() + (v * v).sum()
    term = c * (b * w).sum()
    expected = c * 3.0 / math.sqrt(5.0 + 4 * 25.0)  # ‖b‖ = 3, ‖(a, 2v)‖² = 5 + 100
    assert gradient_share(term, base, [w, v]) == pytest.approx(expected, rel=1e-12)
    assert w.grad is None and v.grad is None  # no gradient written
    (base + term).backward()  # the graph was retained
    torch.testing.assert_close(w.grad, a + c * b)
    assert gradient_share(0.0 * (w * w).sum(), (w * v[:1]).sum(), [w, v]) == 0.0


def test_hyperbolic_share_zero_when_off_inert_by_default_and_active_when_strong():
    """γ = 0 and the regulariser off both report a share of exactly 0 (below any threshold); FAST's
    client at the paper's γ = 0.005, σ = 10^4 gives a share far below 1e-3 (exp(d²/σ) is flat for
    d² ≪ σ); γ = 0.5, σ = 1 pulls with a share far above it. Measured once, on the last local step."""
    shares = {}
    for name, values in {"gamma0": {"fedmrur.gamma": 0.0}, "off": {"fedmrur.hyperbolic": False}, "paper": {},
                         "strong": {"fedmrur.gamma": 0.5, "fedmrur.sigma": 1.0}}.items():
        rule = FedMRURClient()
        result, task = _round(rule, {"strategy": "fedmrur", **values})
        shares[name] = result.metrics[HYPERBOLIC.measure]
        assert task.num_steps == task.planned_steps == 3
        if name != "off":
            assert rule.measured_step == task.num_steps - 1
    assert shares["gamma0"] == 0.0 and shares["off"] == 0.0
    assert 0 < shares["paper"] < HYPERBOLIC.threshold / 100
    assert shares["strong"] > 100 * HYPERBOLIC.threshold
    assert HYPERBOLIC.threshold == 1e-3 and HYPERBOLIC.name == "fedmrur.hyperbolic"


def test_hyperbolic_share_is_measured_at_the_last_step_where_the_gradient_is_not_zero(monkeypatch):
    """The first local step has z = ẑ, so ∇R = 0 there whatever γ: a share measured there would
    always read 0. The rule measures once a round (on its last step), and what it reports is that
    measurement."""
    calls = []
    real = clients.fedmrur.gradient_share

    def recorded(term, base, params):
        calls.append(real(term, base, params))
        return calls[-1]

    monkeypatch.setattr(clients.fedmrur, "gradient_share", recorded)
    rule = FedMRURClient()
    result, task = _round(rule, {"strategy": "fedmrur", "fedmrur.gamma": 0.5, "fedmrur.sigma": 1.0})
    assert len(calls) == 1 and result.metrics[HYPERBOLIC.measure] == calls[0] > 0
    # at the first step (w = w^t) the same measure is exactly 0
    task, _ = _small_task({"strategy": "fedmrur", "fedmrur.gamma": 0.5, "fedmrur.sigma": 1.0})
    rule = FedMRURClient()
    rule.run_start(task)
    x, y = next(task.data.batches(32, task.generator))
    rule.prepare_batch(task, x, y)
    z, logits = rule._features(task.model, x, task)
    reg, _ = manifold_regularizer(z, rule.z_global, beta=1.0, sigma=1.0)
    assert real(0.5 * reg, torch.nn.functional.cross_entropy(logits, y), task.params) == 0.0


def test_measuring_the_share_does_not_change_training(monkeypatch):
    """The same round with the share measured and with the measurement switched off (a
    ``gradient_share`` that computes nothing): the trained model, the extras, every metric but the
    share, the round's generator and torch's global RNG state are identical bit for bit, at a γ
    where the regulariser acts and with SAM's second pass."""
    values = {"strategy": "fedmrur", "fedmrur.gamma": 0.5, "fedmrur.sigma": 1.0}

    def one_round():
        torch.manual_seed(11)
        result, task = _round(FedMRURClient(), values)
        return result, task, torch.get_rng_state(), task.generator.get_state()

    measured, task_m, rng_m, gen_m = one_round()
    monkeypatch.setattr(clients.fedmrur, "gradient_share", lambda term, base, params: -1.0)
    unmeasured, task_u, rng_u, gen_u = one_round()
    assert measured.metrics[HYPERBOLIC.measure] > 0 and unmeasured.metrics[HYPERBOLIC.measure] == -1.0
    _assert_same_round((measured, task_m), (unmeasured, task_u))
    assert {k: v for k, v in measured.metrics.items() if k != HYPERBOLIC.measure} == \
        {k: v for k, v in unmeasured.metrics.items() if k != HYPERBOLIC.measure}
    assert torch.equal(rng_m, rng_u) and torch.equal(gen_m, gen_u)


# --- equivalences at hook level (same LocalTask, compared with torch.equal) --------------------


def test_fedmrur_gamma0_no_normalisation_equals_mofedsam():
    a = _round(FedMRURClient(), {"strategy": "fedmrur", "fedmrur.gamma": 0.0, "fedmrur.normalize": False})
    b = _round(MoFedSAMClient(), {"strategy": "mofedsam"})
    _assert_same_round(a, b)
    assert a[0].metrics["fedmrur-d2-mean"] > 0  # the regulariser was computed, only weighted by 0
    c = _round(FedMRURClient(), {"strategy": "fedmrur", "fedmrur.hyperbolic": False})
    _assert_same_round(c, b)
    d = _round(FedMRURClient(), {"strategy": "fedmrur", "fedmrur.gamma": 0.5, "fedmrur.sigma": 1.0})
    assert any(not torch.equal(d[0].arrays[k], b[0].arrays[k]) for k in b[0].arrays)  # γ > 0 matters


def test_mofedsam_rho0_equals_fedcm():
    a = _round(MoFedSAMClient(), {"strategy": "mofedsam", "mofedsam.rho": 0.0})
    b = _round(FedCMClient(), {"strategy": "fedcm"})
    _assert_same_round(a, b)
    c = _round(MoFedSAMClient(), {"strategy": "mofedsam"})
    assert any(not torch.equal(c[0].arrays[k], b[0].arrays[k]) for k in b[0].arrays)  # ρ > 0 matters


@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_fedcm_alpha1_equals_fedavg(clip):
    """α = 1 with a non-zero momentum present: 1.0·g + 0.0·m = g; clipping as FedAvg's grad_clip."""
    fedavg_vals = {"strategy": "fedavg", "weight_decay": 1e-3, **({"grad_clip": clip} if clip else {})}
    a = _round(FedCMClient(), {"strategy": "fedcm", "fedcm.alpha": 1.0, "fedcm.clip_norm": clip, "weight_decay": 1e-3})
    b = _round(ClientRule(), fedavg_vals)
    _assert_same_round(a, b)
    c = _round(FedCMClient(), {"strategy": "fedcm", "fedcm.alpha": 0.5, "fedcm.clip_norm": clip, "weight_decay": 1e-3})
    assert any(not torch.equal(c[0].arrays[k], b[0].arrays[k]) for k in b[0].arrays)


def test_sam_family_reductions():
    fedavg = _round(ClientRule(), {"strategy": "fedavg", "momentum": 0.5}, momentum_seed=None)
    # FedSAM(ρ=0) = FedAvg; FedASAM(ρ=0) = FedAvg (also with SGD momentum)
    _assert_same_round(_round(FedSAMClient(), {"strategy": "fedsam", "fedsam.rho": 0.0, "fedsam.clip_norm": 0.0,
                                               "momentum": 0.5}, momentum_seed=None), fedavg)
    _assert_same_round(_round(FedASAMClient(), {"strategy": "fedasam", "fedasam.rho": 0.0, "momentum": 0.5},
                              momentum_seed=None), fedavg)
    # MoFedSAM(α=1) = FedSAM, even with a momentum record present
    _assert_same_round(_round(MoFedSAMClient(), {"strategy": "mofedsam", "mofedsam.alpha": 1.0}),
                       _round(FedSAMClient(), {"strategy": "fedsam"}))
    # and ρ > 0 does change FedASAM
    asam = _round(FedASAMClient(), {"strategy": "fedasam", "momentum": 0.5}, momentum_seed=None)
    assert any(not torch.equal(asam[0].arrays[k], fedavg[0].arrays[k]) for k in fedavg[0].arrays)


# ------------------------------------------------------------------------------------------------
# 8.3 the server rule, with hand-built replies
# ------------------------------------------------------------------------------------------------


#: w^0 of the server rules below (conftest's ``make_strategy``, 10 clients)
TEMPLATE = {"a": np.zeros(3), "b": np.zeros((2, 2))}


def _reply(pid, arrays, n=10, steps=5):
    return ClientReply(pid, arrays, n, {"num-examples": float(n), "num-steps": float(steps)}, {})


def _flat(arrays) -> np.ndarray:
    return np.concatenate([np.ravel(v) for v in arrays.values()])


def test_normalised_aggregate_has_mean_norm_and_direction_of_sum():
    rng = np.random.default_rng(0)
    s = make_strategy("fedmrur", TEMPLATE, num_clients=10)
    w_t = {"a": rng.normal(size=3), "b": rng.normal(size=(2, 2))}
    s.global_arrays = w_t
    deltas = [{k: rng.normal(size=v.shape) * (i + 1) for k, v in w_t.items()} for i in range(4)]
    replies = [_reply(i, {k: w_t[k] + d[k] for k in w_t}, n=10 * (i + 1)) for i, d in enumerate(deltas)]
    new = s.aggregate(1, replies)
    step = _flat(new) - _flat(w_t)
    total = sum(_flat(d) for d in deltas)
    mean_norm = np.mean([np.linalg.norm(_flat(d)) for d in deltas])  # unweighted even with unequal n_i
    assert np.linalg.norm(step) == pytest.approx(mean_norm, rel=1e-12)
    assert step @ total / (np.linalg.norm(step) * np.linalg.norm(total)) == pytest.approx(1.0, rel=1e-12)
    d_t = s.round_log.columns["norm_factor"]
    assert 1.0 <= d_t <= 4.0
    np.testing.assert_allclose(step, d_t * total / 4, rtol=1e-12)


def test_normalised_aggregate_special_cases():
    s = make_strategy("fedmrur", TEMPLATE, num_clients=10)
    s.global_arrays = {"a": np.zeros(3), "b": np.zeros((2, 2))}
    e1 = {"a": np.array([2.0, 0, 0]), "b": np.zeros((2, 2))}
    e2 = {"a": np.array([0, 2.0, 0]), "b": np.zeros((2, 2))}
    # orthogonal, equal norm r = 2: plain mean has norm r/√2, normalised r; result (Δ1+Δ2)/√2 = √2·mean
    new = s.aggregate(1, [_reply(0, e1), _reply(1, e2)])
    np.testing.assert_allclose(new["a"], np.array([2, 2, 0]) / math.sqrt(2), rtol=1e-12)
    assert s.round_log.columns["norm_factor"] == pytest.approx(math.sqrt(2))
    # identical updates → the plain mean; S = 1 → Δ_1
    np.testing.assert_allclose(s.aggregate(1, [_reply(0, e1), _reply(1, e1)])["a"], e1["a"], rtol=1e-12)
    np.testing.assert_allclose(s.aggregate(1, [_reply(0, e2)])["a"], e2["a"], rtol=1e-12)
    # cancelling updates → finite, ≈ 0
    neg = {k: -v for k, v in e1.items()}
    out = s.aggregate(1, [_reply(0, e1), _reply(1, neg)])
    assert all(np.isfinite(v).all() and np.abs(v).max() < 1e-9 for v in out.values())


def test_plain_aggregate_equals_fedavg_and_uniform_mean():
    rng = np.random.default_rng(1)
    t32 = {"a": rng.normal(size=5).astype(np.float32), "b": rng.normal(size=(3, 2)).astype(np.float32)}
    replies = [_reply(i, {k: (v + rng.normal(size=v.shape)).astype(np.float32) for k, v in t32.items()}, n=7 + 13 * i)
               for i in range(3)]
    s = make_strategy("fedmrur", t32, num_clients=10, **{"fedmrur.normalize": False, "fedmrur.weighting": "examples"})
    assert_same_arrays(s.aggregate(1, replies), weighted_mean([r.arrays for r in replies],
                                                              [r.num_examples for r in replies], t32))
    s = make_strategy("fedmrur", t32, num_clients=10, **{"fedmrur.normalize": False})  # paper: unweighted 1/S (A26)
    assert_same_arrays(s.aggregate(1, replies), weighted_mean([r.arrays for r in replies], [1, 1, 1], t32))
    # global lr: w^t + η_g Δ̄
    s = make_strategy("fedmrur", t32, num_clients=10, **{"fedmrur.normalize": False, "fedmrur.server_lr": 2.0})
    mean = weighted_mean([r.arrays for r in replies], [1, 1, 1], t32)
    for k in t32:
        np.testing.assert_allclose(s.aggregate(1, replies)[k], t32[k] + 2.0 * (mean[k] - t32[k]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("decay", [1.0, 0.9])
def test_momentum_recursion_linear_loss(normalize, decay):
    """Spec §8.3 item 19: one client, constant gradient c, ρ = γ = wd = 0, no clipping:
    Δ = −K η_t (α c + (1−α) m^t)  ⇒  m^t = c (1 − (1−α)^t); the conversion uses round t's lr."""
    alpha, k_steps, lr = 0.1, 5, 0.1
    s = make_strategy("fedmrur", TEMPLATE, num_clients=10,
                      **{"fedmrur.normalize": normalize, "fedmrur.alpha": alpha, "lr": lr, "lr_decay": decay})
    c = {"a": np.array([1.0, -2.0, 0.5]), "b": np.array([[0.3, 0.0], [-1.0, 2.0]])}
    w = {k: np.zeros_like(v) for k, v in c.items()}
    for t in range(1, 4):
        s.global_arrays = w
        m = s.momentum or {k: np.zeros_like(v) for k, v in c.items()}
        eta = s.local_lr(t)
        assert eta == pytest.approx(lr * decay ** (t - 1))
        w_i = {k: w[k] - k_steps * eta * (alpha * c[k] + (1 - alpha) * m[k]) for k in c}
        w = s.aggregate(t, [_reply(0, w_i, steps=k_steps)])
        for key in c:
            np.testing.assert_allclose(s.momentum[key], c[key] * (1 - (1 - alpha) ** t), rtol=1e-12, atol=1e-15)


def test_momentum_is_sent_and_checkpointed():
    from flwr.app import ConfigRecord

    from fedsuite.method.wire import to_record

    s = make_strategy("fedmrur", TEMPLATE, num_clients=10)
    w0 = to_record(s.global_arrays)
    assert MOMENTUM not in s.client_payload(1, 0, w0, ConfigRecord({})).array_records  # m^0 = 0 omitted
    s.aggregate(1, [_reply(0, {"a": np.ones(3), "b": np.ones((2, 2))}), _reply(1, {"a": -np.ones(3) * 0.5,
                                                                                      "b": np.ones((2, 2))})])
    payload = s.client_payload(2, 3, w0, ConfigRecord({}))
    sent = {k: v.numpy() for k, v in payload[MOMENTUM].items()}
    assert_same_arrays(sent, s.momentum)
    assert {k: v.shape for k, v in sent.items()} == {k: v.shape for k, v in s.template.items()}
    # state round-trip
    s2 = make_strategy("fedmrur", TEMPLATE, num_clients=10)
    s2.load_state_dict(s.state_dict())
    assert_same_arrays(s2.momentum, s.momentum)
    assert_same_arrays({k: v.numpy() for k, v in s2.client_payload(2, 3, w0, ConfigRecord({}))[MOMENTUM].items()},
                       sent)


# ------------------------------------------------------------------------------------------------
# real Flower simulations (5 configs, FAST defaults)
# ------------------------------------------------------------------------------------------------

# these tests run on test_fedmr.py's xdist worker, whose session cache already holds the FAST FedAvg
# run (so it starts once for both files); tests/test_registry_e2e.py's fedcm and fedmrur runs are the
# default-knob runs below (same overrides, same group)
SIM_GROUP = pytest.mark.xdist_group("test_fedmr")

COMPARED = ("round", "test_accuracy", "test_loss", "train_loss", "cohort")


def _rows(sim):
    return [{k: r.get(k) for k in COMPARED} for r in sim.rows]


@SIM_GROUP
def test_sim_fedcm_alpha1_equals_fedavg(simulate):
    fedavg = simulate(strategy="fedavg")
    fedcm = simulate(strategy="fedcm", **{"fedcm.alpha": 1.0, "fedcm.weighting": "examples", "fedcm.clip_norm": 0.0})
    assert_same_arrays(fedcm.arrays, fedavg.arrays)
    assert _rows(fedcm) == _rows(fedavg)
    assert fedcm.checkpoint["strategy"]["method"]["momentum"] is not None  # momentum was computed and sent
    assert fedcm.rows[-1]["bytes_sent"] > fedavg.rows[-1]["bytes_sent"]  # ... at 2× the downlink


@SIM_GROUP
def test_sim_mofedsam_rho0_equals_fedcm(simulate):
    fedcm = simulate(strategy="fedcm")
    mofedsam = simulate(strategy="mofedsam", **{"mofedsam.rho": 0.0})
    assert_same_arrays(mofedsam.arrays, fedcm.arrays)
    assert _rows(mofedsam) == _rows(fedcm)
    assert_same_arrays(mofedsam.checkpoint["strategy"]["method"]["momentum"], fedcm.checkpoint["strategy"]["method"]["momentum"])


@SIM_GROUP
def test_sim_fedmrur_runs_and_logs(simulate):
    sim = simulate(strategy="fedmrur")
    rows = sim.rows[1:]
    assert len(rows) == 2
    for r in rows:
        assert 1.0 <= r["norm_factor"] <= 4.0 + 1e-9  # d_t ∈ [1, S]
        assert r["global_update_norm"] == pytest.approx(r["mean_client_update_norm"], rel=1e-9)
        assert r["fedmrur-R-mean"] >= 1.0 and r["fedmrur-d2-mean"] >= 0
        assert math.isfinite(r["test_loss"])
        assert 0 < r[HYPERBOLIC.measure] < HYPERBOLIC.threshold  # the paper's γ, σ: the term barely pulls
    # the summary says how much the regulariser acted: inert at the paper's γ = 0.005, σ = 10^4 here
    activity = sim.summary["activity"]
    assert list(activity) == ["fedmrur.hyperbolic"]
    shares = [r[HYPERBOLIC.measure] for r in rows]
    assert activity["fedmrur.hyperbolic"] == {
        "measure": HYPERBOLIC.measure, "mean": pytest.approx(sum(shares) / 2, rel=1e-12), "last": shares[-1],
        "threshold": 1e-3, "rounds": 2, "inert": True}
    momentum = sim.checkpoint["strategy"]["method"]["momentum"]
    assert set(momentum) <= set(sim.arrays) and all(np.isfinite(v).all() for v in momentum.values())
    assert all(np.isfinite(v).all() for v in sim.arrays.values())


def test_report_draws_the_server_momentum_with_the_loop_limit_of_the_normalised_reading(simulate, tmp_path):
    """``fedsuite report`` over runs that record a server momentum writes momentum.png, and draws
    1/(1−α) only for the setting whose momentum is built from the normalised update (the default
    reading): there m^{t+1} ≈ d_t (α ḡ + (1−α) m^t), which grows while d_t > 1/(1−α). FedAvg records
    no momentum and draws none; a report of FedAvg alone has no momentum.png."""
    from typer.testing import CliRunner

    from fedsuite.cli.main import app
    from fedsuite.records.results import report

    normalised = simulate(strategy="fedmrur")
    from_mean = simulate(strategy="fedmrur", **{"fedmrur.momentum_source": "mean"})
    fedavg = simulate(strategy="fedavg")
    runs = [normalised.run_dir, from_mean.run_dir, fedavg.run_dir]
    assert all(r["momentum_norm"] > 0 for sim in (normalised, from_mean) for r in sim.rows[1:])
    rows = report(runs)[0]
    labels = [row["group"] for row in rows]
    assert [row["momentum_loop_limit"] for row in rows] == [pytest.approx(1 / (1 - 0.1), rel=1e-12), None, None]
    assert "momentum_source=normalized" in labels[0] and "momentum_source=mean" in labels[1]
    out = CliRunner().invoke(app, ["report", *map(str, runs), "--output-dir", str(tmp_path / "all")])
    assert out.exit_code == 0, out.stdout
    assert (tmp_path / "all" / "momentum.png").read_bytes()[:4] == b"\x89PNG"
    out = CliRunner().invoke(app, ["report", str(fedavg.run_dir), "--output-dir", str(tmp_path / "fedavg")])
    assert out.exit_code == 0, out.stdout
    assert not (tmp_path / "fedavg" / "momentum.png").exists() and (tmp_path / "fedavg" / "accuracy.png").is_file()


def test_family_rules_read_their_typed_section_and_a_key_it_lacks_is_an_error():
    """One parameter route (issue 11): a rule reads ``task.method_params``, the method's validated
    section. What used to be ``getattr(section, key, default)`` fell back silently on a key the section
    lacks (a misspelling, or a rule paired with the wrong method); now it raises."""
    from clients.sam import SamMomentumClient

    class NeedsRho(SamMomentumClient):
        sam = True

    task, _ = make_task({"strategy": "fedcm"})  # FedCM's section has alpha and clip_norm, no rho
    with pytest.raises(AttributeError, match="rho"):
        run_local_training(NeedsRho(), task)
    task, _ = make_task({"strategy": "mofedsam", "mofedsam.rho": 0.25})
    assert task.method_params.rho == 0.25 and task.config.keys() == {"server-round", "lr"}
