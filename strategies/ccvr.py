"""CCVR: classifier calibration with virtual representations (Luo et al., NeurIPS 2021;
a baseline of FedNLR's Table 2). Training is FedAvg; calibration changes only the *evaluated* model.

After each round t that is calibrated (the last round; also every ``calibrate_every`` rounds if > 0),
the server runs one statistics round (CCVR's extra round after training, in which clients upload
per-class feature statistics) on w^{t+1}, a statistics query (``FedSuiteStrategy.query_statistics``; no training, no
plug-in): clients return per-class (N_{i,c}, μ_{i,c}, Σ_{i,c}) of their features
(``clients/ccvr.py``). The server merges them exactly (CCVR eq. 3-4):

    N_c = Σ_i N_{i,c},   μ_c = Σ_i (N_{i,c}/N_c) μ_{i,c},
    Σ_c = Σ_i (N_{i,c}−1)/(N_c−1) Σ_{i,c} + Σ_i N_{i,c}/(N_c−1) μ_{i,c}μ_{i,c}ᵀ − N_c/(N_c−1) μ_c μ_cᵀ

draws M_c = ``virtual_per_class`` virtual features per class present, z ~ N(μ_c, Σ_c), and retrains the
``head`` (W, b) of w^{t+1} from its current value by SGD on CE(W z + b, c) for ``epochs`` epochs. The
ServerApp evaluates w^{t+1} with the calibrated head (``evaluation_arrays``); the next round still
starts from the uncalibrated w^{t+1}, as calibration is post-hoc in CCVR.

Config ``[ccvr]``: virtual_per_class=2000, epochs=10, lr=0.01, momentum=0.9, batch_size=64,
calibrate_every=0, stats_clients="all". The FedNLR paper does not give CCVR's settings; these values
are our choice (configurable).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from pydantic import Field

from clients.ccvr import COUNTS, COVS, MEANS, RECORDS, CCVRClient
from fedsuite.method.arrays import NDArrays
from fedsuite.method.params import Params
from fedsuite.method.registry import register_method
from fedsuite.method.seeding import round_rng
from fedsuite.method.strategy import FedSuiteStrategy, ServerSetup
from fedsuite.method.training import SGD
from fedsuite.method.wire import to_record

#: the virtual features' draw of a calibration round (fedsuite.method.seeding.round_rng)
VIRTUAL_TAG = 0xCC7


class CCVRParams(Params):
    virtual_per_class: int = Field(2000, ge=1, description="virtual features M_c sampled per class")
    epochs: int = Field(10, ge=1, description="epochs of head retraining on the virtual features")
    lr: float = Field(0.01, gt=0, description="SGD learning rate of head retraining")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum of head retraining")
    batch_size: int = Field(64, ge=1, description="batch size of head retraining")
    calibrate_every: int = Field(0, ge=0, description="0: calibrate after the last round only; k: also every k rounds")
    stats_clients: Literal["all", "cohort"] = Field("all", description="who sends feature statistics")


def merge_statistics(stats: list[NDArrays]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Global (N_c, μ_c, Σ_c) from the clients' per-class statistics (module docstring), float64."""
    counts = np.stack([s[COUNTS] for s in stats]).astype(np.float64)  # [K, C]
    means = np.stack([s[MEANS] for s in stats]).astype(np.float64)  # [K, C, D]
    covs = np.stack([s[COVS] for s in stats]).astype(np.float64)  # [K, C, D, D]
    n = counts.sum(0)
    mu = np.einsum("kc,kcd->cd", counts, means) / np.maximum(n, 1)[:, None]
    denom = np.maximum(n - 1, 1)[:, None, None]
    sigma = (
        np.einsum("kc,kcde->cde", np.maximum(counts - 1, 0), covs)
        + np.einsum("kc,kcd,kce->cde", counts, means, means)
        - n[:, None, None] * np.einsum("cd,ce->cde", mu, mu)
    ) / denom
    return n, mu, sigma


