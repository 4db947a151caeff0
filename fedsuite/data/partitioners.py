"""The partition schemes: each splits a training set's indices among clients, most on top of
``flwr_datasets``.

A scheme is a function ``(labels, num_clients, seed, *, groups=None, **params) -> list of index
arrays``: the labels (and natural-partition groups) are put into an in-memory ``datasets.Dataset``
with an ``idx`` column, shuffled with ``seed``, and handed to the matching Flower Datasets
partitioner, which is also given ``seed``. :func:`fedsuite.data.partition_indices` validates the
parameters, calls the scheme and caches its result (:mod:`fedsuite.data.partition_cache`).

Schemes (``PARTITIONERS``):

* ``iid``             ``IidPartitioner`` on the seeded shuffle: near-equal random splits.
* ``dirichlet``       ``DirichletPartitioner(alpha, min_partition_size, self_balancing=True)``: the
                      NIID-Bench / FedMR / FedNLR label-Dirichlet (unequal sizes).
* ``dirichlet-equal`` ``InnerDirichletPartitioner``: equal client sizes ``N // num_clients`` with a
                      per-client Dir(alpha) class prior, without replacement (FedDyn/FL-Simulator
                      style; FedMRUR's recommended partition).
* ``dirichlet-refill`` FedInit's code (FL-Simulator) / FedSpeed: equal sizes, per-client Dir(alpha) prior, an
                      exhausted class pool is refilled, so samples may repeat across clients. Not in
                      Flower Datasets, written here (see fedinit.md section 4).
* ``pathological``    ``PathologicalPartitioner(classes_per_client)``: each client holds exactly that
                      many classes (``class_assignment`` "first-deterministic" = NIID-Bench #C=k).
* ``shards``          ``ShardPartitioner(shards_per_client)``: McMahan et al.'s sort-and-shard (equal
                      shards, a remainder of ``N mod (num_clients * shards_per_client)`` is unused).
* ``natural``         ``NaturalIdPartitioner`` on the dataset's ``groups`` (FEMNIST writer, synthetic
                      device); groups smaller than ``min_partition_size`` are dropped, and when
                      ``num_clients`` is smaller than the number of groups a seeded subset is used.
                      ``partition_by=<column>`` groups by a column of the dataset instead (dataset
                      ``hf``, e.g. ``writer_id``): one client per distinct value (with at least
                      ``min_partition_size`` samples), so ``num_clients`` must equal their number.
                      Clients are in the order of the sorted ids.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["PARTITIONERS"]


# --------------------------------------------------------------------------------------------
# helpers


def _dataset(labels: np.ndarray, groups: np.ndarray | None, seed: int | None):
    """In-memory HF dataset with columns label, idx (and group), rows shuffled with ``seed``.

    Arrow-formatted: a column read (``ds["label"]``, which every partitioner does) is then one Arrow
    array instead of a row-by-row Python iteration; at 60 000 samples and 100 clients that is
    0.15 s instead of 0.65 s per Dirichlet partition, with the same indices for every scheme
    (``tests/test_partition.py``)."""
    import datasets

    idx = np.arange(len(labels), dtype=np.int64)
    if seed is not None:
        idx = np.random.default_rng(seed).permutation(len(labels))
    cols: dict[str, Any] = {"label": labels[idx], "idx": idx}
    if groups is not None:
        cols["group"] = groups[idx]
    return datasets.Dataset.from_dict(cols).with_format("arrow")


def _collect(partitioner: Any, ds: Any, n: int) -> list[np.ndarray]:
    partitioner.dataset = ds
    return [_idx(partitioner.load_partition(i)) for i in range(n)]


def _idx(part: Any) -> np.ndarray:
    # part[:] is the partition's Arrow table (the row selection applied); its idx column at once
    return np.asarray(part[:]["idx"], dtype=np.int64)


# --------------------------------------------------------------------------------------------
# raw partitioners: (labels, num_clients, seed, *, groups, **params) -> list of index arrays


def iid(labels: np.ndarray, num_clients: int, seed: int, **_: Any) -> list[np.ndarray]:
    """Uniform random split into equal-size clients (flwr-datasets IidPartitioner)."""
    from flwr_datasets.partitioner import IidPartitioner

    return _collect(IidPartitioner(num_partitions=num_clients), _dataset(labels, None, seed), num_clients)


def dirichlet(
    labels: np.ndarray, num_clients: int, seed: int, *, alpha: float = 0.5, min_partition_size: int = 10,
    self_balancing: bool = True, **_: Any,
) -> list[np.ndarray]:
    """Per-class Dir(alpha) proportions, self-balancing, minimum client size (NIID-Bench; FedMR, FedNLR)."""
    from flwr_datasets.partitioner import DirichletPartitioner

    p = DirichletPartitioner(
        num_partitions=num_clients, partition_by="label", alpha=float(alpha),
        min_partition_size=min_partition_size, self_balancing=self_balancing, shuffle=True, seed=seed,
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # flwr warns on every resampling attempt
            return _collect(p, _dataset(labels, None, seed), num_clients)
    except ValueError as exc:
        if "attempts" not in str(exc):
            raise
        raise ValueError(
            f"The Dirichlet partition (alpha={alpha}, {num_clients} clients) could not give every "
            f"client at least min_partition_size={min_partition_size} samples in 10 attempts; "
            "raise alpha, lower min_partition_size or use fewer clients."
        ) from None


def dirichlet_equal(
    labels: np.ndarray, num_clients: int, seed: int, *, alpha: float = 0.5, **_: Any
) -> list[np.ndarray]:
    """Equal client sizes with a Dir(alpha) label prior per client (FedDyn/FL-Simulator; FedInit, FedMRUR)."""
    from flwr_datasets.partitioner import InnerDirichletPartitioner

    size = len(labels) // num_clients
    ds = _dataset(labels, None, seed)
    if size * num_clients != len(labels):
        ds = ds.select(range(size * num_clients))  # drop the (seeded, random) remainder
    # flwr needs every class present; after the drop a rare class could vanish: relabel densely.
    present, dense = np.unique(np.asarray(ds["label"]), return_inverse=True)
    if not np.array_equal(present, np.arange(len(present))):
        ds = ds.remove_columns("label").add_column("label", dense.astype(np.int64).tolist())
    p = InnerDirichletPartitioner(
        partition_sizes=[size] * num_clients, partition_by="label", alpha=float(alpha), shuffle=True, seed=seed,
    )
    return _collect(p, ds, num_clients)


def dirichlet_refill(
    labels: np.ndarray, num_clients: int, seed: int, *, alpha: float = 0.5, **_: Any
) -> list[np.ndarray]:
    """FedInit's code (FL-Simulator) / FedSpeed: equal sizes, Dir(alpha) class priors, exhausted classes are refilled."""
    rng = np.random.default_rng(seed)
    num_classes = int(labels.max()) + 1
    size = len(labels) // num_clients
    perm = rng.permutation(len(labels))
    pools = [perm[labels[perm] == c] for c in range(num_classes)]
    prior = rng.dirichlet(np.full(num_classes, float(alpha)), size=num_clients)
    present = np.array([len(p) > 0 for p in pools])
    prior[:, ~present] = 0.0
    prior /= prior.sum(axis=1, keepdims=True)
    cum = np.cumsum(prior, axis=1)
    ptr = np.zeros(num_classes, dtype=np.int64)
    left = np.full(num_clients, size, dtype=np.int64)
    out = [np.empty(size, dtype=np.int64) for _ in range(num_clients)]
    open_clients = list(range(num_clients))
    while open_clients:
        j = int(rng.integers(len(open_clients)))
        cid = open_clients[j]
        c = min(int(np.searchsorted(cum[cid], rng.random(), side="right")), num_classes - 1)
        while not present[c]:  # numerical edge: fall back to the next present class
            c = (c + 1) % num_classes
        if ptr[c] >= len(pools[c]):
            ptr[c] = 0  # refill the class pool: samples may now repeat across clients
        left[cid] -= 1
        out[cid][left[cid]] = pools[c][ptr[c]]
        ptr[c] += 1
        if left[cid] == 0:
            open_clients.pop(j)
    return out


