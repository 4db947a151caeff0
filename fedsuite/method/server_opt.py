"""Server optimisers (FedAdam, FedYogi, FedAdagrad, FedAvgM) as one step over explicit state.

Each step takes the optimiser's state, w^t (the model sent in round t) and x̄_t (the round's
validated, data-size-weighted mean of the client models) and returns (w^{t+1}, the new state); it
mutates nothing. With the mean client update Δ̄_t = x̄_t − w^t, element-wise, m_0 = v_0 = 0:

    Adam (Reddi et al., ICLR 2021)     m_t = β₁ m_{t−1} + (1 − β₁) Δ̄_t
                                       v_t = β₂ v_{t−1} + (1 − β₂) Δ̄_t²
                                       w^{t+1} = w^t + η_t m_t / (√v_t + τ)
    Yogi (same paper)                  m_t as Adam's
                                       v_t = v_{t−1} − (1 − β₂) Δ̄_t² sign(v_{t−1} − Δ̄_t²)
                                       w^{t+1} = w^t + η m_t / (√v_t + τ)
    Adagrad (same paper)               m_t as Adam's
                                       v_t = v_{t−1} + Δ̄_t²
                                       w^{t+1} = w^t + η m_t / (√v_t + τ)
    momentum (Hsu et al., FedAvgM)     g_t = w^t − x̄_t
                                       v_t = g_t (t = 1),  v_t = β v_{t−1} + g_t (t > 1)
                                       w^{t+1} = w^t − η v_t

Adam's η_t is :func:`adam_lr`: η, or with bias correction η √(1 − β₂^t) / (1 − β₁^t), t the global
round. Momentum with η = 1 and β = 0 returns x̄_t itself (FedAvg, bit for bit); with β = 0 no v is
kept.

Every array of the model goes through the rule, integer buffers (BatchNorm's
``num_batches_tracked``) included: numpy computes those in float64, and w^{t+1} is cast back to the
model's dtypes (:func:`fedsuite.method.arrays.conform`: integers rounded half to even). Adam's and Yogi's
moments of an integer buffer are float64 from their first step on. Momentum steps from its own
unrounded iterate where the model had to round it (``Momentum.unrounded``), so an integer buffer
follows w^{t+1} = w^t − η v_t without accumulating rounding.

The arithmetic is fixed, operation for operation, because results committed under ``experiments/``
were computed with it (Flower's FedAdam/FedYogi/FedAvgM, which fedsuite composed with until these
functions replaced them): moments in each array's own dtype (float32 for float32 arrays; the
coefficients are Python floats); Adam's step term η_t m_t / (√v_t + τ) and its sum with w^t in
float64 (η_t is a float64 scalar), then cast back; Yogi's and momentum's steps in the array's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedsuite.method.arrays import NDArrays, conform, copy_arrays


@dataclass(frozen=True)
class Moments:
    """Adam's and Yogi's state: m_{t−1} and v_{t−1}, keyed like the model (None before the first step)."""

    m: NDArrays | None = None
    v: NDArrays | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"m_t": copy_arrays(self.m), "v_t": copy_arrays(self.v)}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Moments:
        return cls(copy_arrays(state["m_t"]), copy_arrays(state["v_t"]))


@dataclass(frozen=True)
class Momentum:
    """Server momentum's state: v_{t−1} (None before the first step, and always with β = 0), and
    ``unrounded``: the last step's w^t of the arrays whose dtype could not hold it (integer
    buffers), before rounding (None when there are none, or before the first step)."""

    v: NDArrays | None = None
    unrounded: NDArrays | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"momentum": copy_arrays(self.v), "unrounded": copy_arrays(self.unrounded)}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Momentum:
        # a checkpoint written before ``unrounded`` was kept starts from the rounded model
        return cls(copy_arrays(state.get("momentum")), copy_arrays(state.get("unrounded")))


def adam_lr(lr: float, beta1: float, beta2: float, t: int, *, bias_correction: bool) -> np.float64:
    """η_t of :func:`adam_step` in global round ``t`` (1-based): η, or η √(1 − β₂^t) / (1 − β₁^t).

    Evaluated as η_t / c · √(1 − β₂^(t+1)) / (1 − β₁^(t+1)) with c that same factor: the value within
    an ulp or two of η_t that fedsuite's runs have used (the implementation it came from applied
    that factor, and fedsuite divided it out again); kept so that their results reproduce bit for bit."""
    target = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t) if bias_correction else lr
    c = math.sqrt(1 - beta2 ** (t + 1.0)) / (1 - beta1 ** (t + 1.0))
    return (target / c) * np.sqrt(1 - np.power(beta2, t + 1.0)) / (1 - np.power(beta1, t + 1.0))


def _zeros(like: NDArrays) -> NDArrays:
    return {k: np.zeros_like(a) for k, a in like.items()}


def _first_moment(m: NDArrays | None, delta: NDArrays, beta1: float) -> NDArrays:
    """m_t = β₁ m_{t−1} + (1 − β₁) Δ̄_t."""
    prev = m if m else _zeros(delta)
    return {k: beta1 * prev[k] + (1 - beta1) * delta[k] for k in prev}


def adam_step(state: Moments, w: NDArrays, mean: NDArrays, *, lr: float, beta1: float, beta2: float,
              tau: float) -> tuple[NDArrays, Moments]:
    """One Adam step (module docstring); ``lr`` is η_t (:func:`adam_lr`). Returns (w^{t+1} in the
    dtypes of ``mean``, the new moments)."""
    beta1, beta2, tau = float(beta1), float(beta2), float(tau)
    delta = {k: mean[k] - w[k] for k in mean}
    m = _first_moment(state.m, delta, beta1)
    prev = state.v if state.v else _zeros(delta)
    v = {k: beta2 * prev[k] + (1 - beta2) * (delta[k] ** 2) for k in prev}
    eta = np.float64(lr)
    new = {k: x + eta * m[k] / (np.sqrt(v[k]) + tau) for k, x in w.items()}
    return conform(new, mean), Moments(m, v)


def yogi_step(state: Moments, w: NDArrays, mean: NDArrays, *, lr: float, beta1: float, beta2: float,
              tau: float) -> tuple[NDArrays, Moments]:
    """One Yogi step (module docstring). Returns (w^{t+1} in the dtypes of ``mean``, the new moments)."""
    lr, beta1, beta2, tau = float(lr), float(beta1), float(beta2), float(tau)
    delta = {k: mean[k] - w[k] for k in mean}
    m = _first_moment(state.m, delta, beta1)
    prev = state.v if state.v else _zeros(delta)
    v = {k: p - (1.0 - beta2) * (delta[k] ** 2) * np.sign(p - delta[k] ** 2) for k, p in prev.items()}
    new = {k: x + lr * m[k] / (np.sqrt(v[k]) + tau) for k, x in w.items()}
    return conform(new, mean), Moments(m, v)


def adagrad_step(state: Moments, w: NDArrays, mean: NDArrays, *, lr: float, beta1: float,
                 tau: float) -> tuple[NDArrays, Moments]:
    """One Adagrad step (module docstring), in the arithmetic of Yogi's. Returns (w^{t+1} in the
    dtypes of ``mean``, the new moments)."""
    lr, beta1, tau = float(lr), float(beta1), float(tau)
    delta = {k: mean[k] - w[k] for k in mean}
    m = _first_moment(state.m, delta, beta1)
    prev = state.v if state.v else _zeros(delta)
    v = {k: p + delta[k] ** 2 for k, p in prev.items()}
    new = {k: x + lr * m[k] / (np.sqrt(v[k]) + tau) for k, x in w.items()}
    return conform(new, mean), Moments(m, v)


def momentum_step(state: Momentum, w: NDArrays, mean: NDArrays, *, lr: float,
                  beta: float) -> tuple[NDArrays, Momentum]:
    """One server-momentum step (module docstring). Returns (w^{t+1} in the dtypes of ``mean``, the
    new state); with η = 1 and β = 0, (``mean``, ``state``) unchanged."""
    lr, beta = float(lr), float(beta)
    if lr == 1.0 and beta == 0.0:
        return dict(mean), state
    unrounded = state.unrounded or {}
    x = {k: unrounded.get(k, a) for k, a in w.items()}
    g = {k: x[k] - mean[k] for k in mean}
    v = None
    if beta > 0.0:
        v = g if state.v is None else {k: beta * state.v[k] + g[k] for k in state.v}
    step = g if v is None else v
    raw = {k: x[k] - lr * step[k] for k in x}
    new = conform(raw, mean)
    kept = {k: a for k, a in raw.items() if a.dtype != new[k].dtype}
    return new, Momentum(v, kept or None)
