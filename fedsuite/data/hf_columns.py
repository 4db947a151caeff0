"""Which splits and columns of a Hugging Face dataset become the bundle (dataset ``hf``): the
training and test splits (:func:`_pick_splits`), the image and label columns (:func:`_pick_column`),
the labels as class indices (:func:`_labels`), and the other columns of ids as per-sample codes
(:func:`_codes`, the bundle's ``columns``, for ``partition_by``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .bundle import DatasetError, _as_labels, _declared_classes

_IMAGE_NAMES = ("img", "image")
_LABEL_NAMES = ("label", "labels", "fine_label", "class", "target")
_TEST_NAMES = ("validation", "valid", "val")


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