def pathological(
    labels: np.ndarray, num_clients: int, seed: int, *, classes_per_client: int = 2,
    class_assignment: str = "first-deterministic", **_: Any,
) -> list[np.ndarray]:
    """Each client holds exactly classes_per_client classes (NIID-Bench #C=k, FedNLR S-classes, FedMRUR Path(n))."""
    from flwr_datasets.partitioner import PathologicalPartitioner

    p = PathologicalPartitioner(
        num_partitions=num_clients, partition_by="label", num_classes_per_partition=classes_per_client,
        class_assignment_mode=class_assignment, shuffle=True, seed=seed,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "classes will not be used": reported by callers if needed
        return _collect(p, _dataset(labels, None, seed), num_clients)


def shards(
    labels: np.ndarray, num_clients: int, seed: int, *, shards_per_client: int = 2, **_: Any
) -> list[np.ndarray]:
    """Sort by label, cut into shards, shards_per_client shards each (McMahan et al.)."""
    from flwr_datasets.partitioner import ShardPartitioner

    p = ShardPartitioner(
        num_partitions=num_clients, partition_by="label", num_shards_per_partition=shards_per_client,
        shuffle=True, seed=seed,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pyarrow deprecation inside flwr's sort
        return _collect(p, _dataset(labels, None, seed), num_clients)


def natural(
    labels: np.ndarray, num_clients: int, seed: int, *, groups: np.ndarray | None = None,
    min_partition_size: int = 10, **_: Any,
) -> list[np.ndarray]:
    """One client per natural group (FEMNIST writer, Synthetic device, or a column: partition_by)."""
    from flwr_datasets.partitioner import NaturalIdPartitioner

    if groups is None:
        raise ValueError(
            "The 'natural' partition needs natural groups (e.g. FEMNIST writers, synthetic devices), "
            "but this dataset has none; choose iid, dirichlet, dirichlet-equal, pathological or shards."
        )
    ds = _dataset(labels, groups, None)
    p = NaturalIdPartitioner(partition_by="group")  # partition i is the i-th smallest group id
    p.dataset = ds
    with contextlib.redirect_stderr(io.StringIO()):  # silence flwr's tqdm progress bar
        parts = [_idx(p.load_partition(i)) for i in range(p.num_partitions)]
    eligible = [q for q in parts if len(q) >= min_partition_size]
    if num_clients > len(eligible):
        raise ValueError(
            f"The 'natural' partition has {len(eligible)} groups with at least min_partition_size="
            f"{min_partition_size} samples ({len(parts)} groups in all), fewer than num_clients="
            f"{num_clients}; lower num_clients or min_partition_size."
        )
    if num_clients < len(eligible):
        chosen = np.sort(np.random.default_rng(seed).choice(len(eligible), num_clients, replace=False))
        eligible = [eligible[i] for i in chosen]
    return eligible


#: name -> raw partition function ``(labels, num_clients, seed, *, groups=None, **params)``.
PARTITIONERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": iid,
    "dirichlet": dirichlet,
    "dirichlet-equal": dirichlet_equal,
    "dirichlet-refill": dirichlet_refill,
    "pathological": pathological,
    "shards": shards,
    "natural": natural,
}

# which keyword parameters each scheme depends on (for validation and the cache key)
_PARAMS: dict[str, tuple[str, ...]] = {
    "iid": (),
    "dirichlet": ("alpha", "min_partition_size", "self_balancing"),
    "dirichlet-equal": ("alpha",),
    "dirichlet-refill": ("alpha",),
    "pathological": ("classes_per_client", "class_assignment"),
    "shards": ("shards_per_client",),
    "natural": ("min_partition_size",),
}
