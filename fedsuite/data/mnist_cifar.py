"""MNIST and Fashion-MNIST (idx files), CIFAR-10 and CIFAR-100 (python pickle batches), read from
torchvision's layout under the data root; missing files are downloaded by torchvision (with its
checksums) unless ``download=False``."""

from __future__ import annotations

import gzip
import pickle
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .bundle import DatasetBundle, DatasetError, _as_labels
from .files import _missing_error, _try_download

__all__ = ["load_cifar10", "load_cifar100", "load_fmnist", "load_mnist", "read_idx"]


# --------------------------------------------------------------------------------------------
# MNIST / Fashion-MNIST (idx-ubyte, optionally gzipped, torchvision's raw layout)

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def read_idx(path: Path) -> np.ndarray:
    """Read an idx file (``.gz`` or plain), the format of MNIST-like datasets."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (PermissionError, IsADirectoryError, FileNotFoundError) as exc:  # the file is fine, or absent
        raise DatasetError(f"{path} cannot be read ({exc.strerror}); check the file and its permissions.") from None
    except (OSError, EOFError, zlib.error) as exc:  # truncated or damaged gzip
        raise DatasetError(f"{path} is corrupt ({type(exc).__name__}: {exc}); delete it and download it again.") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DatasetError(f"{path} is not an idx file (bad magic number); the file is corrupt.")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">i4", count=ndim, offset=4).tolist()
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    count = int(np.prod(dims)) if dims else 1
    offset = 4 + 4 * ndim
    if len(raw) - offset < count * dtype.itemsize:
        raise DatasetError(f"{path} is truncated ({len(raw)} bytes for shape {dims}).")
    return np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(dims).astype(
        dtype.newbyteorder("=")
    )


def _load_mnist_like(
    name: str, folder: str, tv_class: str, root: Path, download: bool, mean: float, std: float
) -> DatasetBundle:
    raw = root / folder / "raw"

    def find() -> tuple[list[Path], list[Path]]:
        found, missing = [], []
        for f in _MNIST_FILES:
            cands = [raw / f, raw / f"{f}.gz"]
            hit = next((c for c in cands if c.is_file()), None)
            (found if hit else missing).append(hit or raw / f"{f}.gz")
        return found, missing

    found, missing = find()
    if missing:
        reason = "download disabled (download=False)"
        if download:
            import torchvision.datasets as tvd

            cls = getattr(tvd, tv_class)
            reason = _try_download(
                lambda: (cls(str(root), train=True, download=True), cls(str(root), train=False, download=True))
            )
            found, missing = find()
        if missing:
            layout = (
                f"<root>/{folder}/raw/ holding {', '.join(f + '.gz' for f in _MNIST_FILES)} "
                f"(torchvision's layout; the extracted files without .gz are accepted too)."
            )
            raise _missing_error(name, missing, layout, reason)
    xtr, ytr, xte, yte = (read_idx(p) for p in found)
    if xtr.ndim != 3 or xte.ndim != 3 or xtr.shape[0] != ytr.shape[0] or xte.shape[0] != yte.shape[0]:
        raise DatasetError(
            f"Dataset '{name}': files under {raw} have inconsistent shapes (train images "
            f"{xtr.shape}, labels {ytr.shape}; test images {xte.shape}, labels {yte.shape})."
        )
    return DatasetBundle(
        name=name,
        x_train=torch.from_numpy(xtr.astype(np.uint8)).unsqueeze(1),
        y_train=_as_labels(ytr),
        x_test=torch.from_numpy(xte.astype(np.uint8)).unsqueeze(1),
        y_test=_as_labels(yte),
        num_classes=10,
        input_shape=(1, int(xtr.shape[1]), int(xtr.shape[2])),
        mean=(mean,),
        std=(std,),
        augment="none",
    )


def load_mnist(root: Path, *, download: bool = True) -> DatasetBundle:
    """MNIST from ``<root>/MNIST/raw`` (torchvision layout, .gz read directly, never extracted)."""
    return _load_mnist_like("mnist", "MNIST", "MNIST", root, download, 0.1307, 0.3081)


def load_fmnist(root: Path, *, download: bool = True) -> DatasetBundle:
    """Fashion-MNIST from ``<root>/FashionMNIST/raw`` (torchvision layout)."""
    return _load_mnist_like("fmnist", "FashionMNIST", "FashionMNIST", root, download, 0.2860, 0.3530)


# --------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 (python pickle batches)


def _unpickle(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        return pickle.load(fh, encoding="latin1")


def _load_cifar(
    name: str, folder: str, train_files: list[str], test_files: list[str], label_key: str,
    num_classes: int, tv_class: str, root: Path, download: bool,
    mean: tuple[float, ...], std: tuple[float, ...],
) -> DatasetBundle:
    base = root / folder

    def missing_files() -> list[Path]:
        return [base / f for f in train_files + test_files if not (base / f).is_file()]

    missing = missing_files()
    if missing:
        reason = "download disabled (download=False)"
        if download:
            import torchvision.datasets as tvd

            cls = getattr(tvd, tv_class)
            reason = _try_download(lambda: cls(str(root), train=True, download=True))
            missing = missing_files()
        if missing:
            layout = (
                f"<root>/{folder}/ holding {', '.join(train_files + test_files)} (the python "
                f"version of the archive as torchvision.datasets.{tv_class} downloads and extracts it)."
            )
            raise _missing_error(name, missing, layout, reason)

    def read(files: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for f in files:
            try:
                d = _unpickle(base / f)
                xs.append(np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
                ys.append(np.asarray(d[label_key], dtype=np.int64))
            except (KeyError, ValueError, pickle.UnpicklingError, EOFError) as exc:
                raise DatasetError(
                    f"Dataset '{name}': {base / f} is not a valid CIFAR python batch "
                    f"({type(exc).__name__}: {exc}); delete it and download again."
                ) from None
        return torch.from_numpy(np.concatenate(xs)), _as_labels(np.concatenate(ys))

    xtr, ytr = read(train_files)
    xte, yte = read(test_files)
    return DatasetBundle(
        name=name, x_train=xtr, y_train=ytr, x_test=xte, y_test=yte, num_classes=num_classes,
        input_shape=(3, 32, 32), mean=mean, std=std, augment="crop-flip",
    )


def load_cifar10(root: Path, *, download: bool = True) -> DatasetBundle:
    """CIFAR-10 from ``<root>/cifar-10-batches-py`` (torchvision downloads it with its md5)."""
    return _load_cifar(
        "cifar10", "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
        "labels", 10, "CIFAR10", root, download,
        (0.491, 0.482, 0.447), (0.247, 0.243, 0.262),
    )


def load_cifar100(root: Path, *, label_mode: str = "fine", download: bool = True) -> DatasetBundle:
    """CIFAR-100 from ``<root>/cifar-100-python``; ``label_mode="coarse"`` gives the 20 superclasses."""
    if label_mode not in ("fine", "coarse"):
        raise DatasetError(f"cifar100: label_mode must be 'fine' or 'coarse', got {label_mode!r}.")
    b = _load_cifar(
        "cifar100", "cifar-100-python", ["train"], ["test"], f"{label_mode}_labels",
        100 if label_mode == "fine" else 20, "CIFAR100", root, download,
        (0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761),
    )
    return b
