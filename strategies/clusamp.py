"""Clustered sampling by model similarity (Fraboni et al., ICML 2021, Algorithm 2;
a FedMR baseline).

State: the representative gradient g_i of every client (zero until it is first sampled), the N×N
distance matrix D and the client sizes n_i (from the run's partition, corrected by reported
``num-examples``). After a round, for each sampled client i:

    g_i ← w_{i,K} − w^t                    (trainable parameters, flattened)
    D_ij = D_ji = ‖g_i − g_j‖_1  for all j  (whole rows/columns, as Fraboni et al.; the FedMR code's
                                            update touches one column, an indentation bug)

Sampling round t with m = K:
  1. Ward linkage of D (Lance–Williams; ``ward_linkage``);
  2. flat clusters = maximal subtrees of total weight p_C = Σ_{i∈C} n_i/n ≤ 1/m (fcluster on the
     cumulative-weight heights, as the reference code);
  3. the m heaviest clusters each seed one of m distributions r_k; the clients of the other
     clusters (shuffled) fill the distributions up to mass 1/m, a client split if needed, so
     Σ_k r_{k,i} = m p_i (unbiased);
  4. one client is drawn from each r_k (rng seeded by (seed, round)); a client drawn twice trains
     once and counts twice in aggregation.

Aggregation (``aggregation``): "data-size" (default, the FedMR authors' code) w = Σ c_i n_i w_i / Σ c_i n_i,
or "uniform" (Fraboni's unbiased weights) w = Σ c_i w_i / m, with c_i the multiplicity.
Distance (``distance``): "L1" (default, the FedMR authors' code), "L2" or "cosine" (the reference code's other options).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field

from clients.clusamp import CluSampClient
from fedsuite.method.params import Params
from fedsuite.method.arrays import NDArrays, weighted_mean
from fedsuite.method.registry import register_method
from fedsuite.method.seeding import round_rng
from fedsuite.method.strategy import FedSuiteStrategy, ServerSetup
from fedsuite.method.wire import ClientReply

#: the m cluster draws of a round (fedsuite.method.seeding.round_rng)
DRAW_TAG = 0xC1A5


class CluSampParams(Params):
    distance: Literal["L1", "L2", "cosine"] = Field("L1", description="distance between representative gradients")
    aggregation: Literal["data-size", "uniform"] = Field("data-size", description="data-size: the FedMR code; uniform: Fraboni")


def pairwise_distance(a: np.ndarray, b: np.ndarray, kind: str, chunk: int = 16) -> np.ndarray:
    """Distances between rows of a [r, D] and rows of b [N, D] -> [r, N] (float64 sums, chunked
    over b so memory stays at chunk × D)."""
    out = np.zeros((len(a), len(b)))
    nb = np.linalg.norm(b.astype(np.float64), axis=1)
    for i, row in enumerate(a):
        for s in range(0, len(b), chunk):
            blk = b[s : s + chunk]
            if kind == "L1":
                out[i, s : s + chunk] = np.abs(blk - row).sum(1, dtype=np.float64)
            elif kind == "L2":
                out[i, s : s + chunk] = np.sqrt(np.square(blk - row).sum(1, dtype=np.float64))
            else:  # 1 − cosine similarity; 0 while either gradient is still unknown (zero)
                na, dots = np.linalg.norm(row.astype(np.float64)), blk.astype(np.float64) @ row.astype(np.float64)
                denom = na * nb[s : s + chunk]
                out[i, s : s + chunk] = np.where(denom > 0, 1.0 - dots / np.where(denom > 0, denom, 1.0), 0.0)
    return out


def ward_linkage(dist: np.ndarray) -> np.ndarray:
    """Agglomerative Ward linkage of a dissimilarity matrix (scipy's ``linkage(·, 'ward')`` form):
    merge the closest pair (i, j), then d(k, i∪j)² = ((n_i+n_k) d_ki² + (n_j+n_k) d_kj² − n_k d_ij²) / (n_i+n_j+n_k).
    Returns Z [N−1, 4] rows (id_a, id_b, height, size); merged clusters get ids N, N+1, ... Ties go
    to the first pair in row-major order, so the result is deterministic."""
    n = dist.shape[0]
    d = np.array(dist, dtype=np.float64)
    np.fill_diagonal(d, np.inf)
    size, ids, z = np.ones(n), np.arange(n), np.zeros((max(n - 1, 0), 4))
    for step in range(n - 1):
        i, j = np.unravel_index(np.argmin(d), d.shape)
        i, j = min(i, j), max(i, j)
        dij, ni, nj = d[i, j], size[i], size[j]
        with np.errstate(invalid="ignore"):
            new = np.sqrt(np.maximum(((ni + size) * d[i] ** 2 + (nj + size) * d[j] ** 2 - size * dij**2) / (ni + nj + size), 0.0))
        new[np.isnan(new)] = np.inf
        z[step] = (min(ids[i], ids[j]), max(ids[i], ids[j]), dij, ni + nj)
        d[i, :], d[:, i] = new, new
        d[j, :], d[:, j], d[i, i] = np.inf, np.inf, np.inf
        size[i], ids[i] = ni + nj, n + step
    return z


def weight_clusters(z: np.ndarray, weights: np.ndarray, m: int) -> list[list[int]]:
    """Flat clusters: maximal subtrees whose total weight is ≤ Σw / m (a leaf is always a cluster)."""
    n, total = len(weights), int(weights.sum())
    children = {n + s: (int(a), int(b)) for s, (a, b, _, _) in enumerate(z)}
    w = {i: int(weights[i]) for i in range(n)}
    for node, (a, b) in sorted(children.items()):
        w[node] = w[a] + w[b]
    out, stack = [], [2 * n - 2 if n > 1 else 0]
    while stack:
        node = stack.pop()
        if node < n or w[node] * m <= total:
            leaves, todo = [], [node]
            while todo:
                x = todo.pop()
                todo.extend(children[x]) if x >= n else leaves.append(x)
            out.append(sorted(leaves))
        else:
            stack.extend(children[node])
    return sorted(out)


def sampling_distributions(clusters: list[list[int]], weights: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """Algorithm 2's m distributions r_k [m, N] (rows sum to 1; Σ_k r_k = m · weights / Σ weights).
    Integer arithmetic: client i has m·n_i units, each row holds Σn units."""
    n, cap = len(weights), int(weights.sum())
    units = weights.astype(np.int64) * m
    order = sorted(clusters, key=lambda c: (int(units[c].sum()), c[0]))
    kept, rest = order[max(len(order) - m, 0) :], order[: max(len(order) - m, 0)]  # as the reference code
    rows, pieces = np.zeros((m, n), dtype=np.int64), []
    for k, cluster in enumerate(kept):
        for c in cluster:
            rows[k, c] = units[c]
        if rows[k].sum() > cap:  # only a single client heavier than 1/m: spill its excess
            (c,) = cluster
            pieces.append((c, int(rows[k].sum() - cap)))
            rows[k, c] -= pieces[-1][1]
    for cluster in rest:
        for c in rng.permutation(cluster):
            pieces.append((int(c), int(units[c])))
    k = 0
    for c, left in pieces:
        while left > 0:
            while rows[k].sum() >= cap:
                k += 1
            u = min(cap - int(rows[k].sum()), left)
            rows[k, c] += u
            left -= u
    return rows / cap


class CluSampStrategy(FedSuiteStrategy):
    """Clustered sampling (Algorithm 2) over FedAvg training (see module)."""

    def __init__(self, setup: ServerSetup) -> None:
        super().__init__(setup)
        self.pids = self.partition_ids
        self.index = {pid: k for k, pid in enumerate(self.pids)}
        names = [k for k, _ in setup.build_model().named_parameters()] if setup.build_model else None
        self.grad_keys = [k for k, v in self.template.items() if (k in names if names else np.issubdtype(v.dtype, np.floating))]
        dim = sum(int(self.template[k].size) for k in self.grad_keys)
        n = len(self.pids)
        self.grads = np.zeros((n, dim), dtype=np.float32)
        self.dist = np.zeros((n, n), dtype=np.float64)
        self.sizes = self._partition_sizes()
        self.multiplicity: dict[int, int] = {}

    def _partition_sizes(self) -> np.ndarray:
        """n_i from the run's partition (``ServerSetup.partition_size``)."""
        if self.setup.partition_size is None:
            raise ValueError("CluSamp weighs clients by their data sizes: its ServerSetup needs partition_size")
        return np.array([self.setup.partition_size(p) for p in self.pids], dtype=np.int64)

    def draw(self, server_round: int) -> list[int]:
        """The m draws of Algorithm 2 (partition ids, with repeats), deterministic in (seed, round, state)."""
        m = min(self.cfg.cohort_size, len(self.pids))
        rng = round_rng(self.cfg.seed, server_round, DRAW_TAG)
        weights = np.maximum(self.sizes, 1)
        clusters = weight_clusters(ward_linkage(self.dist), weights, m)
        dists = sampling_distributions(clusters, weights, m, rng)
        return [self.pids[int(rng.choice(len(self.pids), p=row))] for row in dists]

    def sample_cohort(self, server_round: int) -> list[int]:
        self.draws = self.draw(server_round)
        self.multiplicity = {p: self.draws.count(p) for p in set(self.draws)}
        return sorted(self.multiplicity)

    def prepare_round(self, server_round, cohort):
        self.round_log.add({"clusamp_draws": list(self.draws)})

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> NDArrays:
        updated = []
        for r in replies:
            k = self.index[r.partition_id]
            self.grads[k] = np.concatenate(
                [(r.arrays[key].astype(np.float64) - self.global_arrays[key]).reshape(-1) for key in self.grad_keys]
            ).astype(np.float32)
            self.sizes[k] = r.num_examples
            updated.append(k)
        if updated:
            rows = pairwise_distance(self.grads[updated], self.grads, self.params.distance)
            self.dist[updated, :] = rows
            self.dist[:, updated] = rows.T
            np.fill_diagonal(self.dist, 0.0)
        mult = [self.multiplicity.get(r.partition_id, 1) for r in replies]
        if self.params.aggregation == "uniform":
            weights = [float(c) for c in mult]
        else:
            weights = [float(c * r.num_examples) for c, r in zip(mult, replies)]
        return weighted_mean([r.arrays for r in replies], weights, self.template)

    def state_dict(self) -> dict[str, Any]:
        return {"grads": self.grads.copy(), "dist": self.dist.copy(), "sizes": self.sizes.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.grads, self.dist, self.sizes = (np.array(state[k]) for k in ("grads", "dist", "sizes"))


register_method(
    "clusamp",
    strategy=CluSampStrategy,
    client=CluSampClient,
    params=CluSampParams,
    summary="Clustered sampling (Algorithm 2): Ward clusters of representative gradients, one client per cluster",
    paper="Fraboni et al., ICML 2021",
)
