"""Datasets of image files: Tiny-ImageNet-200, CINIC-10 and ``imagefolder`` (your own images in
``train/<class>/`` and ``test/<class>/`` folders). The images are decoded once with PIL into one
uint8 tensor and cached as ``.pt`` under ``<root>/.fedsuite_cache`` (:func:`fedsuite.data.files._cached_decode`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .bundle import DatasetBundle, DatasetError, _as_labels, _channel_stats
from .files import _cached_decode, _missing_error, _try_download

__all__ = ["load_cinic10", "load_imagefolder", "load_tinyimagenet"]

_TINY_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
_TINY_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"
_CINIC_URL = "https://datashare.is.ed.ac.uk/bitstream/handle/10283/3192/CINIC-10.tar.gz"
_IMG_EXT = {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp"}


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
