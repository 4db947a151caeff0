"""Partitions: :func:`partition_indices` splits a training set's indices among clients with a scheme
of :data:`~fedsuite.data.partitioners.PARTITIONERS`; :func:`label_histogram` counts each client's classes.

Every partition is a pure function of (labels, groups, scheme, parameters, num_clients, seed).
:func:`partition_indices` validates the parameters, dispatches to the scheme
(:mod:`fedsuite.data.partitioners`) and caches the result on disk (``.npz`` keyed by a hash of all
inputs, including the label contents; :mod:`fedsuite.data.partition_cache`): a cache whose inputs
or contents do not match, or that is malformed, is recomputed and overwritten, never used.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .partition_cache import cache_entry, read_cache, write_cache
from .partitioners import _PARAMS, PARTITIONERS

__all__ = ["label_histogram", "partition_indices"]


def _groups_of_column(data: Any, partition_by: str, name: str) -> np.ndarray:
    """The per-sample ids of column ``partition_by`` of a bundle (``DatasetBundle.columns``)."""
    columns = getattr(data, "columns", None)
    if columns is None:
        own = " to use its own groups" if getattr(data, "groups", None) is not None else ""
        raise ValueError(
            f"partition_by={partition_by!r} names a column of the dataset, but dataset {name!r} has no columns "
            f"(columns come with dataset hf); leave partition_by unset{own}."
        )
    if partition_by not in columns:
        raise ValueError(
            f"partition_by={partition_by!r} is not a column of dataset {name!r}; its columns of ids: "
            f"{', '.join(sorted(columns)) or 'none'} (image columns and columns of floats or lists cannot group samples)."
        )
    g = np.asarray(columns[partition_by], dtype=np.int64)
    missing = int((g < 0).sum())
    if missing:
        raise ValueError(f"partition_by={partition_by!r}: {missing} training samples have no value in that column; "
                         "every sample needs an id to belong to a client.")
    return g


# --------------------------------------------------------------------------------------------
# public entry point


def _to_numpy(a: Any) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def partition_indices(
    data: Any,
    scheme: str,
    num_clients: int,
    seed: int,
    *,
    groups: Sequence[int] | np.ndarray | None = None,
    alpha: float = 0.5,
    min_partition_size: int = 10,
    classes_per_client: int = 2,
    shards_per_client: int = 2,
    class_assignment: str = "first-deterministic",
    self_balancing: bool = True,
    partition_by: str | None = None,
    cache_dir: str | Path | None = None,
) -> list[np.ndarray]:
    """Split training-sample indices among ``num_clients`` clients with ``scheme``.

    ``data`` is a :class:`DatasetBundle` (its ``y_train`` and ``groups`` are used) or the
    training labels (array/tensor/sequence of ints; pass ``groups`` for ``natural``). With
    ``partition_by`` (``natural`` only) the groups are the bundle's column of that name
    (``DatasetBundle.columns``), one client per distinct value, and ``num_clients`` must equal the
    number of values (those with at least ``min_partition_size`` samples). Returns one
    int64 index array per client (indices into the training set). The result depends only on the
    label (and group) contents, ``scheme``, the parameters that scheme uses, ``num_clients`` and
    ``seed``; with ``cache_dir`` it is stored there as ``.npz`` and re-read on the next call.
    Raises ``ValueError`` with a clear message for bad parameters.
    """
    name = str(getattr(data, "name", "data")) if hasattr(data, "y_train") else "labels"
    if partition_by is not None:
        if scheme != "natural":
            raise ValueError(f"partition_by applies to the 'natural' partition only, not to {scheme!r}.")
        if groups is not None:
            raise ValueError("Pass either groups or partition_by, not both.")
        groups = _groups_of_column(data, partition_by, name)
    if hasattr(data, "y_train"):
        labels = _to_numpy(data.y_train)
        if groups is None:
            groups = getattr(data, "groups", None)
    else:
        labels = _to_numpy(data)
    labels = labels.reshape(-1)
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"Labels must be integers, got dtype {labels.dtype}.")
    labels = labels.astype(np.int64)
    g = None if groups is None else _to_numpy(groups).reshape(-1).astype(np.int64)

    if scheme not in PARTITIONERS:
        raise ValueError(f"Unknown partition scheme {scheme!r}; choose one of {', '.join(PARTITIONERS)}.")
    n = len(labels)
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients must be a positive integer, got {num_clients!r}.")
    if n == 0:
        raise ValueError("Cannot partition an empty training set.")
    if labels.min() < 0:
        raise ValueError("Labels must be non-negative class indices.")
    if num_clients > n and partition_by is None:  # with partition_by the number of ids says it below
        raise ValueError(f"num_clients={num_clients} is larger than the number of training samples ({n}).")
    num_classes = int(labels.max()) + 1
    n_present = len(np.unique(labels))
    params: dict[str, Any] = {
        "alpha": float(alpha), "min_partition_size": int(min_partition_size),
        "classes_per_client": int(classes_per_client), "shards_per_client": int(shards_per_client),
        "class_assignment": class_assignment, "self_balancing": bool(self_balancing),
    }
    used = {k: params[k] for k in _PARAMS[scheme]}
    if "alpha" in used and not (alpha > 0 and np.isfinite(alpha)):
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}.")
    if "min_partition_size" in used and min_partition_size < 0:
        raise ValueError(f"min_partition_size must be >= 0, got {min_partition_size}.")
    if scheme == "dirichlet" and min_partition_size * num_clients > n:
        raise ValueError(
            f"min_partition_size={min_partition_size} x num_clients={num_clients} exceeds the "
            f"{n} training samples; lower one of them."
        )
    if scheme == "pathological":
        if not 1 <= classes_per_client <= n_present:
            raise ValueError(
                f"classes_per_client must be between 1 and the number of classes present "
                f"({n_present}), got {classes_per_client}."
            )
        if class_assignment not in ("random", "deterministic", "first-deterministic"):
            raise ValueError(
                f"class_assignment must be 'random', 'deterministic' or 'first-deterministic', got {class_assignment!r}."
            )
    if scheme == "shards":
        if shards_per_client < 1:
            raise ValueError(f"shards_per_client must be >= 1, got {shards_per_client}.")
        if num_clients * shards_per_client > n:
            raise ValueError(
                f"num_clients x shards_per_client = {num_clients * shards_per_client} shards exceed "
                f"the {n} training samples."
            )
    if scheme == "natural":
        if g is None:
            cols = getattr(data, "columns", None)
            if cols is not None:  # a dataset with columns (hf): the groups are one of them
                raise ValueError(
                    f"The 'natural' partition of dataset {name!r} needs the column that names each sample's group: "
                    f"set partition_by=<column> (its columns of ids: {', '.join(sorted(cols)) or 'none'}).")
            PARTITIONERS["natural"](labels, num_clients, seed, groups=None)  # raises the clear error
        if len(g) != n:
            raise ValueError(f"groups has {len(g)} entries but there are {n} training samples.")
        if partition_by is not None:  # one client per id: the federation is the column's, not a subset of it
            counts = np.unique(g, return_counts=True)[1]
            clients = int((counts >= min_partition_size).sum())
            if num_clients != clients:
                small = (f" with at least min_partition_size={min_partition_size} samples"
                         if clients < len(counts) else "")
                fix = f"set num_clients={clients}" if clients else "lower min_partition_size"
                raise ValueError(
                    f"The 'natural' partition by {partition_by} has {clients} clients (the distinct {partition_by} "
                    f"values{small}; {len(counts)} in all), but num_clients={num_clients}; {fix}.")

    cache_file = inputs = None
    if cache_dir is not None:
        cache_file, inputs = cache_entry(cache_dir, name, scheme, num_clients, seed, used, partition_by, labels,
                                         g if scheme == "natural" else None)
        cached = read_cache(cache_file, inputs, n, num_clients)
        if cached is not None:
            return cached

    parts = PARTITIONERS[scheme](labels, int(num_clients), int(seed), groups=g, num_classes=num_classes, **used)
    parts = [np.asarray(p, dtype=np.int64) for p in parts]

    if cache_file is not None:
        write_cache(cache_file, inputs, parts)
    return parts


def label_histogram(labels: Any, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """Counts ``[num_clients, num_classes]`` of each class in each client's partition."""
    y = _to_numpy(labels).reshape(-1).astype(np.int64)
    out = np.zeros((len(parts), num_classes), dtype=np.int64)
    for i, p in enumerate(parts):
        if len(p):
            out[i] = np.bincount(y[np.asarray(p, dtype=np.int64)], minlength=num_classes)[:num_classes]
    return out
