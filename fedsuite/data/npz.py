"""Dataset ``npz``: bring your own arrays, one ``.npz`` file with x_train, y_train, x_test, y_test."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch

from .bundle import DatasetBundle, DatasetError, _as_labels, _channel_stats, _declared_classes
from .files import _missing_error

__all__ = ["load_npz"]


def _npz_images(x: np.ndarray, key: str, path: Path) -> torch.Tensor:
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4:
        raise DatasetError(f"npz: {key} in {path} has shape {x.shape}; uint8 images must be NHWC, NCHW or NHW.")
    if x.shape[1] not in (1, 3, 4) and x.shape[-1] in (1, 3, 4):
        x = np.transpose(x, (0, 3, 1, 2))
    return torch.from_numpy(np.ascontiguousarray(x))


def load_npz(root: Path, *, path: str | Path | None = None, num_classes: int | None = None) -> DatasetBundle:
    """Bring-your-own arrays: a ``.npz`` with x_train, y_train, x_test, y_test.

    uint8 images may be NHWC, NCHW or NHW (grey); float arrays of shape [N, D] are feature vectors.
    ``num_classes`` defaults to the classes of y_train, which must then be 0..C-1 with every one
    present (:func:`_declared_classes`); labels outside the classes are refused (``check_bundle``).
    """
    if path is None:
        raise DatasetError("Dataset 'npz' needs the option path=<file.npz with x_train, y_train, x_test, y_test>.")
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = root / p
    keys = ("x_train", "y_train", "x_test", "y_test")
    if not p.is_file():
        raise _missing_error("npz", [p], f"one .npz file with arrays {', '.join(keys)}.")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrs = {k: z[k] for k in keys if k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # truncated or not an npz
        raise DatasetError(f"npz: {p} could not be read as a numpy .npz file ({exc}).") from None
    absent = [k for k in keys if k not in arrs]
    if absent:
        raise DatasetError(f"npz: {p} lacks the arrays {', '.join(absent)}; it must hold {', '.join(keys)}.")
    xtr, xte = arrs["x_train"], arrs["x_test"]
    if xtr.dtype == np.uint8:
        if xte.dtype != np.uint8:
            raise DatasetError(f"npz: x_train is uint8 but x_test is {xte.dtype} in {p}; use the same dtype.")
        x_tr, x_te = _npz_images(xtr, "x_train", p), _npz_images(xte, "x_test", p)
        mean, std = _channel_stats(x_tr)
    elif np.issubdtype(xtr.dtype, np.floating) and xtr.ndim == 2 and xte.ndim == 2:
        x_tr = torch.from_numpy(xtr.astype(np.float32))
        x_te = torch.from_numpy(xte.astype(np.float32))
        mean = std = None
    else:
        raise DatasetError(
            f"npz: x_train in {p} is {xtr.dtype} with shape {xtr.shape}; expected uint8 images "
            "(NHWC/NCHW/NHW) or float feature vectors [N, D]."
        )
    if x_tr.shape[1:] != x_te.shape[1:]:
        raise DatasetError(f"npz: x_train {tuple(x_tr.shape)} and x_test {tuple(x_te.shape)} differ in shape in {p}.")
    y_tr, y_te = _as_labels(arrs["y_train"], f"npz: y_train in {p}"), _as_labels(arrs["y_test"], f"npz: y_test in {p}")
    if len(y_tr) != len(x_tr) or len(y_te) != len(x_te):
        raise DatasetError(f"npz: label and sample counts differ in {p}.")
    nc = num_classes or _declared_classes(y_tr, p)
    return DatasetBundle(
        name="npz", x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te, num_classes=nc,
        input_shape=tuple(x_tr.shape[1:]), mean=mean, std=std, augment="none",
    )
