"""The dataset registry and its entry point: :data:`DATASETS` (name -> loader) and
:func:`load_dataset`, cached per process, with the view options every dataset takes (augmentation,
normalisation). The loaders live in :mod:`fedsuite.data.datasets` (torchvision's datasets, your own
files) and :mod:`fedsuite.data.hf` (Hugging Face datasets), which builds on the former's helpers;
this module imports both, so neither imports the other's registry."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .datasets import (AUGMENT_KINDS, DatasetBundle, DatasetError, check_bundle, load_cifar10, load_cifar100,
                       load_cinic10, load_femnist, load_fmnist, load_imagefolder, load_mnist, load_npz,
                       load_synthetic, load_tinyimagenet)
from .hf import load_hf

#: name -> loader(root: Path, **options) -> DatasetBundle
DATASETS: dict[str, Callable[..., DatasetBundle]] = {
    "synthetic": load_synthetic,
    "mnist": load_mnist,
    "fmnist": load_fmnist,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "tinyimagenet": load_tinyimagenet,
    "cinic10": load_cinic10,
    "femnist": load_femnist,
    "npz": load_npz,
    "imagefolder": load_imagefolder,
    "hf": load_hf,
}

_VIEW_OPTIONS = ("augment", "normalize", "mean", "std")


def _hashable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(i) for i in v)
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(i)) for k, i in v.items()))
    return v


@functools.lru_cache(maxsize=16)
def _load_cached(name: str, root: str, options: tuple[tuple[str, Any], ...]) -> DatasetBundle:
    source = dict(options).get("path") or root
    return check_bundle(DATASETS[name](Path(root), **dict(options)), str(source))


def load_dataset(name: str, root: str | Path = "data", **options: Any) -> DatasetBundle:
    """Load dataset ``name`` (see :data:`DATASETS`) from the data root ``root``; cached per process.

    Options common to every dataset: ``augment`` (one of :data:`AUGMENT_KINDS`), ``normalize``
    (``"default"`` dataset statistics, ``"half"`` = 0.5/0.5 per channel, ``"none"`` = /255 only),
    and explicit ``mean``/``std`` tuples (win over ``normalize``). Other options are passed to the
    dataset's loader (e.g. ``label_mode`` for cifar100, ``path`` for npz/imagefolder/hf, ``alpha``,
    ``beta``, ``num_devices``, ``seed`` for synthetic, ``download`` for downloadable datasets).
    """
    if name not in DATASETS:
        raise DatasetError(f"Unknown dataset {name!r}; available datasets: {', '.join(sorted(DATASETS))}.")
    view = {k: options.pop(k) for k in _VIEW_OPTIONS if k in options}
    params = inspect.signature(DATASETS[name]).parameters
    accepted = [p for p in params if p != "root"]
    unknown = [k for k in options if k not in accepted]
    if unknown:
        raise DatasetError(
            f"Unknown option(s) {', '.join(unknown)} for dataset {name!r}; it accepts "
            f"{', '.join(accepted + list(_VIEW_OPTIONS))}."
        )
    root_s = str(Path(root).expanduser().resolve())
    bundle = _load_cached(name, root_s, tuple(sorted((k, _hashable(v)) for k, v in options.items())))
    return _apply_view(bundle, **view)


def _apply_view(
    b: DatasetBundle, augment: str | None = None, normalize: str | None = None,
    mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
) -> DatasetBundle:
    changes: dict[str, Any] = {}
    if augment is not None:
        if augment not in AUGMENT_KINDS:
            raise DatasetError(f"Unknown augment {augment!r}; choose one of {', '.join(AUGMENT_KINDS)}.")
        if augment != "none" and not b.is_image:
            raise DatasetError(f"augment={augment!r} needs image data, but {b.name!r} holds feature vectors.")
        changes["augment"] = augment
    if b.is_image:
        c = b.input_shape[0]
        if normalize is not None:
            if normalize == "half":
                changes.update(mean=(0.5,) * c, std=(0.5,) * c)
            elif normalize == "none":
                changes.update(mean=(0.0,) * c, std=(1.0,) * c)
            elif normalize != "default":
                raise DatasetError(f"Unknown normalize {normalize!r}; choose 'default', 'half' or 'none'.")
        for key, val in (("mean", mean), ("std", std)):
            if val is not None:
                val = tuple(float(v) for v in (val if isinstance(val, (list, tuple)) else [val]))
                if len(val) == 1:
                    val = val * c
                if len(val) != c:
                    raise DatasetError(f"{key} needs {c} values (one per channel) for {b.name!r}, got {len(val)}.")
                if key == "std" and any(v == 0 for v in val):
                    raise DatasetError("std values must be non-zero.")
                changes[key] = val
    elif normalize not in (None, "default", "none") or mean is not None or std is not None:
        raise DatasetError(f"Dataset {b.name!r} holds feature vectors; normalize/mean/std apply to images only.")
    return dataclasses.replace(b, **changes) if changes else b
