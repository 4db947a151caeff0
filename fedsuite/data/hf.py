"""Dataset ``hf``: any Hugging Face dataset of images, from the hub's cache or a local copy.

``path`` is a hub id (``uoft-cs/cifar10``, ``flwrlabs/femnist``) or a local folder: a
``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` folder, or a folder of data files that
``datasets.load_dataset`` reads (parquet, arrow, csv, json, or images in ``<split>/<class>/``
folders through its ``imagefolder`` builder). A relative path that exists under the data root is
that local folder, so a copy saved as ``<data_root>/uoft-cs/cifar10`` is found under its hub id.

Hub ids are read from the Hugging Face datasets cache first, with the hub switched off (no network
at all, so a cached dataset loads the same on a machine without internet). Only a dataset that is
not cached is downloaded, and only when the hub answers within :data:`HUB_PROBE_TIMEOUT_S` seconds
and neither ``HF_HUB_OFFLINE`` nor ``HF_DATASETS_OFFLINE`` is set; otherwise the loader stops with
one line naming what is missing and how to get it.

What becomes the bundle:

* splits: ``train`` and ``test``, else ``train`` and the one of ``validation``/``valid``/``val``
  (``train_split``, ``test_split`` choose others); ``test_fraction`` holds out a seeded share of
  the training split instead (``flwrlabs/femnist`` has only ``train``).
* the image column: the one ``Image`` feature, else the one named ``img`` or ``image``
  (``image_column``); images become uint8 ``[N, C, H, W]``: C = 1 when every image is greyscale,
  else 3 (``mode`` "L" or "RGB" forces one); images of different sizes need ``size`` (resized to
  size x size), as for ``imagefolder``.
* the label column: the one ``ClassLabel`` feature, else the one named ``label``, ``labels``,
  ``fine_label``, ``class`` or ``target`` (``label_column``); integer labels must be 0..C-1
  (``num_classes`` declares C), text labels become the indices of their sorted distinct values.
* every other column of integers, text or booleans travels with the bundle as ``columns`` (per
  training sample, the index of its value among the sorted distinct values), for
  ``--partitioner natural --set partition_by=<column>`` (e.g. FEMNIST's ``writer_id``).

Datasets without an image column (tabular features) are not supported here: export the features
to an ``.npz`` with float ``x_train``/``x_test`` ``[N, D]`` and use dataset ``npz``.

The decoded images and their per-channel mean/std are cached under
``<data_root>/.fedsuite_cache/hf-<name>-<key>.pt``; the key covers the dataset's Arrow files
(path, size, modification time), the splits and columns chosen and the decoding options, so a
changed dataset is decoded again.

Where the dataset is read from is :mod:`fedsuite.data.hf_source`; which of its splits and columns
become the bundle, :mod:`fedsuite.data.hf_columns`; this module decodes the images and builds the
bundle (:func:`load_hf`).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .bundle import DatasetBundle, DatasetError, _channel_stats
from .files import _cached_decode
from .hf_columns import _arrow_column, _codes, _columns_text, _is_ids, _labels, _pick_column, _pick_splits
from .hf_source import _load_hub, _load_local, _one_line, _quiet, _resolve

__all__ = ["load_hf"]

_GREY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"}
#: the row order of test_fraction's hold-out (fixed: the split is part of the dataset, not of a run)
_HOLDOUT_SEED = 0


# --------------------------------------------------------------------------------------------
# images


def _decode(ds: Any, column: str, rows: np.ndarray | None, mode: str, size: int | None, split: str,
            where: str) -> tuple[list[np.ndarray], tuple[int, int] | None, tuple[str, tuple[int, int]] | None]:
    """Decode one split's image column with PIL, 1024 rows at a time: uint8 chunks [n, H, W, C]
    (C = 1 for greyscale images in mode "auto"), plus the first image's size and a description of
    it for the size-mismatch error."""
    from PIL import Image

    table = ds.with_format("arrow", columns=[column])  # the encoded images, read 1024 rows at a time
    n = len(ds) if rows is None else len(rows)
    chunks: list[np.ndarray] = []
    first: tuple[str, tuple[int, int]] | None = None
    for start in range(0, n, 1024):
        batch = table[start:start + 1024] if rows is None else table[rows[start:start + 1024].tolist()]
        arrays = []
        for i, item in enumerate(batch.column(column).to_pylist(), start=start):
            what = f"{split} row {i if rows is None else int(rows[i])}"
            data = (item or {}).get("bytes")
            src: Any = io.BytesIO(data) if data is not None else (item or {}).get("path")
            if src is None:
                raise DatasetError(f"hf: {where}: the image of {what} is missing (column {column!r}).")
            try:
                with Image.open(src) as im:
                    m = mode if mode != "auto" else ("L" if im.mode in _GREY_MODES else "RGB")
                    im = im.convert(m)
                    if size is not None and im.size != (size, size):
                        im = im.resize((size, size), Image.BILINEAR)
                    arr = np.asarray(im, dtype=np.uint8)
            except (OSError, SyntaxError, ValueError) as exc:  # not an image, truncated, unreadable
                raise DatasetError(f"hf: {where}: the image of {what} cannot be read ({type(exc).__name__}: "
                                   f"{_one_line(exc, 120)}).") from None
            arr = arr[:, :, None] if arr.ndim == 2 else arr
            if first is None:
                first = (what, arr.shape[:2])
            elif arr.shape[:2] != first[1]:
                (h0, w0), (h, w) = first[1], arr.shape[:2]
                raise DatasetError(
                    f"hf: images of {where} have different sizes: {first[0]} is {w0}x{h0} but {what} is {w}x{h}. "
                    "Pass the option size=<pixels> to resize every image to a square of that size when loading.")
            arrays.append(arr)
        if arrays:
            chunks.append(_stack(arrays))
    return chunks, (first[1] if first else None), first


def _stack(arrays: list[np.ndarray]) -> np.ndarray:
    """Stack HWC images whose channels are 1 or 3 (greyscale next to colour becomes colour)."""
    c = max(a.shape[2] for a in arrays)
    return np.stack([np.repeat(a, c, axis=2) if a.shape[2] != c else a for a in arrays])


def _to_tensor(chunks: list[np.ndarray], channels: int, hw: tuple[int, int]) -> torch.Tensor:
    if not chunks:
        return torch.zeros((0, channels, *hw), dtype=torch.uint8)
    x = np.concatenate([np.repeat(c, channels, axis=3) if c.shape[3] != channels else c for c in chunks])
    return torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()


# --------------------------------------------------------------------------------------------
# the loader


def load_hf(
    root: Path,
    *,
    path: str | None = None,
    config_name: str | None = None,
    train_split: str | None = None,
    test_split: str | None = None,
    test_fraction: float | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    num_classes: int | None = None,
    mode: str = "auto",
    size: int | None = None,
    cache_dir: str | None = None,
) -> DatasetBundle:
    """A Hugging Face dataset of images (``path``: a hub id such as ``uoft-cs/cifar10``, or a local copy)."""
    if path is None or not str(path).strip():
        raise DatasetError('Dataset \'hf\' needs the option path=<hub id such as "uoft-cs/cifar10", or a local '
                           "folder: save_to_disk output, parquet files or image folders>.")
    if mode not in ("auto", "RGB", "L"):
        raise DatasetError(f"hf: mode must be 'auto', 'RGB' or 'L', got {mode!r}.")
    if size is not None and (not isinstance(size, int) or size < 1):
        raise DatasetError(f"hf: size must be a positive number of pixels, got {size!r}.")
    if test_fraction is not None and not (isinstance(test_fraction, (int, float)) and 0 < test_fraction < 1):
        raise DatasetError(f"hf: test_fraction must be between 0 and 1 (e.g. 0.1), got {test_fraction!r}.")
    if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 1):
        raise DatasetError(f"hf: num_classes must be a positive integer, got {num_classes!r}.")
    import datasets

    path = str(path)
    if cache_dir is not None:
        cache_dir = str(Path(cache_dir).expanduser())
    local = _resolve(path, root)
    with _quiet():
        if local is not None:
            dd, where = _load_local(local, config_name, cache_dir), str(local)
        elif Path(path).expanduser().is_absolute() or path.startswith((".", "~")) or path.count("/") > 1:
            raise DatasetError(f"hf: {Path(path).expanduser()} does not exist; path is a local folder or a Hugging "
                               "Face hub id such as uoft-cs/cifar10.")
        else:
            dd, where = _load_hub(path, config_name, cache_dir), path

    train, test = _pick_splits(list(dd), train_split, test_split, where, test_fraction is not None)
    ds_tr = dd[train]
    ds_te = dd[test] if test is not None else ds_tr
    features = ds_tr.features
    img_col = _pick_column("image", "image_column", image_column, features, where)
    lab_col = _pick_column("label", "label_column", label_column, features, where)
    if img_col == lab_col:
        raise DatasetError(f"hf: image_column and label_column are both {img_col!r}.")
    for name, split in ((img_col, test), (lab_col, test)):
        if split is not None and name not in ds_te.features:
            raise DatasetError(f"hf: the test split {split!r} of {where} has no column {name!r}; its columns: "
                               f"{_columns_text(ds_te.features)}.")
    f_te = ds_te.features[lab_col]
    if isinstance(features[lab_col], datasets.ClassLabel) and isinstance(f_te, datasets.ClassLabel) and (
            f_te.names != features[lab_col].names):
        raise DatasetError(f"hf: the label column {lab_col!r} of {where} names its classes differently in the splits "
                           f"{train!r} and {test!r}; both splits need the same ClassLabel.")
    rows_tr = rows_te = None
    if test_fraction is not None:
        n = len(ds_tr)
        n_te = min(max(1, int(round(test_fraction * n))), n - 1) if n > 1 else 0
        perm = np.random.default_rng(_HOLDOUT_SEED).permutation(n)
        rows_te, rows_tr = np.sort(perm[:n_te]), np.sort(perm[n_te:])

    y_tr, y_te, n_cls = _labels(features[lab_col], _arrow_column(ds_tr, lab_col, rows_tr),
                                _arrow_column(ds_te, lab_col, rows_te), lab_col, where, num_classes)

    def build() -> dict[str, Any]:
        tr, hw_tr, first_tr = _decode(ds_tr, img_col, rows_tr, mode, size, train, where)
        te, hw_te, first_te = _decode(ds_te, img_col, rows_te, mode, size, test or f"{train} (held out)", where)
        if hw_tr is not None and hw_te is not None and hw_tr != hw_te:
            (h0, w0), (h, w) = hw_tr, hw_te
            raise DatasetError(
                f"hf: images of {where} have different sizes: {first_tr[0]} is {w0}x{h0} but {first_te[0]} is "
                f"{w}x{h}. Pass the option size=<pixels> to resize every image to a square of that size when loading.")
        channels = max([c.shape[3] for c in tr + te] or [1 if mode == "L" else 3])
        hw = hw_tr or hw_te or (size or 0, size or 0)
        x_tr, x_te = _to_tensor(tr, channels, hw), _to_tensor(te, channels, hw)
        mean, std = _channel_stats(x_tr) if len(x_tr) else ((0.0,) * channels, (1.0,) * channels)
        return {"x_train": x_tr, "x_test": x_te, "mean": list(mean), "std": list(std)}

    files = sorted({Path(f["filename"]) for d in (ds_tr, ds_te) for f in d.cache_files})
    extra = ["hf", where, config_name, train, test, test_fraction, img_col, mode, size, len(ds_tr), len(ds_te)]
    if files and all(f.is_file() for f in files):
        tag = "hf-" + "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in path.strip("/").split("/")[-1])
        data = _cached_decode(root, tag, files, extra, build)
    else:  # an in-memory dataset: nothing on disk to key a cache on
        data = build()

    columns = {name: _codes(_arrow_column(ds_tr, name, rows_tr))
               for name, feature in features.items() if name != img_col and _is_ids(feature)}
    x_tr = data["x_train"]
    return DatasetBundle(
        name="hf", x_train=x_tr, y_train=y_tr, x_test=data["x_test"], y_test=y_te, num_classes=n_cls,
        input_shape=tuple(x_tr.shape[1:]), mean=tuple(data["mean"]), std=tuple(data["std"]), augment="none",
        columns=columns,
    )
