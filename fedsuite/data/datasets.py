"""Dataset loaders: every dataset becomes one :class:`DatasetBundle` of in-memory tensors.

Images are decoded once into ``uint8`` tensors ``[N, C, H, W]``; feature vectors are ``float32``
``[N, D]``. Normalisation (``mean``/``std``, applied after ``/255`` by :func:`fedsuite.data.to_float`)
and the default training augmentation are metadata on the bundle, so the training loop can
augment and normalise whole batches on the training device.

Loaders never extract or write inside a dataset folder they did not download themselves. When
files are missing they try the official download (torchvision, with its checksums) and, if that
fails (offline), raise :class:`DatasetError` naming the missing files and the expected layout.

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

import contextlib
import gzip
import hashlib
import json
import os
import pickle
import socket
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "AUGMENT_KINDS",
    "DATASETS",
    "DatasetBundle",
    "DatasetError",
    "load_dataset",
]

#: Augmentation kinds understood by :func:`fedsuite.data.augment_batch`.
AUGMENT_KINDS = ("none", "crop-flip", "crop-flip-p50", "crop", "flip")

_DECODE_CACHE_VERSION = 1
_DOWNLOAD_TIMEOUT_S = 30.0


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


# --------------------------------------------------------------------------------------------
# helpers


def _missing_error(
    name: str, missing: Sequence[Path], layout: str, reason: str | None = None
) -> DatasetError:
    shown = ", ".join(str(p) for p in list(missing)[:8])
    if len(missing) > 8:
        shown += f" and {len(missing) - 8} more"
    why = f" The automatic download failed ({reason})." if reason else ""
    return DatasetError(
        f"Dataset '{name}' could not be loaded: missing {shown}.{why} Expected layout: {layout} "
        "Download the files on a machine with internet access (or let fedsuite download them "
        "there) and copy them into place under the data root."
    )


@contextlib.contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(old)


def _try_download(fn: Callable[[], Any]) -> str | None:
    """Run a download; return None on success or a one-line reason on failure."""
    try:
        with _socket_timeout(_DOWNLOAD_TIMEOUT_S):
            fn()
    except Exception as exc:  # noqa: BLE001 - any failure becomes a DatasetError upstream
        msg = " ".join(str(exc).split())
        if len(msg) > 300:
            msg = msg[:300] + "..."
        return f"{type(exc).__name__}: {msg}"
    return None


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


def _decode_images(paths: Sequence[Path], mode: str, size: int | None) -> torch.Tensor:
    """Decode image files with PIL into one uint8 tensor [N,C,H,W] (done once, then cached)."""
    from PIL import Image

    if not paths:
        channels = 1 if mode == "L" else 3
        return torch.zeros((0, channels, size or 0, size or 0), dtype=torch.uint8)
    arrays = []
    first_shape = None
    for p in paths:
        try:
            with Image.open(p) as im:
                im = im.convert(mode)
                if size is not None and im.size != (size, size):
                    im = im.resize((size, size), Image.BILINEAR)
                arr = np.asarray(im, dtype=np.uint8)
        except (OSError, SyntaxError, ValueError) as exc:  # PIL: not an image, truncated, unreadable
            raise DatasetError(f"{p} is not a readable image ({type(exc).__name__}: {exc}); remove or "
                               "replace it") from None
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if first_shape is None:
            first_shape = arr.shape
        elif arr.shape != first_shape:
            raise DatasetError(
                f"Images have different sizes: {paths[0]} is {first_shape[1]}x{first_shape[0]} "
                f"but {p} is {arr.shape[1]}x{arr.shape[0]}. Pass the option size=<pixels> to "
                "resize every image to a square of that size when loading."
            )
        arrays.append(arr)
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def _listing_key(files: Sequence[Path], extra: Any) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([_DECODE_CACHE_VERSION, extra], sort_keys=True, default=str).encode())
    for f in files:
        st = f.stat()
        h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def _cached_decode(
    root: Path, tag: str, files: Sequence[Path], extra: Any, build: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """Decode once; keep a ``.pt`` copy under ``<root>/.fedsuite_cache`` (best effort)."""
    cache = root / ".fedsuite_cache" / f"{tag}-{_listing_key(files, extra)}.pt"
    if cache.is_file():
        try:
            return torch.load(cache, weights_only=True)
        except Exception:  # noqa: BLE001 - a broken cache is rebuilt
            pass
    data = build()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".tmp{os.getpid()}")
        torch.save(data, tmp)
        os.replace(tmp, cache)
    except OSError:
        pass  # read-only data root: just do not cache
    return data


# --------------------------------------------------------------------------------------------
# synthetic (FedProx)


def load_synthetic(
    root: Path | None = None,
    *,
    alpha: float = 0.5,
    beta: float = 0.5,
    num_devices: int = 100,
    seed: int = 0,
    iid: bool = False,
    train_fraction: float = 0.9,
) -> DatasetBundle:
    """FedProx's Synthetic(alpha, beta) (Li et al. 2020, ``generate_synthetic``).

    Device k has ``lognormal(4, 2) + 50`` samples; ``W_k ~ N(u_k, 1)``, ``b_k ~ N(u_k, 1)`` with
    ``u_k ~ N(0, alpha)``; ``x ~ N(v_k, Sigma)`` with ``v_k ~ N(B_k, 1)``, ``B_k ~ N(0, beta)`` and
    ``Sigma = diag(j^-1.2)``; ``y = argmax(softmax(W_k^T x + b_k))``. Each device's samples are
    split ``train_fraction`` / rest into train / test (FedProx: 90/10); the test set is the union.
    ``groups`` holds the device id of every training sample. ``iid=True`` gives Synthetic-IID.
    """
    del root  # generated, nothing on disk
    if num_devices < 1:
        raise DatasetError(f"synthetic: num_devices must be >= 1, got {num_devices}.")
    if alpha < 0 or beta < 0:
        raise DatasetError(f"synthetic: alpha and beta must be >= 0, got {alpha}, {beta}.")
    dim, n_cls = 60, 10
    rng = np.random.default_rng(seed)
    samples = (rng.lognormal(4, 2, num_devices).astype(np.int64) + 50).tolist()
    mean_w = rng.normal(0, alpha, num_devices)
    b_dev = rng.normal(0, beta, num_devices)
    cov_diag = np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2)
    w_glob = rng.normal(0, 1, (dim, n_cls))
    b_glob = rng.normal(0, 1, n_cls)
    xs_tr, ys_tr, gs_tr, xs_te, ys_te, gs_te = [], [], [], [], [], []
    for k in range(num_devices):
        if iid:
            mean_x = np.zeros(dim)
            w, b = w_glob, b_glob
        else:
            mean_x = rng.normal(b_dev[k], 1, dim)
            w = rng.normal(mean_w[k], 1, (dim, n_cls))
            b = rng.normal(mean_w[k], 1, n_cls)
        n = samples[k]
        x = mean_x + rng.standard_normal((n, dim)) * np.sqrt(cov_diag)
        # not ``x @ w``: a multi-threaded OpenBLAS product here can hang forever when another
        # thread of the process forks meanwhile (Flower runs this ServerApp thread while Ray
        # starts its daemons with fork + preexec_fn; OpenBLAS's at-fork handler then shuts its
        # thread pool down under the running ``exec_blas``). einsum's own loop uses no BLAS.
        y = np.argmax(np.einsum("nd,dc->nc", x, w) + b, axis=1)
        n_tr = int(train_fraction * n)
        xs_tr.append(x[:n_tr])
        ys_tr.append(y[:n_tr])
        gs_tr.append(np.full(n_tr, k, dtype=np.int64))
        xs_te.append(x[n_tr:])
        ys_te.append(y[n_tr:])
        gs_te.append(np.full(n - n_tr, k, dtype=np.int64))
    return DatasetBundle(
        name="synthetic",
        x_train=torch.from_numpy(np.concatenate(xs_tr).astype(np.float32)),
        y_train=_as_labels(np.concatenate(ys_tr)),
        x_test=torch.from_numpy(np.concatenate(xs_te).astype(np.float32)),
        y_test=_as_labels(np.concatenate(ys_te)),
        num_classes=n_cls,
        input_shape=(dim,),
        mean=None,
        std=None,
        augment="none",
        groups=np.concatenate(gs_tr),
        test_groups=np.concatenate(gs_te),
    )


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


# --------------------------------------------------------------------------------------------
# Tiny-ImageNet, CINIC-10, ImageFolder (decoded once, cached as .pt)

_TINY_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
_TINY_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"
_CINIC_URL = "https://datashare.is.ed.ac.uk/bitstream/handle/10283/3192/CINIC-10.tar.gz"
_IMG_EXT = {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp"}


def load_tinyimagenet(root: Path, *, download: bool = True) -> DatasetBundle:
    """Tiny-ImageNet-200 (official archive layout); the official val split is the test set."""
    base = root / "tiny-imagenet-200"
    needed = [base / "wnids.txt", base / "train", base / "val" / "val_annotations.txt", base / "val" / "images"]
    layout = (
        "<root>/tiny-imagenet-200/ with wnids.txt, train/<wnid>/images/*.JPEG, "
        "val/val_annotations.txt and val/images/*.JPEG (the official tiny-imagenet-200.zip, extracted)."
    )
    missing = [p for p in needed if not p.exists()]
    if missing:
        reason = "download disabled (download=False)"
        if download:
            from torchvision.datasets.utils import download_and_extract_archive

            reason = _try_download(
                lambda: download_and_extract_archive(_TINY_URL, str(root), md5=_TINY_MD5, remove_finished=True)
            )
            missing = [p for p in needed if not p.exists()]
        if missing:
            raise _missing_error("tinyimagenet", missing, layout, reason)
    wnids = [w.strip() for w in (base / "wnids.txt").read_text().split() if w.strip()]
    cls = {w: i for i, w in enumerate(wnids)}
    train_files, train_y = [], []
    for w in wnids:
        d = base / "train" / w / "images"
        fs = sorted(p for p in d.glob("*") if p.suffix.lower() in _IMG_EXT) if d.is_dir() else []
        if not fs:
            raise _missing_error("tinyimagenet", [d / "*.JPEG"], layout)
        train_files += fs
        train_y += [cls[w]] * len(fs)
    test_files, test_y = [], []
    for line in (base / "val" / "val_annotations.txt").read_text().splitlines():
        parts = line.split("\t") if "\t" in line else line.split()
        if len(parts) < 2:
            continue
        if parts[1] not in cls:
            raise DatasetError(
                f"tinyimagenet: val_annotations.txt names class {parts[1]!r} that is not in wnids.txt."
            )
        test_files.append(base / "val" / "images" / parts[0])
        test_y.append(cls[parts[1]])
    absent = [p for p in test_files if not p.is_file()]
    if absent:
        raise _missing_error("tinyimagenet", absent, layout)
    data = _cached_decode(
        root, "tinyimagenet", train_files + test_files, ["RGB"],
        lambda: {"x_train": _decode_images(train_files, "RGB", None),
                 "x_test": _decode_images(test_files, "RGB", None)},
    )
    x_tr = data["x_train"]
    return DatasetBundle(
        name="tinyimagenet", x_train=x_tr, y_train=_as_labels(train_y), x_test=data["x_test"],
        y_test=_as_labels(test_y), num_classes=len(wnids), input_shape=tuple(x_tr.shape[1:]),
        mean=(0.4802, 0.4481, 0.3975), std=(0.2302, 0.2265, 0.2262), augment="crop-flip",
    )


def _folder_split(d: Path, class_to_idx: dict[str, int] | None = None) -> tuple[list[Path], list[int], dict[str, int]]:
    """The image files of one split ``d/<class>/...`` and their labels. ``class_to_idx``: the
    training split's classes, which every other split must have exactly (None: ``d`` is the
    training split, whose sorted folder names are the classes). Every class folder must hold at
    least one image: a class without training images is one the model can never learn, one without
    test images is never measured, and one without either would be dropped without a word. Else
    :class:`DatasetError`, one line naming the folder."""
    classes = sorted(p.name for p in d.iterdir() if p.is_dir())
    if class_to_idx is None:
        class_to_idx = {c: i for i, c in enumerate(classes)}
    extra = [c for c in classes if c not in class_to_idx]
    if extra:
        raise DatasetError(f"Class folder {d / extra[0]} has no counterpart in the training split; the splits "
                           "must hold the same class folders.")
    lacking = [c for c in class_to_idx if c not in classes]
    if lacking:
        raise DatasetError(f"{d} lacks the class folder(s) {', '.join(lacking)} of the training split; the "
                           "splits must hold the same class folders, each with images.")
    files, ys = [], []
    for c in classes:
        fs = sorted(p for p in (d / c).rglob("*") if p.is_file() and p.suffix.lower() in _IMG_EXT)
        if not fs:
            raise DatasetError(f"Class folder {d / c} holds no image ({', '.join(sorted(_IMG_EXT))}); every class "
                               "needs images in every split (remove the folder to drop the class).")
        files += fs
        ys += [class_to_idx[c]] * len(fs)
    return files, ys, class_to_idx


def load_cinic10(root: Path, *, include_valid: bool = False, download: bool = True) -> DatasetBundle:
    """CINIC-10 (``train/valid/test/<class>/*.png``); train (+valid if asked) for training, test for test."""
    cands = [root / "cinic10", root / "CINIC-10", root / "cinic-10", root]
    base = next((c for c in cands if (c / "train").is_dir() and (c / "test").is_dir()), None)
    layout = (
        "<root>/cinic10/ (or <root>/CINIC-10/) with train/<class>/*.png, valid/<class>/*.png and "
        "test/<class>/*.png (CINIC-10.tar.gz, extracted)."
    )
    if base is None:
        reason = "download disabled (download=False)"
        if download:
            from torchvision.datasets.utils import download_and_extract_archive

            reason = _try_download(
                lambda: download_and_extract_archive(
                    _CINIC_URL, str(root), extract_root=str(root / "cinic10"), remove_finished=True
                )
            )
            base = next((c for c in cands if (c / "train").is_dir() and (c / "test").is_dir()), None)
        if base is None:
            raise _missing_error("cinic10", [root / "cinic10" / "train", root / "cinic10" / "test"], layout, reason)
    tr_f, tr_y, c2i = _folder_split(base / "train")
    if include_valid:
        if not (base / "valid").is_dir():
            raise _missing_error("cinic10", [base / "valid"], layout)
        v_f, v_y, _ = _folder_split(base / "valid", c2i)
        tr_f, tr_y = tr_f + v_f, tr_y + v_y
    te_f, te_y, _ = _folder_split(base / "test", c2i)
    if not tr_f or not te_f:
        raise _missing_error("cinic10", [base / "train" / "<class>" / "*.png"], layout)
    data = _cached_decode(
        root, "cinic10", tr_f + te_f, ["RGB", include_valid],
        lambda: {"x_train": _decode_images(tr_f, "RGB", None), "x_test": _decode_images(te_f, "RGB", None)},
    )
    x_tr = data["x_train"]
    return DatasetBundle(
        name="cinic10", x_train=x_tr, y_train=_as_labels(tr_y), x_test=data["x_test"], y_test=_as_labels(te_y),
        num_classes=len(c2i), input_shape=tuple(x_tr.shape[1:]),
        mean=(0.47889522, 0.47227842, 0.43047404), std=(0.24205776, 0.23828046, 0.25874835),
        augment="crop-flip",
    )


def load_imagefolder(
    root: Path, *, path: str | Path | None = None, mode: str = "RGB", size: int | None = None
) -> DatasetBundle:
    """Bring-your-own images: ``<path>/train/<class>/*`` and ``<path>/test/<class>/*``.

    Classes are the sorted folder names of ``train/``. Images are decoded once with PIL (``mode``
    "RGB" or "L"; ``size`` resizes to size x size) and cached under ``<root>/.fedsuite_cache``.
    Normalisation defaults to the per-channel statistics of the training images.
    """
    if path is None:
        raise DatasetError("Dataset 'imagefolder' needs the option path=<folder with train/ and test/>.")
    if mode not in ("RGB", "L"):
        raise DatasetError(f"imagefolder: mode must be 'RGB' or 'L', got {mode!r}.")
    base = Path(path).expanduser()
    if not base.is_absolute():
        base = root / base
    layout = "<path>/train/<class>/<image files> and <path>/test/<class>/<image files> (torchvision ImageFolder layout)."
    missing = [p for p in (base / "train", base / "test") if not p.is_dir()]
    if missing:
        raise _missing_error("imagefolder", missing, layout)
    tr_f, tr_y, c2i = _folder_split(base / "train")
    te_f, te_y, _ = _folder_split(base / "test", c2i)
    if not tr_f:
        raise _missing_error("imagefolder", [base / "train" / "<class>" / "<images>"], layout)
    data = _cached_decode(
        root, "imagefolder", tr_f + te_f, [mode, size],
        lambda: {"x_train": _decode_images(tr_f, mode, size), "x_test": _decode_images(te_f, mode, size)},
    )
    x_tr = data["x_train"]
    mean, std = _channel_stats(x_tr)
    return DatasetBundle(
        name="imagefolder", x_train=x_tr, y_train=_as_labels(tr_y), x_test=data["x_test"],
        y_test=_as_labels(te_y), num_classes=len(c2i), input_shape=tuple(x_tr.shape[1:]),
        mean=mean, std=std, augment="none",
    )


# --------------------------------------------------------------------------------------------
# FEMNIST (LEAF json)


def load_femnist(root: Path, *, invert: bool = True) -> DatasetBundle:
    """FEMNIST in LEAF's json layout; ``groups`` = writer (user) index, test = union of users' test splits.

    LEAF stores 784 floats in [0, 1] per image with a white (1.0) background. With ``invert=True``
    (default) pixels are stored as ``255 * (1 - x)``, so the default normalisation 0.5/0.5 equals
    FedMR's ``x' = (0.5 - x) / 0.5``.
    """
    base = root / "femnist" / "data"
    layout = (
        "<root>/femnist/data/train/*.json and <root>/femnist/data/test/*.json as written by LEAF's "
        "preprocessing (e.g. ./preprocess.sh -s niid --sf 0.05 -k 100 -t sample); each json has "
        "'users' and 'user_data' {user: {'x': [[784 floats]], 'y': [labels]}}."
    )
    tr_files = sorted((base / "train").glob("*.json"))
    te_files = sorted((base / "test").glob("*.json"))
    if not tr_files or not te_files:
        missing = [base / s / "*.json" for s, fs in (("train", tr_files), ("test", te_files)) if not fs]
        raise _missing_error(
            "femnist", missing, layout,
            "FEMNIST has no direct download; it is produced by LEAF's preprocessing scripts",
        )

    def read(files: list[Path]) -> dict[str, tuple[list, list]]:
        out: dict[str, tuple[list, list]] = {}
        for f in files:
            try:
                js = json.loads(f.read_text())
                for u in js["users"]:
                    ud = js["user_data"][u]
                    xs, ys = out.setdefault(u, ([], []))
                    xs.extend(ud["x"])
                    ys.extend(ud["y"])
            except (KeyError, ValueError, TypeError) as exc:
                raise DatasetError(f"femnist: {f} is not a LEAF json file ({type(exc).__name__}: {exc}).") from None
        return out

    tr, te = read(tr_files), read(te_files)
    users = sorted(tr)

    def to_u8(xs: list) -> torch.Tensor:
        a = np.asarray(xs, dtype=np.float32).reshape(-1, 1, 28, 28)
        if invert:
            a = 1.0 - a
        return torch.from_numpy(np.clip(np.rint(a * 255.0), 0, 255).astype(np.uint8))

    x_tr = to_u8([x for u in users for x in tr[u][0]])
    y_tr = _as_labels([y for u in users for y in tr[u][1]])
    groups = np.concatenate([np.full(len(tr[u][1]), i, dtype=np.int64) for i, u in enumerate(users)])
    te_users = sorted(te)
    x_te = to_u8([x for u in te_users for x in te[u][0]])
    y_te = _as_labels([y for u in te_users for y in te[u][1]])
    writer = {u: i for i, u in enumerate(users)}
    test_groups = np.array([writer.get(u, -1) for u in te_users for _ in te[u][1]], dtype=np.int64)
    return DatasetBundle(
        name="femnist", x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te, num_classes=62,
        input_shape=(1, 28, 28), mean=(0.5,), std=(0.5,), augment="none", groups=groups, test_groups=test_groups,
    )


# --------------------------------------------------------------------------------------------
# npz (bring your own arrays)


def _npz_images(x: np.ndarray, key: str, path: Path) -> torch.Tensor:
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4:
        raise DatasetError(f"npz: {key} in {path} has shape {x.shape}; uint8 images must be NHWC, NCHW or NHW.")
    if x.shape[1] not in (1, 3, 4) and x.shape[-1] in (1, 3, 4):
        x = np.transpose(x, (0, 3, 1, 2))
    return torch.from_numpy(np.ascontiguousarray(x))


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