def sample_virtual(n: np.ndarray, mu: np.ndarray, sigma: np.ndarray, per_class: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """per_class draws from N(μ_c, Σ_c) for every class with N_c > 0 (Σ_c = V Λ Vᵀ, z = μ + V √Λ ε)."""
    feats, labels = [], []
    for c in np.flatnonzero(n > 0):
        lam, vec = np.linalg.eigh((sigma[c] + sigma[c].T) / 2)
        root = vec * np.sqrt(np.clip(lam, 0.0, None))
        feats.append(mu[c] + rng.standard_normal((per_class, mu.shape[1])) @ root.T)
        labels.append(np.full(per_class, c, dtype=np.int64))
    return np.concatenate(feats).astype(np.float32), np.concatenate(labels)


def head_loss(weight: np.ndarray, bias: np.ndarray, feats: np.ndarray, labels: np.ndarray) -> float:
    logits = torch.from_numpy(feats) @ torch.from_numpy(weight).T + torch.from_numpy(bias)
    return float(F.cross_entropy(logits, torch.from_numpy(labels)))


def calibrate_head(weight: np.ndarray, bias: np.ndarray, feats: np.ndarray, labels: np.ndarray, *,
                   epochs: int, lr: float, momentum: float, batch_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """SGD on mean CE(W z + b, c) over the virtual features, starting from (W, b)."""
    head = torch.nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(weight))
        head.bias.copy_(torch.from_numpy(bias))
    opt = SGD(head.parameters(), lr=lr, momentum=momentum)
    x, y, gen = torch.from_numpy(feats), torch.from_numpy(labels), torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        for s in range(0, len(y), batch_size):
            idx = order[s : s + batch_size]
            opt.zero_grad()
            F.cross_entropy(head(x[idx]), y[idx]).backward()
            opt.step()
    return head.weight.detach().numpy().astype(weight.dtype), head.bias.detach().numpy().astype(bias.dtype)


class CCVRStrategy(FedSuiteStrategy):
    """FedAvg training; the evaluated model's head is calibrated on virtual features (see module)."""

    def __init__(self, setup: ServerSetup) -> None:
        super().__init__(setup)
        self.calibrated_head: NDArrays | None = None  # {"head.weight", "head.bias"}
        self._base: NDArrays | None = None  # the uncalibrated model the head belongs to (memory only)

    def calibrate_now(self, server_round: int) -> bool:
        every = self.params.calibrate_every
        return server_round == self.cfg.rounds or (every > 0 and server_round % every == 0)

    def after_aggregate(self, server_round: int) -> None:
        if self.channel is not None and self.calibrate_now(server_round):
            stats = self.gather_statistics(server_round, to_record(self.global_arrays))
            if stats:
                self.calibrate(server_round, self.global_arrays, stats)

    def gather_statistics(self, server_round: int, arrays: ArrayRecord) -> list[NDArrays]:
        """The statistics round: a statistics query about w^{t+1} to every client (or the cohort);
        per-class statistics back (``CCVRClient.statistics``)."""
        pids = self.partition_ids if self.params.stats_clients == "all" else self.round_log.cohort
        return list(self.query_statistics(server_round, pids, arrays).values())

    def calibrate(self, server_round: int, base: NDArrays, stats: list[NDArrays]) -> None:
        p = self.params
        n, mu, sigma = merge_statistics(stats)
        feats, labels = sample_virtual(n, mu, sigma, p.virtual_per_class, round_rng(self.cfg.seed, server_round, VIRTUAL_TAG))
        w, b = base["head.weight"], base["head.bias"]
        before = head_loss(w, b, feats, labels)
        w2, b2 = calibrate_head(w, b, feats, labels, epochs=p.epochs, lr=p.lr, momentum=p.momentum,
                                batch_size=p.batch_size, seed=self.cfg.seed + server_round)
        after = head_loss(w2, b2, feats, labels)
        self.calibrated_head, self._base = {"head.weight": w2, "head.bias": b2}, base
        self.round_log.add(
            {"ccvr_stats_clients": len(stats), "ccvr_virtual_loss_before": before, "ccvr_virtual_loss_after": after}
        )

    def evaluation_arrays(self, arrays: NDArrays) -> NDArrays:
        """w^{t+1} with the calibrated head if ``arrays`` is the model calibrated this round."""
        if self.calibrated_head is None or self._base is None:
            return arrays
        if set(arrays) != set(self._base) or not all(np.array_equal(arrays[k], self._base[k]) for k in arrays):
            return arrays
        return {**arrays, **self.calibrated_head}

    def state_dict(self) -> dict[str, Any]:
        return {"calibrated_head": self.calibrated_head}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calibrated_head = state["calibrated_head"]


register_method(
    "ccvr",
    strategy=CCVRStrategy,
    client=CCVRClient,
    params=CCVRParams,
    summary="FedAvg + post-hoc head calibration on virtual features from clients' class statistics",
    paper="Luo et al., NeurIPS 2021",
    records=RECORDS,
)
