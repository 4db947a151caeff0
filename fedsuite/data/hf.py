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
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .bundle import DatasetBundle, DatasetError, _as_labels, _channel_stats, _declared_classes
from .files import _cached_decode

__all__ = ["HUB_PROBE_TIMEOUT_S", "load_hf"]

#: seconds to wait for the hub before a dataset that is not cached is reported missing
HUB_PROBE_TIMEOUT_S = 3.0

_IMAGE_NAMES = ("img", "image")
_LABEL_NAMES = ("label", "labels", "fine_label", "class", "target")
_TEST_NAMES = ("validation", "valid", "val")
_GREY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"}
_TRUE = {"1", "ON", "YES", "TRUE"}
#: the row order of test_fraction's hold-out (fixed: the split is part of the dataset, not of a run)
_HOLDOUT_SEED = 0


def _one_line(exc: BaseException, limit: int = 300) -> str:
    msg = " ".join(str(exc).split())
    return msg if len(msg) <= limit else msg[:limit] + "..."


# --------------------------------------------------------------------------------------------
# offline mode and the hub


def offline_requested() -> bool:
    """Whether the user switched the hub off (``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE``)."""
    import datasets.config

    env = any(os.environ.get(k, "").upper() in _TRUE for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    return env or bool(datasets.config.HF_HUB_OFFLINE)


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Switch the hub off for what runs inside: ``datasets`` and ``huggingface_hub`` read their
    offline flags when they are imported, so the flags they consult at call time are set here
    (and the environment variables, for any process they start), then put back."""
    import datasets.config
    import huggingface_hub.constants as hub_constants

    saved = (datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    saved_env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    os.environ.update({k: "1" for k in saved_env})
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def hub_unreachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """None when the hub's endpoint answers an HTTP request within ``timeout`` seconds (any status:
    the server is there), else why not. The request runs in a daemon thread that is waited for at
    most ``timeout`` + 0.5 seconds, so neither a name lookup nor a connection that never answers (a
    firewall dropping packets) holds the caller longer."""
    import datasets.config

    endpoint = str(datasets.config.HF_ENDPOINT).rstrip("/")
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
            outcome.append(None)
        except urllib.error.HTTPError:
            outcome.append(None)  # an HTTP answer: the hub is reachable
        except Exception as exc:  # noqa: BLE001 - every failure means "not reachable"
            if isinstance(getattr(exc, "reason", exc), TimeoutError):  # urlopen's timeout: connect or read
                outcome.append(f"{endpoint} did not answer within {timeout:g} s")
            else:
                outcome.append(f"{endpoint} did not answer: {_one_line(exc, 120)}")

    thread = threading.Thread(target=probe, name="fedsuite-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)  # urlopen's timeout bounds connect and read; this also bounds a name lookup
    if not outcome:
        return f"{endpoint} did not answer within {timeout:g} s"
    return outcome[0]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars or cache notices from ``datasets`` on the run's output."""
    import datasets

    bars_off, level = datasets.are_progress_bars_disabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if not bars_off:
            datasets.enable_progress_bars()


def _missing_line(path: str, config_name: str | None, cache: str, why: str) -> str:
    args = f'"{path}"' + (f', "{config_name}"' if config_name else "")
    return (
        f"hf: the Hugging Face dataset '{path}' is not in the datasets cache {cache} and cannot be downloaded "
        f"({why}); on a machine with internet run `python -c 'import datasets; datasets.load_dataset({args})'`, "
        f"then copy its ~/.cache/huggingface/datasets to {cache} here, or point path at a local copy "
        "(a save_to_disk folder or parquet files)."
    )


def _load_hub(path: str, config_name: str | None, cache_dir: str | None) -> Any:
    import datasets

    cache = str(Path(cache_dir or datasets.config.HF_DATASETS_CACHE).expanduser())
    kwargs: dict[str, Any] = {"cache_dir": cache_dir} if cache_dir else {}
    try:  # the cache first, hub off: no network wait for a dataset that is there
        with hub_offline():
            return datasets.load_dataset(path, config_name, **kwargs)
    except ValueError as exc:
        if "multiple" in str(exc) and "configuration" in str(exc):  # several configs cached: which one?
            raise DatasetError(f"hf: {_one_line(exc)} (pass it as dataset_options={{config_name=...}}).") from None
    except (ConnectionError, FileNotFoundError):
        pass  # not cached
    if offline_requested():
        raise DatasetError(_missing_line(path, config_name, cache, "HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set"))
    why = hub_unreachable()
    if why is not None:
        raise DatasetError(_missing_line(path, config_name, cache, why))
    try:
        return datasets.load_dataset(path, config_name, **kwargs)
    except ConnectionError as exc:
        raise DatasetError(_missing_line(path, config_name, cache, _one_line(exc, 150))) from None
    except Exception as exc:  # noqa: BLE001 - not on the hub, gated, no data files: the library's words
        raise DatasetError(f"hf: '{path}' could not be loaded from the Hugging Face Hub: {_one_line(exc)}") from None


