"""The dataset bundle: every dataset becomes one :class:`DatasetBundle` of in-memory tensors, and
what every loader's bundle is checked against.

Images are decoded once into ``uint8`` tensors ``[N, C, H, W]``; feature vectors are ``float32``
``[N, D]``. Normalisation (``mean``/``std``, applied after ``/255`` by :func:`fedsuite.data.to_float`)
and the default training augmentation are metadata on the bundle, so the training loop can
augment and normalise whole batches on the training device. The loaders build bundles with the
helpers here: labels as int64 (:func:`_as_labels`), the class count of labels without a declared
one (:func:`_declared_classes`), the per-channel statistics of images without published ones
(:func:`_channel_stats`); :func:`check_bundle` refuses a bundle no round could use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["AUGMENT_KINDS", "DatasetBundle", "DatasetError", "check_bundle"]

#: Augmentation kinds understood by :func:`fedsuite.data.augment_batch`.
AUGMENT_KINDS = ("none", "crop-flip", "crop-flip-p50", "crop", "flip")


class DatasetError(Exception):
    """A dataset cannot be loaded; the message is one paragraph meant for the user."""


@dataclass(frozen=True)
class DatasetBundle:
    """A whole dataset as tensors, plus what the training loop needs to use it."""

    name: str
    x_train: torch.Tensor  # images: uint8 [N,C,H,W]; vectors: float32 [N,D]
    y_train: torch.Tensor  # int64 [N]
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]  # (C,H,W) or (D,)
    mean: tuple[float, ...] | None  # per channel, applied after /255; None for vectors
    std: tuple[float, ...] | None
    augment: str  # one of AUGMENT_KINDS
    groups: np.ndarray | None = None  # natural-partition id per training sample
    # per test sample, the natural-partition id (of ``groups``) whose own test split it is; -1 for a
    # test sample of a group without training data. Datasets whose clients have test splits of their
    # own (synthetic's devices, FEMNIST's writers); a natural partition's federated evaluation uses them
    test_groups: np.ndarray | None = None
    # dataset hf: per training sample, the index of its value among the sorted distinct values of
    # each column of ids (integers, text, booleans) besides the image, for ``partition_by``
    columns: dict[str, np.ndarray] | None = None

    @property
    def is_image(self) -> bool:
        return self.x_train.dtype == torch.uint8

    def __repr__(self) -> str:  # tensors would flood the terminal
        return (
            f"DatasetBundle(name={self.name!r}, train={tuple(self.x_train.shape)}, "
            f"test={tuple(self.x_test.shape)}, num_classes={self.num_classes}, "
            f"augment={self.augment!r}, mean={self.mean}, std={self.std}, "
            f"groups={'None' if self.groups is None else len(np.unique(self.groups))}"
            + (f", columns={sorted(self.columns)})" if self.columns is not None else ")")
        )


def _as_labels(y: Any, where: str = "labels") -> torch.Tensor:
    """Labels as int64; float labels are accepted only when every value is a whole number."""
    a = np.asarray(y)
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a) | (a != np.round(a))
        if bad.any():
            raise DatasetError(f"{where} must be integers, but holds {a[bad].flat[0]!r} (at index {int(np.argmax(bad.reshape(-1)))}).")
    elif a.size and a.dtype.kind not in "iub":
        raise DatasetError(f"{where} must be integers, got an array of dtype {a.dtype}.")
    return torch.as_tensor(a, dtype=torch.int64).reshape(-1)


def check_bundle(b: DatasetBundle, source: str = "") -> DatasetBundle:
    """Reject data no round could use, with one line naming the problem: empty splits,
    NaN/inf features, labels outside ``[0, num_classes)``."""
    where = f"Dataset '{b.name}'" + (f" ({source})" if source else "")
    for split, x, y in (("train", b.x_train, b.y_train), ("test", b.x_test, b.y_test)):
        if len(y) == 0 or len(x) == 0:
            raise DatasetError(f"{where}: the {split} split is empty; it needs at least one sample.")
        if len(x) != len(y):
            raise DatasetError(f"{where}: x_{split} has {len(x)} samples but y_{split} has {len(y)} labels.")
        if x.is_floating_point():
            finite = torch.isfinite(x).reshape(len(x), -1).all(dim=1)
            if not bool(finite.all()):
                i = int((~finite).nonzero()[0])
                raise DatasetError(f"{where}: x_{split} holds NaN or inf values (first in sample {i}).")
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= b.num_classes:
            bad = lo if lo < 0 else hi
            raise DatasetError(f"{where}: y_{split} holds label {bad}, outside 0..{b.num_classes - 1} "
                               f"(num_classes={b.num_classes}).")
    return b


def _declared_classes(y_train: torch.Tensor, path: Path | str, source: str = "npz") -> int:
    """The class count an npz without ``num_classes`` declares: C = max(y_train) + 1, provided every
    class 0..C-1 occurs in y_train. A gap is refused rather than guessed: one stray label of 10**9
    would otherwise declare a billion classes (and a model head of that size)."""
    if not len(y_train) or int(y_train.min()) < 0:
        return int(y_train.max()) + 1 if len(y_train) else 1  # check_bundle names the bad label
    top = int(y_train.max())
    present = torch.unique(y_train)
    if len(present) < top + 1:
        absent = top + 1 - len(present)
        first = next(c for c in range(top + 1) if c >= len(present) or int(present[c]) != c)
        raise DatasetError(
            f"{source}: y_train in {path} has labels up to {top}, but {absent} of the classes 0..{top} never occur "
            f"(the first: {first}); labels must be 0..C-1 with every class in y_train, or declare the classes with "
            f"dataset_options={{num_classes=C}}.")
    return top + 1


def _channel_stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean/std of uint8 images [N,C,H,W] in [0,1] units (chunked)."""
    c = x.shape[1]
    s = torch.zeros(c, dtype=torch.float64)
    s2 = torch.zeros(c, dtype=torch.float64)
    n = 0
    for start in range(0, x.shape[0], 4096):
        chunk = x[start : start + 4096].to(torch.float64) / 255.0
        s += chunk.sum(dim=(0, 2, 3))
        s2 += (chunk * chunk).sum(dim=(0, 2, 3))
        n += chunk.shape[0] * chunk.shape[2] * chunk.shape[3]
    mean = s / max(n, 1)
    std = (s2 / max(n, 1) - mean * mean).clamp_min(1e-12).sqrt()
    return tuple(round(float(v), 4) for v in mean), tuple(round(max(float(v), 1e-3), 4) for v in std)
