"""The on-disk cache of partitions: one ``.npz`` per partition, keyed by a hash of all its inputs.

A cache carries its identity: that hash in full and a SHA-256 of its contents (indices and offsets);
one whose inputs or contents do not match (another partition's file, reordered or altered indices)
or that is malformed is not used (:func:`read_cache` answers None), and the partition, recomputed,
overwrites it (:func:`write_cache`). Caching is an optimisation only: a cache that cannot be
written is skipped.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["cache_entry", "read_cache", "write_cache"]

_CACHE_VERSION = 1


def _flwr_datasets_version() -> str:
    """flwr-datasets' version from its package metadata: importing the package to read
    ``__version__`` costs 1.3-2.3 s, paid by every process that reads a cached partition (each Ray
    actor, the CLI's data check) although a cache hit never calls a partitioner."""
    try:
        return importlib.metadata.version("flwr-datasets")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def cache_entry(
    cache_dir: str | Path, name: str, scheme: str, num_clients: int, seed: int, params: dict[str, Any],
    partition_by: str | None, labels: np.ndarray, groups: np.ndarray | None,
) -> tuple[Path, str]:
    """The cache file of a partition and the hex SHA-256 of its inputs: the cache version,
    flwr-datasets' version, ``scheme``, ``num_clients``, ``seed``, ``params`` (those the scheme
    uses), ``partition_by`` when set, the labels' bytes and, when given, the groups' bytes. The
    file is ``<cache_dir>/<name>-<scheme>-<num_clients>c-seed<seed>-<first 16 hex digits>.npz``
    (``name`` with every character other than letters, digits, ``-`` and ``_`` as ``_``)."""
    h = hashlib.sha256()
    h.update(json.dumps(
        {"v": _CACHE_VERSION, "flwr_datasets": _flwr_datasets_version(),
         "scheme": scheme, "num_clients": int(num_clients), "seed": int(seed), "params": params,
         **({"partition_by": partition_by} if partition_by is not None else {})},
        sort_keys=True,
    ).encode())
    h.update(labels.tobytes())
    if groups is not None:
        h.update(b"groups")
        h.update(groups.tobytes())
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)
    inputs = h.hexdigest()
    return Path(cache_dir) / f"{safe}-{scheme}-{num_clients}c-seed{seed}-{inputs[:16]}.npz", inputs


def read_cache(cache_file: Path, inputs: str, n: int, num_clients: int) -> list[np.ndarray] | None:
    """The partition stored in ``cache_file``, one index array per client, when the file was
    computed from ``inputs`` (:func:`cache_entry`), its contents match their digest and it is well
    formed for ``n`` training samples and ``num_clients`` clients; else None (no file, an
    unreadable one, another partition's, altered contents)."""
    if not cache_file.is_file():
        return None
    try:
        with np.load(cache_file) as z:
            flat, offsets = z["indices"], z["offsets"]
            # its identity: the inputs it was computed from, and a digest of its contents
            stored_inputs, stored_digest = str(z["inputs"]), str(z["digest"])
        if stored_inputs == inputs and stored_digest == _contents_digest(flat, offsets) and \
                _well_formed(flat, offsets, n, num_clients):
            return [flat[offsets[i]: offsets[i + 1]].copy() for i in range(len(offsets) - 1)]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # unreadable cache, or one of other inputs or altered contents: recompute and overwrite
    return None


def write_cache(cache_file: Path, inputs: str, parts: Sequence[np.ndarray]) -> None:
    """Store ``parts`` in ``cache_file`` (written aside, then renamed into place) with ``inputs``
    and the digest of its contents; a file that cannot be written is skipped."""
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
        flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        tmp = cache_file.with_name(cache_file.name + f".tmp{os.getpid()}.npz")
        np.savez(tmp, indices=flat, offsets=offsets, inputs=np.array(inputs),
                 digest=np.array(_contents_digest(flat, offsets)))
        os.replace(tmp, cache_file)
    except OSError:
        pass  # caching is an optimisation only


def _contents_digest(flat: np.ndarray, offsets: np.ndarray) -> str:
    """SHA-256 of a cached partition's contents (its indices and offsets, as int64, in order)."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(flat, dtype=np.int64).tobytes())
    h.update(b"offsets")
    h.update(np.ascontiguousarray(offsets, dtype=np.int64).tobytes())
    return h.hexdigest()


def _well_formed(flat: np.ndarray, offsets: np.ndarray, n: int, num_clients: int) -> bool:
    """A cached partition's shape: one slice per client, non-decreasing offsets from 0 to the
    indices' length, every index a training sample's."""
    return (offsets.ndim == 1 and len(offsets) == num_clients + 1 and int(offsets[0]) == 0
            and int(offsets[-1]) == len(flat) and bool(np.all(np.diff(offsets) >= 0))
            and (len(flat) == 0 or (int(flat.min()) >= 0 and int(flat.max()) < n)))
