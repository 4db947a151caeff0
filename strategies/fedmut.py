"""FedMut: mutation-based federated learning (Hu et al., AAAI 2024), as defined by the FedMR
authors' ``Training_FedMut.py`` (the FedMR paper compares with FedMut without defining it).

Pool of K models (``strategies.pool``), initially K copies of w^0; w_old = w^0. Round r (1-based
server round; the code's 0-based index is r-1):

    w_glb = (1/K) Σ_i v_i                          (uniform mean of the pool after training)
    Δ     = w_glb − w_old                          ("gradient" of the global model)
    β_r   = β0 · (1 − min((r−1)/T_mut, 1))         (acceleration weight, reaches 0 at r−1 = T_mut)
    for every state_dict entry ℓ: c_ℓ = a uniform random arrangement of ⌊K/2⌋ values +1 and
        ⌊K/2⌋ values (−1+β_r) over the first 2⌊K/2⌋ slots, and 0 for the last slot when K is odd
    P[j][ℓ] = w_glb[ℓ] + α · c_{ℓ,j} · Δ[ℓ]
    w_old ← w_glb;  w_glb is the reported/evaluated model.

The code builds ⌊K/2⌋ pairs (+1, −1+β_r), orders each pair at random and then shuffles all of them;
the result is a uniform arrangement of that multiset, which is what is drawn here. The pool mean is
w_glb + (α β_r ⌊K/2⌋ / K) Δ, so it equals w_glb exactly once β_r = 0.

Integer buffers (BatchNorm's ``num_batches_tracked``) are not mutated: every slot gets w_glb's value.
Floating entries are mutated in float64 and cast back to their dtype.

Options (section ``[fedmut]``): ``radius`` α = 5.0, ``mut_acc_rate`` β0 = 0.3, ``mut_bound``
T_mut = 100 (FedMR repo defaults, since the FedMR paper does not state them; the stand-alone FedMut repo uses
α = 4.0, T_mut = 50).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from clients.fedavg import FedAvgClient
from fedsuite.method.arrays import NDArrays
from fedsuite.method.registry import register_method
from fedsuite.method.seeding import round_rng
from fedsuite.method.strategy import ServerSetup
from fedsuite.method.wire import ClientReply
from strategies.pool import POOL_RECORDS, MUT_TAG, PoolParams, PoolStrategy


def mutation_beta(server_round: int, beta0: float, bound: int) -> float:
    """β_r = β0 · (1 − min((r−1)/T_mut, 1)) for the 1-based round r (T_mut = 0: β_r = 0)."""
    if bound <= 0:
        return 0.0
    return beta0 * (1.0 - min((server_round - 1) / bound, 1.0))


def mutation_coefficients(rng: np.random.Generator, n_units: int, k: int, beta: float) -> np.ndarray:
    """[n_units, K] coefficients: per row ⌊K/2⌋ × (+1) and ⌊K/2⌋ × (−1+β) in random order over the
    first 2⌊K/2⌋ columns, and 0 in the last column when K is odd."""
    half = k // 2
    base = np.array([1.0] * half + [-1.0 + beta] * half, dtype=np.float64)
    coeffs = np.zeros((n_units, k), dtype=np.float64)
    if half:
        coeffs[:, : 2 * half] = rng.permuted(np.tile(base, (n_units, 1)), axis=1)
    return coeffs


def mutate(w_glb: NDArrays, delta: dict[str, np.ndarray], coeffs: np.ndarray, radius: float) -> list[NDArrays]:
    """P[j][ℓ] = w_glb[ℓ] + α · c_{ℓ,j} · Δ[ℓ] (row ℓ of ``coeffs`` = the ℓ-th key of ``w_glb``).
    Integer entries are copied from ``w_glb`` unchanged."""
    keys = list(w_glb)
    if coeffs.shape[0] != len(keys):
        raise ValueError(f"coeffs has {coeffs.shape[0]} rows for {len(keys)} entries")
    k = coeffs.shape[1]
    pool: list[NDArrays] = [{} for _ in range(k)]
    for row, key in enumerate(keys):
        ref = w_glb[key]
        if not np.issubdtype(ref.dtype, np.floating):
            for j in range(k):
                pool[j][key] = ref
            continue
        base, d = ref.astype(np.float64), delta[key]
        for j in range(k):
            c = coeffs[row, j]
            pool[j][key] = ref if c == 0.0 else (base + (radius * c) * d).astype(ref.dtype)
    return pool


class FedMutParams(PoolParams):
    """FedMut's hyperparameters (section ``[fedmut]``); ``diagnostics``: :class:`strategies.pool.PoolParams`."""

    radius: float = Field(5.0, ge=0, description="mutation radius alpha")
    mut_acc_rate: float = Field(0.3, ge=0, le=1, description="beta0, initial acceleration weight")
    mut_bound: int = Field(100, ge=0, description="T_mut: rounds over which beta decays to 0")


class FedMutStrategy(PoolStrategy):
    """FedMut: per-client models mutated around the uniform mean along the last global step."""

    def __init__(self, setup: ServerSetup) -> None:
        super().__init__(setup)
        self.w_old: NDArrays = dict(setup.initial)
        self._beta = 0.0

    def next_pool(self, server_round: int, replies: list[ClientReply], model: NDArrays) -> list[NDArrays]:
        p = self.params
        delta = {k: model[k].astype(np.float64) - self.w_old[k].astype(np.float64)
                 for k, v in model.items() if np.issubdtype(v.dtype, np.floating)}
        self._beta = mutation_beta(server_round, p.mut_acc_rate, p.mut_bound)
        coeffs = mutation_coefficients(round_rng(self.cfg.seed, server_round, MUT_TAG), len(model), self.pool_size, self._beta)
        self.w_old = model
        return mutate(model, delta, coeffs, p.radius)

    def round_extra(self, server_round: int) -> dict[str, Any]:
        return {"mutation_beta": self._beta}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "w_old": dict(self.w_old)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.w_old = dict(state["w_old"])


register_method(
    "fedmut",
    strategy=FedMutStrategy,
    client=FedAvgClient,
    params=FedMutParams,
    summary="Model mutation: each client trains the global model moved ±α·Δ along the last global step",
    paper="Hu et al., AAAI 2024 (as in the FedMR authors' code)",
    records=POOL_RECORDS,
)
