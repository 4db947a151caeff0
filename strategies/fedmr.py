"""FedMR: federated learning via layer-wise model recombination (Hu et al., KDD 2024).

The server keeps a pool of K models (``strategies.pool``); client i of round r trains pool slot
i's model, and its upload v_i replaces that slot. Then (the paper's Algorithm 1 + two-stage scheme)

    w^glb_r = (1/K) Σ_i v_i                                   (reported and evaluated; int buffers rounded)
    r ≤ R1 (stage 1):  L_m ← [w^glb_r] * K                      (aggregation, uniform weights: Alg. 1 line 11)
    r > R1 (stage 2):  L_m ← ModelRecombine(L_m)                (§4.2.2, Fig. 4)

    ModelRecombine: for every unit j, an independent uniform permutation π_j of {0..K-1};
                    new_i[j] = u_{π_j(i)}[j]                    (no arithmetic)

Round arithmetic (the authors' code's; the paper says only that stage 1 lasts R1 rounds): rounds
1..R1 aggregate; round R1+1 still starts from the last stage-1 global (all slots equal); the first
recombination is applied after round R1+1's training, so recombined models are first trained in
round R1+2. With R1 = 0 round 1 trains K copies of w^0 (the authors'
code's pool start; Alg. 1 does not say whether the K initial models differ).

Options (section ``[fedmr]``):

* ``first_stage_rounds`` R1 (default 0 = Algorithm 1 without stage 1; Table 1 uses 100 for
  ResNet-20/VGG-16 and 0 for the CNN, see experiments/fedmr/);
* ``granularity``: ``"tensor"`` (default; one unit per state_dict entry, as the authors' code, which
  gave the paper's numbers) or ``"module"`` (all entries with the same module prefix share one permutation, the literal "layer");
* ``segment_fraction`` x (FedMR-px, the paper's Fig. 11): 0 = unit-wise (default); x ∈ (0, 1]
  groups the n units into segments, unit j (1-based) in segment ⌈j / (x·n)⌉, one permutation per segment
  (⌈1/x⌉ segments; x = 1.0 is Indep, whole models are shuffled);
* ``stage1_weighting``: ``"uniform"`` (default; Alg. 1 line 11 and the authors' code) or
  ``"num_examples"`` (stage 1 and its global are FedAvg's data-size-weighted mean of the received
  models; with R1 ≥ rounds this is FedAvg bit for bit).

Failures (the paper does not discuss them): a slot whose client did not reply keeps the model it
was sent. Permutations come from a generator seeded by (seed, round), so a resumed run recombines
exactly as an uninterrupted one; the pool is the checkpointed state.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from clients.fedavg import FedAvgClient
from fedsuite.method.arrays import NDArrays, uniform_mean, weighted_mean
from fedsuite.method.registry import register_method
from fedsuite.method.seeding import round_rng
from fedsuite.method.strategy import ServerSetup
from fedsuite.method.wire import ClientReply
from strategies.pool import POOL_RECORDS, PERM_TAG, PoolParams, PoolStrategy

# ------------------------------------------------------------------------------------------------
# recombination: pure functions on dicts of numpy arrays
# ------------------------------------------------------------------------------------------------


def make_units(keys: list[str], granularity: str = "tensor") -> list[list[str]]:
    """Recombination units in state_dict order (the authors' code shuffles each entry on its own).

    ``tensor``: one unit per key. ``module``: keys grouped by ``key.rsplit('.', 1)[0]`` (e.g. all of
    ``bn1.{weight,bias,running_mean,running_var,num_batches_tracked}``), ordered by first appearance.
    """
    if granularity == "tensor":
        return [[k] for k in keys]
    if granularity == "module":
        groups: dict[str, list[str]] = {}
        for k in keys:
            groups.setdefault(k.rsplit(".", 1)[0], []).append(k)
        return list(groups.values())
    raise ValueError(f"granularity must be 'tensor' or 'module', got {granularity!r}")


def segment_ids(n_units: int, fraction: float) -> np.ndarray:
    """Segment of each unit for FedMR-px (the paper's Fig. 11), as 0-based labels.

    fraction x = 0 (or x·n ≤ 1): every unit is its own segment (layer-wise FedMR). Otherwise unit j
    (1-based) is in segment ⌈j / (x·n)⌉, which gives ⌈1/x⌉ contiguous segments.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"segment fraction must be in [0, 1], got {fraction}")
    if fraction == 0.0 or fraction * n_units <= 1.0:
        return np.arange(n_units)
    j = np.arange(1, n_units + 1, dtype=np.float64)
    seg = np.ceil(np.round(j / (fraction * n_units), 9)).astype(np.int64)  # round: x·n like 2.9999999
    return seg - 1


def draw_permutations(rng: np.random.Generator, n_units: int, k: int, segments: np.ndarray | None = None) -> np.ndarray:
    """[n_units, K] array: row j is π_j, an independent uniform permutation of {0..K-1} per unit
    (no derangement constraint, as the authors' code), or per segment when ``segments`` (from
    :func:`segment_ids`) is given."""
    labels = np.arange(n_units) if segments is None else np.asarray(segments)
    n_draws = int(labels.max()) + 1 if labels.size else 0
    perms = rng.permuted(np.tile(np.arange(k), (n_draws, 1)), axis=1)
    return perms[labels]


def recombine(pool: list[NDArrays], units: list[list[str]], perms: np.ndarray) -> list[NDArrays]:
    """ModelRecombine (the paper's §4.2.2): new_i[key] = pool[perms[j, i]][key] for every key of unit j.

    Tensors are moved, not copied or changed (bit-identical, dtypes kept); each source unit lands in
    exactly one new model, so Σ_i new_i = Σ_i pool_i (Lemma 4.4). Cost: n·K dict assignments.
    """
    k = len(pool)
    if perms.shape != (len(units), k):
        raise ValueError(f"perms must have shape {(len(units), k)}, got {perms.shape}")
    new: list[NDArrays] = [{} for _ in range(k)]
    for unit, perm in zip(units, perms.tolist()):
        for i, src in enumerate(perm):
            source = pool[src]
            for key in unit:
                new[i][key] = source[key]
    order = list(pool[0]) if pool else []
    return [{key: m[key] for key in order} for m in new]  # state_dict order


# ------------------------------------------------------------------------------------------------
# the server rule
# ------------------------------------------------------------------------------------------------


class FedMRParams(PoolParams):
    """FedMR's hyperparameters (section ``[fedmr]``); see the module docstring. ``diagnostics``:
    :class:`strategies.pool.PoolParams`."""

    first_stage_rounds: int = Field(0, ge=0, description="R1: aggregation (FedAvg) rounds before recombination")
    granularity: Literal["tensor", "module"] = Field(
        "tensor", description="recombination unit: state_dict tensor (the authors' code, which gave the paper's "
        "numbers) or module", json_schema_extra={"paper": "\"module\" (the paper's \"layer\", §4.2.2)"})
    segment_fraction: float = Field(0.0, ge=0, le=1, description="FedMR-px: x in (0,1], one permutation per segment; 0 = unit-wise")
    stage1_weighting: Literal["uniform", "num_examples"] = Field("uniform", description="stage-1 aggregation weights")


class FedMRStrategy(PoolStrategy):
    """FedMR: per-client pool models; aggregate for R1 rounds, then recombine (see module)."""

    def __init__(self, setup: ServerSetup) -> None:
        super().__init__(setup)
        self.units = make_units(list(self.template), self.params.granularity)
        self.segments = segment_ids(len(self.units), self.params.segment_fraction)

    def stage(self, server_round: int) -> int:
        return 1 if server_round <= self.params.first_stage_rounds else 2

    def round_model(self, server_round: int, replies: list[ClientReply]) -> NDArrays:
        """w^glb: (1/K) Σ_i L_m[i]; in stage 1 with ``num_examples`` weighting Σ n_i v_i / Σ n_i."""
        if self.stage(server_round) == 1 and self.params.stage1_weighting == "num_examples" and replies:
            return weighted_mean([r.arrays for r in replies], [r.num_examples for r in replies], self.template)
        return uniform_mean(self.pool, self.template)

    def next_pool(self, server_round: int, replies: list[ClientReply], model: NDArrays) -> list[NDArrays]:
        if self.stage(server_round) == 1:
            return [model] * self.pool_size
        perms = draw_permutations(round_rng(self.cfg.seed, server_round, PERM_TAG), len(self.units), self.pool_size, self.segments)
        return recombine(self.pool, self.units, perms)

    def round_extra(self, server_round: int) -> dict:
        return {"stage": self.stage(server_round)}


def fedmr_warnings(cfg) -> list[str]:
    """FedMR's measured failure setting (docs/methods/fedmr.md, "When FedMR works"; the study in
    experiments/fedmr/README.md): recombination with the paper's momentum 0.9 on a label-skewed
    partition. Momentum 0.5 (the authors' code's default) trained level with FedAvg there; IID is
    not affected."""
    if cfg.partitioner == "iid" or cfg.momentum <= 0.5:
        return []
    return [
        f"fedmr on a non-IID partition ({cfg.partitioner}) with momentum {cfg.momentum:g}: in fedsuite's FedMR study "
        "(Fashion-MNIST, Dirichlet 0.1, 200 rounds; experiments/fedmr/README.md) FedMR at the paper's momentum 0.9 "
        "failed: with recombination from round 1 the pool models drifted apart until a client's model became "
        "non-finite (tensor units round 47, module units round 96), and after 40 rounds of aggregation "
        "(first_stage_rounds=40) recombination took the model from 72.8% to about 50% (FedAvg: 80%). The "
        "authors' code also collapses at this setting. Seen to train: --set momentum=0.5 (their code's "
        "default; level with FedAvg at the same momentum, 3 seeds) or an IID partition. "
        "--set fedmr.diagnostics=true records the drift (docs/methods/fedmr.md)."
    ]


register_method(
    "fedmr",
    strategy=FedMRStrategy,
    client=FedAvgClient,
    params=FedMRParams,
    summary="Layer-wise model recombination: each client trains a different recombined pool model",
    paper="Hu et al., KDD 2024 (arXiv 2305.10730)",
    warnings=fedmr_warnings,
    records=POOL_RECORDS,
)