def _load_local(folder: Path, config_name: str | None, cache_dir: str | None) -> Any:
    import datasets

    try:
        with hub_offline():
            if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
                loaded = datasets.load_from_disk(str(folder))
            elif folder.is_file():
                kind = {".parquet": "parquet", ".arrow": "arrow", ".csv": "csv", ".json": "json",
                        ".jsonl": "json"}.get(folder.suffix.lower())
                if kind is None:
                    raise DatasetError(f"hf: {folder} is a file the datasets library cannot read as a dataset; "
                                       "point path at a folder (or a .parquet, .arrow, .csv or .json file).")
                loaded = datasets.load_dataset(kind, data_files={"train": str(folder)}, cache_dir=cache_dir)
            else:
                loaded = datasets.load_dataset(str(folder), config_name, cache_dir=cache_dir)
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - the library's reason, on one line
        raise DatasetError(
            f"hf: {folder} holds no dataset the datasets library can read (a save_to_disk folder, parquet/arrow/"
            f"csv/json files, or images in <split>/<class>/ folders): {type(exc).__name__}: {_one_line(exc)}"
        ) from None
    return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict({"train": loaded})


def _resolve(path: str, root: Path) -> Path | None:
    """The local file or folder ``path`` names (absolute, ``~``, or relative to the data root), or
    None when it names none (then it is a hub id)."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return p if p.exists() else None
    return (root / p) if (root / p).exists() else None


# --------------------------------------------------------------------------------------------
# splits and columns


def _pick_splits(splits: list[str], train_split: str | None, test_split: str | None, where: str,
                 holdout: bool) -> tuple[str, str | None]:
    shown = ", ".join(splits)
    for opt, name in (("train_split", train_split), ("test_split", test_split)):
        if name is not None and name not in splits:
            raise DatasetError(f"hf: {where} has no split {name!r} ({opt}); its splits: {shown}.")
    train = train_split or ("train" if "train" in splits else None)
    if train is None:
        raise DatasetError(f"hf: {where} has no split named 'train'; its splits: {shown}: name the training "
                           "split with train_split=<name>.")
    if holdout:
        if test_split is not None:
            raise DatasetError("hf: test_split and test_fraction both choose the test set; give one of them.")
        return train, None
    if test_split is None:
        if "test" in splits:
            test_split = "test"
        else:
            cands = [s for s in _TEST_NAMES if s in splits]
            if len(cands) > 1:
                raise DatasetError(f"hf: {where} has the splits {shown}; name the test split with "
                                   f"test_split=<name> ({' or '.join(cands)}).")
            test_split = cands[0] if cands else None
    if test_split is None:
        raise DatasetError(f"hf: {where} has no test split (its splits: {shown}); name one with test_split=<name> "
                           "or hold out a share of the training split with test_fraction=0.1.")
    if test_split == train:
        raise DatasetError(f"hf: train_split and test_split are both {train!r}; use test_fraction to hold out "
                           "part of one split.")
    return train, test_split


def _describe(feature: Any) -> str:
    import datasets

    if isinstance(feature, datasets.Image):
        return "Image"
    if isinstance(feature, datasets.ClassLabel):
        return f"ClassLabel, {feature.num_classes} classes"
    if isinstance(feature, datasets.Value):
        return str(feature.dtype)
    return type(feature).__name__


def _columns_text(features: Any) -> str:
    return ", ".join(f"{name} ({_describe(f)})" for name, f in features.items())


def _is_int(feature: Any) -> bool:
    import datasets

    return isinstance(feature, datasets.Value) and feature.dtype.startswith(("int", "uint"))


def _is_text(feature: Any) -> bool:
    import datasets

    return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")


def _is_ids(feature: Any) -> bool:
    """Whether a column can name groups of samples (``partition_by``): class labels, integers, text, booleans."""
    import datasets

    return (isinstance(feature, datasets.ClassLabel) or _is_int(feature) or _is_text(feature)
            or (isinstance(feature, datasets.Value) and feature.dtype == "bool"))


def _pick_column(kind: str, option: str, given: str | None, features: Any, where: str) -> str:
    """The image (``kind`` "image") or label column: the option, else the one of its feature type,
    else the one with a common name; ambiguity or absence is one line listing the columns."""
    import datasets

    cols = _columns_text(features)
    if kind == "image":
        typed = [c for c, f in features.items() if isinstance(f, datasets.Image)]
        usable, names, what = typed, _IMAGE_NAMES, "an Image feature"
    else:
        typed = [c for c, f in features.items() if isinstance(f, datasets.ClassLabel)]
        usable = typed + [c for c, f in features.items() if _is_int(f) or _is_text(f)]
        names, what = _LABEL_NAMES, "a ClassLabel feature or integer or text values"
    if given is not None:
        if given not in features:
            raise DatasetError(f"hf: {where} has no column {given!r} ({option}); its columns: {cols}.")
        if given not in usable:
            raise DatasetError(f"hf: the {kind} column {given!r} of {where} is {_describe(features[given])}, "
                               f"not {what}; its columns: {cols}.")
        return given
    if len(typed) == 1:
        return typed[0]
    pool = typed or usable
    named = [c for c in pool if c in names]
    if len(named) == 1:
        return named[0]
    if kind == "image" and not typed:
        raise DatasetError(f"hf: {where} has no image column (an Image feature); its columns: {cols}. Datasets of "
                           "tabular features are not supported by dataset hf: export them to an .npz (float x_train, "
                           "x_test [N, D]) and use dataset npz.")
    cands = named or pool
    if not cands:
        raise DatasetError(f"hf: {where} has no label column ({what}); its columns: {cols}.")
    raise DatasetError(f"hf: cannot tell which column of {where} holds the {kind}s ({', '.join(cands)} could); "
                       f"name it with {option}=<column>; its columns: {cols}.")


def _arrow_column(ds: Any, column: str, rows: np.ndarray | None = None) -> Any:
    """One column of ids or labels of ``ds`` as a pyarrow array (rows selected when given)."""
    import pyarrow as pa

    col = ds.with_format("arrow", columns=[column])[:].column(column)
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return col.take(pa.array(rows)) if rows is not None else col


def _codes(arr: Any) -> np.ndarray:
    """int64 index of every value among the sorted distinct values (-1 where missing)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(arr)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    order = np.asarray(pc.array_sort_indices(enc.dictionary), dtype=np.int64)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    idx = enc.indices.to_numpy(zero_copy_only=False)
    if enc.indices.null_count:
        valid = np.asarray(enc.indices.is_valid())
        out = np.full(len(idx), -1, dtype=np.int64)
        out[valid] = rank[idx[valid].astype(np.int64)]
        return out
    return rank[idx.astype(np.int64)]


