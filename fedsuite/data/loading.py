"""The dataset registry and its entry point: :data:`DATASETS` (name -> loader) and
:func:`load_dataset`, cached per process, with the view options every dataset takes (augmentation,
normalisation). Every loader returns a :class:`~fedsuite.data.bundle.DatasetBundle`, checked here by
:func:`~fedsuite.data.bundle.check_bundle`. The loaders live in one module per family:
:mod:`fedsuite.data.mnist_cifar` (MNIST, Fashion-MNIST, CIFAR-10/100), :mod:`fedsuite.data.image_folders`
(Tiny-ImageNet, CINIC-10, imagefolder), :mod:`fedsuite.data.federated` (synthetic, FEMNIST),
:mod:`fedsuite.data.npz` and :mod:`fedsuite.data.hf` (Hugging Face datasets); they share
:mod:`fedsuite.data.files` (missing files, downloads, the decode cache). Only this module imports
them all, so no loader imports the registry.

Defaults per dataset (override with ``augment=``, ``normalize=`` or ``mean=``/``std=``):

=============  ==================  ==============================================================
dataset        augment             normalisation (mean / std)
=============  ==================  ==============================================================
synthetic      none                none (float vectors)
mnist          none                (0.1307,) / (0.3081,)
fmnist         none                (0.2860,) / (0.3530,)
cifar10        crop-flip           (0.491, 0.482, 0.447) / (0.247, 0.243, 0.262)   [FedInit's code]
cifar100       crop-flip           (0.5071, 0.4867, 0.4408) / (0.2675, 0.2565, 0.2761) [FedInit's code]
tinyimagenet   crop-flip (pad 8)   (0.4802, 0.4481, 0.3975) / (0.2302, 0.2265, 0.2262)
cinic10        crop-flip           (0.4789, 0.4723, 0.4305) / (0.2421, 0.2383, 0.2587)
femnist        none                (0.5,) / (0.5,) on inverted pixels = FedMR's (0.5 - x) / 0.5
npz            none                per-channel statistics of x_train (uint8 images)
imagefolder    none                per-channel statistics of x_train
hf             none                per-channel statistics of x_train (Hugging Face datasets, hf.py)
=============  ==================  ==============================================================

``crop-flip`` is the recommended resolution of FedInit, FedMRUR and FedNLR (random crop with
zero padding + horizontal flip). FedMR trains CIFAR without augmentation and normalises CIFAR-10
with 0.5/0.5: use ``augment="none", normalize="half"`` for FedMR runs (and, for its CIFAR-100
coarse setting, ``mean=(0.4914, 0.4822, 0.4465), std=(0.2023, 0.1994, 0.2010)``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, ValidationError, create_model

from .bundle import AUGMENT_KINDS, DatasetBundle, DatasetError, check_bundle
from .federated import load_femnist, load_synthetic
from .hf import load_hf
from .image_folders import load_cinic10, load_imagefolder, load_tinyimagenet
from .mnist_cifar import load_cifar10, load_cifar100, load_fmnist, load_mnist
from .npz import load_npz

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


#: the view options' types (:func:`_apply_view`): a per-channel value may be one number or a list
_VIEW_TYPES: dict[str, Any] = {"augment": str | None, "normalize": str | None,
                               "mean": float | list[float] | None, "std": float | list[float] | None}


def _option_type(annotation: Any) -> Any:
    """A loader parameter's type as a config value has it: a path is a string (``str | Path`` -> ``str``)."""
    if annotation is Path:
        return str
    args = typing.get_args(annotation)
    if args and typing.get_origin(annotation) in (typing.Union, type(str | None)):
        return typing.Union[tuple(_option_type(a) for a in args)]
    return annotation


@functools.cache
def _options_model(name: str) -> Any:
    """A strict pydantic model of dataset ``name``'s options: its loader's keyword parameters, with
    their annotated types (a path as a string), and the view options; no other key."""
    loader = DATASETS[name]
    hints = typing.get_type_hints(loader)
    fields = {p: (_option_type(hints.get(p, Any)), None) for p in inspect.signature(loader).parameters if p != "root"}
    fields.update({k: (t, None) for k, t in _VIEW_TYPES.items()})
    return create_model(f"{name}_options", __config__=ConfigDict(strict=True, extra="forbid"), **fields)


def _as_config_value(value: Any) -> Any:
    """A value as a config file holds it: a path as its string, a tuple as a list."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_as_config_value(v) for v in value]
    return value


def options_problem(name: str, options: dict[str, Any]) -> str | None:
    """Why ``options`` are not options of dataset ``name`` (one line naming the first bad one:
    ``dataset_options.path: Input should be a valid string (got 1)``), or None. Every option has
    its loader's annotated type, strictly: no number for a string (``path=1``), no boolean for a
    string (``path=true`` is not the hub id ``'True'``) or a number, no string for a number; an
    option the dataset does not take is named with those it takes. The one check of the options,
    for the run's config (``fedsuite.config``) and for :func:`load_dataset`."""
    if name not in DATASETS:
        return f"Unknown dataset {name!r}; available datasets: {', '.join(sorted(DATASETS))}."
    model = _options_model(name)
    unknown = [k for k in options if k not in model.model_fields]
    if unknown:
        return (f"Unknown option(s) {', '.join(map(str, unknown))} for dataset {name!r}; it accepts "
                f"{', '.join(model.model_fields)}.")
    try:
        model.model_validate({k: _as_config_value(v) for k, v in options.items()})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(part) for part in err["loc"][:1])
        return f"dataset_options.{loc}: {err['msg']} (got {err['input']!r}) for dataset {name!r}"
    return None


def load_dataset(name: str, root: str | Path = "data", **options: Any) -> DatasetBundle:
    """Load dataset ``name`` (see :data:`DATASETS`) from the data root ``root``; cached per process.

    Options common to every dataset: ``augment`` (one of :data:`AUGMENT_KINDS`), ``normalize``
    (``"default"`` dataset statistics, ``"half"`` = 0.5/0.5 per channel, ``"none"`` = /255 only),
    and explicit ``mean``/``std`` tuples (win over ``normalize``). Other options are passed to the
    dataset's loader (e.g. ``label_mode`` for cifar100, ``path`` for npz/imagefolder/hf, ``alpha``,
    ``beta``, ``num_devices``, ``seed`` for synthetic, ``download`` for downloadable datasets).
    """
    problem = options_problem(name, options)
    if problem is not None:
        raise DatasetError(problem)
    view = {k: options.pop(k) for k in _VIEW_OPTIONS if k in options}
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
