"""Partitioners: coverage, disjointness, label skew, sizes, determinism, disk cache, validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsuite.data import PARTITIONERS, label_histogram, load_dataset, partition_indices

N, C = 2000, 10
LABELS = np.random.default_rng(0).integers(0, C, N)


def _check_disjoint(parts, n=N, full=True):
    flat = np.concatenate(parts)
    assert flat.dtype == np.int64
    assert len(np.unique(flat)) == len(flat), "a sample is in two partitions"
    assert flat.min() >= 0 and flat.max() < n
    if full:
        assert len(flat) == n


def _mean_entropy(parts, labels=LABELS):
    h = label_histogram(labels, parts, C).astype(float)
    p = h / h.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=1)
    return float(ent.mean())


def test_names_are_registered():
    assert {"iid", "dirichlet", "dirichlet-equal", "pathological", "shards", "natural"} <= set(PARTITIONERS)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "pathological"])
def test_cover_everything_without_overlap(scheme):
    parts = partition_indices(LABELS, scheme, 20, seed=1)
    assert len(parts) == 20 and all(len(p) > 0 for p in parts)
    _check_disjoint(parts)


def test_iid_sizes_and_balance():
    parts = partition_indices(torch.as_tensor(LABELS), "iid", 8, seed=0)
    assert {len(p) for p in parts} == {N // 8}
    ent = _mean_entropy(parts)
    assert ent > 0.95 * np.log(C)


def test_dirichlet_skew_grows_as_alpha_falls():
    ents = [_mean_entropy(partition_indices(LABELS, "dirichlet", 10, seed=2, alpha=a)) for a in (100.0, 1.0, 0.1)]
    assert ents[0] > ents[1] > ents[2]
    assert ents[0] > 0.95 * np.log(C) and ents[2] < 0.6 * np.log(C)


def test_dirichlet_min_partition_size():
    parts = partition_indices(LABELS, "dirichlet", 20, seed=3, alpha=0.3, min_partition_size=30)
    assert min(len(p) for p in parts) >= 30
    _check_disjoint(parts)


def test_dirichlet_equal_has_equal_sizes_and_skew():
    parts = partition_indices(LABELS, "dirichlet-equal", 10, seed=4, alpha=0.1)
    assert {len(p) for p in parts} == {N // 10}
    _check_disjoint(parts)
    iid = _mean_entropy(partition_indices(LABELS, "dirichlet-equal", 10, seed=4, alpha=1000.0))
    assert _mean_entropy(parts) < iid
    odd = partition_indices(LABELS[:1003], "dirichlet-equal", 10, seed=4, alpha=0.5)
    assert {len(p) for p in odd} == {100}
    _check_disjoint(odd, n=1003, full=False)


def test_dirichlet_refill_equal_sizes_may_repeat():
    parts = partition_indices(LABELS, "dirichlet-refill", 40, seed=5, alpha=0.1)
    assert {len(p) for p in parts} == {N // 40}
    flat = np.concatenate(parts)
    assert flat.min() >= 0 and flat.max() < N
    assert len(np.unique(flat)) < len(flat)  # exhausted class pools were refilled: samples repeat
    again = partition_indices(LABELS, "dirichlet-refill", 40, seed=5, alpha=0.1)
    assert all(np.array_equal(x, y) for x, y in zip(parts, again))
    assert _mean_entropy(parts) < 0.7 * np.log(C)


@pytest.mark.parametrize("n_classes", [1, 2, 3])
def test_pathological_exact_classes(n_classes):
    parts = partition_indices(LABELS, "pathological", 20, seed=6, classes_per_client=n_classes)
    hist = label_histogram(LABELS, parts, C)
    assert ((hist > 0).sum(axis=1) == n_classes).all()
    _check_disjoint(parts, full=False)
    if n_classes == 2:  # first-deterministic: every class is used
        _check_disjoint(parts)


def test_shards():
    parts = partition_indices(LABELS, "shards", 20, seed=7, shards_per_client=2)
    assert {len(p) for p in parts} == {N // 40 * 2}
    _check_disjoint(parts, full=False)
    assert ((label_histogram(LABELS, parts, C) > 0).sum(axis=1) <= 4).all()


def test_natural_on_groups():
    b = load_dataset("synthetic", "unused", num_devices=30, seed=1)
    parts = partition_indices(b, "natural", 30, seed=0)
    _check_disjoint(parts, n=len(b.y_train))
    for p in parts:
        assert len(np.unique(b.groups[p])) == 1
    assert sorted(len(p) for p in parts) == sorted(np.bincount(b.groups).tolist())
    sub = partition_indices(b, "natural", 10, seed=0, min_partition_size=60)
    assert len(sub) == 10 and min(len(p) for p in sub) >= 60
    assert [len(p) for p in sub] == [len(p) for p in partition_indices(b, "natural", 10, seed=0, min_partition_size=60)]
    with pytest.raises(ValueError, match="groups"):
        partition_indices(b, "natural", 31, seed=0)
    with pytest.raises(ValueError, match="natural groups"):
        partition_indices(LABELS, "natural", 5, seed=0)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "dirichlet-equal", "pathological", "shards"])
def test_same_seed_same_split_other_seed_differs(scheme):
    kw = {"classes_per_client": 3} if scheme == "pathological" else {}
    a = partition_indices(LABELS, scheme, 10, seed=11, **kw)
    b = partition_indices(LABELS, scheme, 10, seed=11, **kw)
    c = partition_indices(LABELS, scheme, 10, seed=12, **kw)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("scheme, ours, flower", [
    ("iid", {}, lambda fp, seed: fp.IidPartitioner(num_partitions=10)),
    ("dirichlet", {"alpha": 0.3}, lambda fp, seed: fp.DirichletPartitioner(
        num_partitions=10, partition_by="label", alpha=0.3, min_partition_size=10, self_balancing=True,
        shuffle=True, seed=seed)),
    ("dirichlet-equal", {"alpha": 0.3}, lambda fp, seed: fp.InnerDirichletPartitioner(
        partition_sizes=[N // 10] * 10, partition_by="label", alpha=0.3, shuffle=True, seed=seed)),
    ("pathological", {"classes_per_client": 3, "class_assignment": "random"}, lambda fp, seed: fp.PathologicalPartitioner(
        num_partitions=10, partition_by="label", num_classes_per_partition=3, class_assignment_mode="random",
        shuffle=True, seed=seed)),
    ("shards", {"shards_per_client": 2}, lambda fp, seed: fp.ShardPartitioner(
        num_partitions=10, partition_by="label", num_shards_per_partition=2, shuffle=True, seed=seed)),
])
def test_the_partitions_are_flower_datasets_partitions(scheme, ours, flower):
    """partition_indices hands Flower Datasets an Arrow-formatted table (fast column reads); the
    indices equal those of the same partitioner used as its docs show it, on a default-format
    ``datasets.Dataset`` shuffled with the same seed: ``[p.load_partition(i)["idx"] ...]``."""
    import warnings

    import datasets
    import flwr_datasets.partitioner as fp

    seed = 5
    order = np.random.default_rng(seed).permutation(N)
    p = flower(fp, seed)
    p.dataset = datasets.Dataset.from_dict({"label": LABELS[order], "idx": order})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = [np.array(p.load_partition(i)["idx"]) for i in range(10)]
    parts = partition_indices(LABELS, scheme, 10, seed=seed, **ours)
    assert len(parts) == 10 and all(np.array_equal(a, b) for a, b in zip(parts, expected))


def test_disk_cache_hit_returns_identical_arrays(tmp_path, monkeypatch):
    first = partition_indices(LABELS, "dirichlet", 10, seed=3, alpha=0.5, cache_dir=tmp_path)
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1

    def boom(*args, **kwargs):
        raise AssertionError("cache miss: the partitioner ran again")

    monkeypatch.setitem(PARTITIONERS, "dirichlet", boom)
    again = partition_indices(LABELS, "dirichlet", 10, seed=3, alpha=0.5, cache_dir=tmp_path)
    assert len(again) == len(first) and all(np.array_equal(x, y) and y.dtype == np.int64 for x, y in zip(first, again))
    # a different input is a different key
    with pytest.raises(AssertionError, match="cache miss"):
        partition_indices(LABELS, "dirichlet", 10, seed=3, alpha=0.3, cache_dir=tmp_path)
    other = LABELS.copy()
    other[0] = (other[0] + 1) % C
    with pytest.raises(AssertionError, match="cache miss"):
        partition_indices(other, "dirichlet", 10, seed=3, alpha=0.5, cache_dir=tmp_path)


def test_a_cache_hit_does_not_import_flwr_datasets(tmp_path):
    """Every Ray actor and the CLI read the cached partition; importing flwr_datasets (1.3-2.3 s) is
    paid only by the process that computes it."""
    import subprocess
    import sys

    partition_indices(LABELS, "dirichlet", 10, seed=3, alpha=0.5, cache_dir=tmp_path)
    np.save(tmp_path / "labels.npy", LABELS)
    code = ("import sys, numpy as np; from fedsuite.data import partition_indices; "
            f"p = partition_indices(np.load({str(tmp_path / 'labels.npy')!r}), 'dirichlet', 10, seed=3, alpha=0.5, "
            f"cache_dir={str(tmp_path)!r}); print(len(p), 'flwr_datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["10", "False"]
    assert len(list(tmp_path.glob("*.npz"))) == 1  # the hit: no second cache file


def test_validation_messages():
    with pytest.raises(ValueError, match="larger than the number of training samples"):
        partition_indices(LABELS[:5], "iid", 6, seed=0)
    with pytest.raises(ValueError, match="Unknown partition scheme"):
        partition_indices(LABELS, "dirichlett", 4, seed=0)
    with pytest.raises(ValueError, match="alpha"):
        partition_indices(LABELS, "dirichlet", 4, seed=0, alpha=0.0)
    with pytest.raises(ValueError, match="classes_per_client"):
        partition_indices(LABELS, "pathological", 4, seed=0, classes_per_client=11)
    with pytest.raises(ValueError, match="num_clients"):
        partition_indices(LABELS, "iid", 0, seed=0)
    with pytest.raises(ValueError, match="min_partition_size"):
        partition_indices(LABELS, "dirichlet", 100, seed=0, min_partition_size=50)
    with pytest.raises(ValueError, match="shards"):
        partition_indices(LABELS, "shards", 100, seed=0, shards_per_client=50)


def test_label_histogram():
    parts = [np.array([0, 1, 2]), np.array([3]), np.array([], dtype=np.int64)]
    h = label_histogram(np.array([1, 1, 0, 2]), parts, 3)
    assert h.tolist() == [[1, 2, 0], [0, 0, 1], [0, 0, 0]]