def _labels(feature: Any, tr: Any, te: Any, column: str, where: str, num_classes: int | None
            ) -> tuple[torch.Tensor, torch.Tensor, int]:
    import datasets
    import pyarrow as pa

    if tr.null_count or te.null_count:
        raise DatasetError(f"hf: the label column {column!r} of {where} has missing values; every sample needs a label.")
    if _is_text(feature):
        classes = np.unique(np.asarray(tr.to_pylist(), dtype=object).astype(str))
        lookup = {c: i for i, c in enumerate(classes)}
        unknown = sorted({v for v in te.to_pylist() if v not in lookup})
        if unknown:
            raise DatasetError(f"hf: the test split of {where} has labels the training split lacks: "
                               f"{', '.join(map(repr, unknown[:5]))}{' ...' if len(unknown) > 5 else ''}.")
        y_tr = torch.as_tensor([lookup[v] for v in tr.to_pylist()], dtype=torch.int64)
        y_te = torch.as_tensor([lookup[v] for v in te.to_pylist()], dtype=torch.int64)
        return y_tr, y_te, len(classes)
    what = f"hf: the label column {column!r} of {where}"
    y_tr = _as_labels(np.array(tr.cast(pa.int64()).to_numpy(zero_copy_only=False)), what)
    y_te = _as_labels(np.array(te.cast(pa.int64()).to_numpy(zero_copy_only=False)), what)
    if isinstance(feature, datasets.ClassLabel):
        return y_tr, y_te, num_classes or feature.num_classes
    return y_tr, y_te, num_classes or _declared_classes(y_tr, where, "hf")


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
