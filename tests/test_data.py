"""Dataset loaders (on small generated files in each real on-disk format) and batch augmentation."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedsuite.data import (
    DATASETS,
    DatasetBundle,
    DatasetError,
    augment_batch,
    load_dataset,
    read_idx,
    to_float,
)

#: ../shared/data beside the checkout (the project's real data files; CI has it too)
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


# ------------------------------------------------------------------------------------------
# generators of tiny files in the real formats


def write_idx(path: Path, arr: np.ndarray, gz: bool = True) -> None:
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    header = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(">" + "i" * arr.ndim, *arr.shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if gz else open
    with opener(path, "wb") as fh:
        fh.write(header + arr.tobytes())


def make_mnist(root: Path, folder: str, n_train: int = 50, n_test: int = 20, gz: bool = True) -> dict:
    rng = np.random.default_rng(0)
    data = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test).astype(np.uint8),
    }
    for name, arr in data.items():
        write_idx(root / folder / "raw" / (name + (".gz" if gz else "")), arr, gz=gz)
    return data


def make_cifar10(root: Path, per_batch: int = 6) -> dict:
    rng = np.random.default_rng(1)
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    out = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        d = {"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
             "labels": rng.integers(0, 10, per_batch).tolist(), "batch_label": name}
        with open(base / name, "wb") as fh:
            pickle.dump(d, fh)
        out[name] = d
    return out


def make_cifar100(root: Path) -> dict:
    rng = np.random.default_rng(2)
    base = root / "cifar-100-python"
    base.mkdir(parents=True)
    out = {}
    for name, n in (("train", 30), ("test", 10)):
        fine = rng.integers(0, 100, n)
        d = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "fine_labels": fine.tolist(),
             "coarse_labels": (fine // 5).tolist()}
        with open(base / name, "wb") as fh:
            pickle.dump(d, fh)
        out[name] = d
    return out


def save_img(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


# ------------------------------------------------------------------------------------------
# synthetic


def test_synthetic_deterministic_and_shaped():
    a = DATASETS["synthetic"](None, seed=3)
    b = DATASETS["synthetic"](None, seed=3)
    c = DATASETS["synthetic"](None, seed=4)
    assert a.x_train.dtype == torch.float32 and a.x_train.shape[1] == 60 and a.input_shape == (60,)
    assert a.y_train.dtype == torch.int64 and a.num_classes == 10
    assert a.x_train.shape[0] == a.y_train.shape[0] == len(a.groups)
    assert a.x_test.shape[1] == 60 and a.x_test.shape[0] == a.y_test.shape[0] > 0
    assert len(np.unique(a.groups)) == 100 and a.mean is None and a.augment == "none"
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_train, b.y_train)
    assert np.array_equal(a.groups, b.groups)
    assert a.x_train.shape != c.x_train.shape or not torch.equal(a.x_train, c.x_train)
    # every device has >= 50 samples in FedProx, 90 % of which are training samples
    assert np.bincount(a.groups).min() >= 45
    small = DATASETS["synthetic"](None, num_devices=5, alpha=1.0, beta=1.0)
    assert len(np.unique(small.groups)) == 5


def test_synthetic_is_learnable():
    b = load_dataset("synthetic", "unused-root", seed=0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(60, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    for _ in range(60):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(b.x_train), b.y_train).backward()
        opt.step()
    acc = (model(b.x_test).argmax(1) == b.y_test).float().mean().item()
    assert acc > 0.6  # chance is ~0.1-0.2


def test_load_dataset_cache_and_view_options():
    a = load_dataset("synthetic", "r", seed=11)
    b = load_dataset("synthetic", "r", seed=11)
    assert a is b
    with pytest.raises(DatasetError, match="Unknown option"):
        load_dataset("synthetic", "r", colour="red")
    with pytest.raises(DatasetError, match="Unknown dataset"):
        load_dataset("imagenet-1k", "r")
    with pytest.raises(DatasetError, match="feature vectors"):
        load_dataset("synthetic", "r", augment="crop-flip")


# ------------------------------------------------------------------------------------------
# MNIST / Fashion-MNIST


@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fmnist", "FashionMNIST")])
def test_mnist_like_from_generated_gz(tmp_path, name, folder):
    data = make_mnist(tmp_path, folder)
    b = load_dataset(name, tmp_path)
    assert b.x_train.dtype == torch.uint8 and tuple(b.x_train.shape) == (50, 1, 28, 28)
    assert tuple(b.x_test.shape) == (20, 1, 28, 28) and b.input_shape == (1, 28, 28)
    assert np.array_equal(b.x_train[:, 0].numpy(), data["train-images-idx3-ubyte"])
    assert np.array_equal(b.y_test.numpy(), data["t10k-labels-idx1-ubyte"])
    assert b.y_train.dtype == torch.int64 and b.num_classes == 10 and b.augment == "none"
    assert len(b.mean) == 1 and len(b.std) == 1
    # nothing was extracted next to the .gz files
    assert sorted(p.name for p in (tmp_path / folder / "raw").iterdir()) == sorted(f + ".gz" for f in data)


def test_mnist_reads_extracted_files_too(tmp_path):
    data = make_mnist(tmp_path, "MNIST", gz=False)
    b = load_dataset("mnist", tmp_path)
    assert np.array_equal(b.y_train.numpy(), data["train-labels-idx1-ubyte"])


def test_read_idx_rejects_bad_magic(tmp_path):
    p = tmp_path / "bad.gz"
    with gzip.open(p, "wb") as fh:
        fh.write(b"\x01\x02\x03\x04garbage")
    with pytest.raises(DatasetError, match="magic"):
        read_idx(p)


def test_missing_mnist_offline_names_files(tmp_path, monkeypatch):
    """download=True but the network is down: a DatasetError naming the files, no urllib traceback."""

    def offline(*args, **kwargs):
        raise urllib.error.URLError("offline (simulated by the test)")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setattr(urllib.request.OpenerDirector, "open", offline)
    with pytest.raises(DatasetError) as ei:
        load_dataset("fmnist", tmp_path / "empty")
    msg = str(ei.value)
    assert "train-images-idx3-ubyte" in msg and "t10k-labels-idx1-ubyte" in msg
    assert "FashionMNIST/raw" in msg and "download failed" in msg
    assert "\n" not in msg


def test_partially_missing_mnist_without_download(tmp_path):
    make_mnist(tmp_path, "MNIST")
    os.remove(tmp_path / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(DatasetError, match="t10k-images-idx3-ubyte") as ei:
        load_dataset("mnist", tmp_path, download=False)
    assert "train-images" not in str(ei.value).split("Expected layout")[0]


@pytest.mark.skipif(not (SHARED_DATA / "FashionMNIST" / "raw").is_dir(), reason="../shared/data/FashionMNIST is absent")
def test_real_fmnist_from_shared(tmp_path):
    shared = SHARED_DATA / "FashionMNIST"
    before = sorted(str(p) for p in shared.rglob("*"))
    (tmp_path / "FashionMNIST").symlink_to(shared, target_is_directory=True)
    b = load_dataset("fmnist", tmp_path, download=False)
    assert tuple(b.x_train.shape) == (60000, 1, 28, 28) and tuple(b.x_test.shape) == (10000, 1, 28, 28)
    assert b.y_train.shape[0] == 60000 and b.y_test.shape[0] == 10000
    assert np.array_equal(np.bincount(b.y_train.numpy()), np.full(10, 6000))
    mean = b.x_train[:5000].float().div(255).mean().item()
    assert abs(mean - b.mean[0]) < 0.02
    assert sorted(str(p) for p in shared.rglob("*")) == before  # nothing written into shared data


# ------------------------------------------------------------------------------------------
# CIFAR


@pytest.mark.skipif(not (SHARED_DATA / "cifar10-jpeg" / "make_cifar10.py").is_file(),
                    reason="../shared/data/cifar10-jpeg (the JPEG copy of CIFAR-10) is absent")
def test_real_cifar10_jpeg_copy_from_shared(tmp_path):
    """The claims' CIFAR-10 (issue 39): the JPEG copy's own script writes torchvision's layout, which
    the cifar10 loader reads as it is; real batches go through FedMR's CNN."""
    from fedsuite.models import build_model

    out = subprocess.run([sys.executable, str(SHARED_DATA / "cifar10-jpeg" / "make_cifar10.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    b = load_dataset("cifar10", tmp_path, download=False, augment="none", normalize="half")
    assert tuple(b.x_train.shape) == (50000, 3, 32, 32) and tuple(b.x_test.shape) == (10000, 3, 32, 32)
    assert b.x_train.dtype == torch.uint8 and b.num_classes == 10
    assert np.array_equal(np.bincount(b.y_train.numpy()), np.full(10, 5000))
    assert np.array_equal(np.bincount(b.y_test.numpy()), np.full(10, 1000))
    assert abs(b.x_train[:5000].float().div(255).mean().item() - 0.47) < 0.03  # CIFAR-10's mean brightness
    model = build_model("cnn", 10, b.input_shape)
    x = to_float(b.x_train[:64], b)
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, b.y_train[:64])
    assert logits.shape == (64, 10) and torch.isfinite(loss) and 1.5 < loss.item() < 3.5


def test_cifar10_from_generated_pickles(tmp_path):
    data = make_cifar10(tmp_path)
    b = load_dataset("cifar10", tmp_path)
    assert tuple(b.x_train.shape) == (30, 3, 32, 32) and b.x_train.dtype == torch.uint8
    assert tuple(b.x_test.shape) == (6, 3, 32, 32)
    assert np.array_equal(b.x_train[:6].reshape(6, -1).numpy(), data["data_batch_1"]["data"])
    assert b.y_test.tolist() == data["test_batch"]["labels"]
    assert b.num_classes == 10 and b.augment == "crop-flip" and len(b.mean) == 3
    fedmr = load_dataset("cifar10", tmp_path, augment="none", normalize="half")
    assert fedmr.augment == "none" and fedmr.mean == (0.5, 0.5, 0.5) and fedmr.std == (0.5, 0.5, 0.5)
    assert fedmr.x_train is b.x_train  # a view option shares the decoded tensors


def test_cifar100_fine_and_coarse(tmp_path):
    data = make_cifar100(tmp_path)
    fine = load_dataset("cifar100", tmp_path)
    coarse = load_dataset("cifar100", tmp_path, label_mode="coarse")
    assert fine.num_classes == 100 and coarse.num_classes == 20
    assert fine.y_train.tolist() == data["train"]["fine_labels"]
    assert coarse.y_train.tolist() == data["train"]["coarse_labels"]
    assert torch.equal(fine.x_train, coarse.x_train)
    with pytest.raises(DatasetError, match="label_mode"):
        load_dataset("cifar100", tmp_path, label_mode="medium")


def test_cifar10_missing_names_files(tmp_path):
    with pytest.raises(DatasetError) as ei:
        load_dataset("cifar10", tmp_path, download=False)
    msg = str(ei.value)
    assert "data_batch_1" in msg and "test_batch" in msg and "cifar-10-batches-py" in msg


# ------------------------------------------------------------------------------------------
# FEMNIST, npz, imagefolder, Tiny-ImageNet, CINIC-10


def test_femnist_leaf_json(tmp_path):
    rng = np.random.default_rng(5)
    base = tmp_path / "femnist" / "data"
    users = {"f0001_01": 7, "f0002_02": 4, "f0003_03": 5}
    for split, scale in (("train", 1), ("test", 2)):
        (base / split).mkdir(parents=True)
        ud = {}
        for u, n in users.items():
            k = max(1, n // scale)
            ud[u] = {"x": rng.random((k, 784)).round(3).tolist(), "y": rng.integers(0, 62, k).tolist()}
        (base / split / f"all_data_0_niid_05_keep_100_{split}_9.json").write_text(
            json.dumps({"users": list(users), "num_samples": [len(ud[u]["y"]) for u in users], "user_data": ud})
        )
    b = load_dataset("femnist", tmp_path)
    assert tuple(b.x_train.shape) == (16, 1, 28, 28) and b.x_train.dtype == torch.uint8
    assert b.num_classes == 62 and b.mean == (0.5,) and b.std == (0.5,)
    assert np.bincount(b.groups).tolist() == [7, 4, 5]
    # FedMR's x' = (0.5 - x) / 0.5 on LEAF's floats
    js = json.loads((base / "train" / "all_data_0_niid_05_keep_100_train_9.json").read_text())
    x0 = torch.tensor(js["user_data"]["f0001_01"]["x"][0]).view(1, 28, 28)
    assert torch.allclose(to_float(b.x_train[:1], b)[0], (0.5 - x0) / 0.5, atol=1.0 / 255 * 2 + 1e-6)
    with pytest.raises(DatasetError, match="LEAF"):
        load_dataset("femnist", tmp_path / "nothing")


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_npz_images(tmp_path, layout):
    rng = np.random.default_rng(6)
    xtr = rng.integers(0, 256, (12, 8, 8, 3), dtype=np.uint8)
    xte = rng.integers(0, 256, (4, 8, 8, 3), dtype=np.uint8)
    if layout == "NCHW":
        xtr, xte = xtr.transpose(0, 3, 1, 2), xte.transpose(0, 3, 1, 2)
    np.savez(tmp_path / "d.npz", x_train=xtr, y_train=np.arange(12) % 3, x_test=xte, y_test=np.arange(4) % 3)
    b = load_dataset("npz", tmp_path, path=str(tmp_path / "d.npz"))
    assert b.input_shape == (3, 8, 8) and b.num_classes == 3 and b.x_train.dtype == torch.uint8
    ref = xtr if layout == "NCHW" else xtr.transpose(0, 3, 1, 2)
    assert np.array_equal(b.x_train.numpy(), ref)
    assert len(b.mean) == 3 and all(0.3 < m < 0.7 for m in b.mean)


def test_npz_vectors_and_errors(tmp_path):
    np.savez(tmp_path / "v.npz", x_train=np.ones((5, 4), np.float64), y_train=[0, 1, 0, 1, 1],
             x_test=np.zeros((2, 4)), y_test=[0, 1])
    b = load_dataset("npz", tmp_path, path="v.npz")
    assert b.x_train.dtype == torch.float32 and b.input_shape == (4,) and b.mean is None
    np.savez(tmp_path / "bad.npz", x_train=np.ones((5, 4)))
    with pytest.raises(DatasetError, match="y_train"):
        load_dataset("npz", tmp_path, path="bad.npz")
    with pytest.raises(DatasetError, match="missing"):
        load_dataset("npz", tmp_path, path="nope.npz")
    with pytest.raises(DatasetError, match="path="):
        load_dataset("npz", tmp_path)


def test_imagefolder(tmp_path):
    rng = np.random.default_rng(7)
    for split, n in (("train", 3), ("test", 1)):
        for cls in ("cat", "dog"):
            for i in range(n):
                save_img(tmp_path / "imgs" / split / cls / f"{i}.png", rng.integers(0, 256, (10, 10, 3), dtype=np.uint8))
    b = load_dataset("imagefolder", tmp_path, path=str(tmp_path / "imgs"))
    assert tuple(b.x_train.shape) == (6, 3, 10, 10) and tuple(b.x_test.shape) == (2, 3, 10, 10)
    assert b.y_train.tolist() == [0, 0, 0, 1, 1, 1] and b.num_classes == 2
    ref = np.asarray(Image.open(tmp_path / "imgs" / "train" / "dog" / "0.png")).transpose(2, 0, 1)
    assert np.array_equal(b.x_train[3].numpy(), ref)
    assert list((tmp_path / ".fedsuite_cache").glob("imagefolder-*.pt"))  # decoded once, cached
    grey = load_dataset("imagefolder", tmp_path, path=str(tmp_path / "imgs"), mode="L", size=6)
    assert tuple(grey.x_train.shape) == (6, 1, 6, 6)


def test_tinyimagenet_layout(tmp_path):
    rng = np.random.default_rng(8)
    base = tmp_path / "tiny-imagenet-200"
    wnids = ["n01443537", "n01629819", "n01641577"]
    base.mkdir()
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for w in wnids:
        for i in range(2):
            save_img(base / "train" / w / "images" / f"{w}_{i}.JPEG", rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    lines = []
    for i, w in enumerate(["n01629819", "n01443537", "n01641577", "n01629819"]):
        save_img(base / "val" / "images" / f"val_{i}.JPEG", rng.integers(0, 256, (64, 64), dtype=np.uint8))  # grey
        lines.append(f"val_{i}.JPEG\t{w}\t0\t0\t63\t63")
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    b = load_dataset("tinyimagenet", tmp_path)
    assert tuple(b.x_train.shape) == (6, 3, 64, 64) and tuple(b.x_test.shape) == (4, 3, 64, 64)
    assert b.y_train.tolist() == [0, 0, 1, 1, 2, 2] and b.y_test.tolist() == [1, 0, 2, 1]
    assert b.num_classes == 3 and b.augment == "crop-flip"
    assert list((tmp_path / ".fedsuite_cache").glob("tinyimagenet-*.pt"))
    with pytest.raises(DatasetError, match="wnids.txt"):
        load_dataset("tinyimagenet", tmp_path / "none", download=False)


def test_cinic10_layout(tmp_path):
    rng = np.random.default_rng(9)
    classes = ["airplane", "automobile", "bird"]
    for split, n in (("train", 2), ("valid", 1), ("test", 1)):
        for c in classes:
            for i in range(n):
                save_img(tmp_path / "cinic10" / split / c / f"{split}-{i}.png", rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    b = load_dataset("cinic10", tmp_path)
    assert tuple(b.x_train.shape) == (6, 3, 32, 32) and tuple(b.x_test.shape) == (3, 3, 32, 32)
    assert b.y_test.tolist() == [0, 1, 2] and b.num_classes == 3 and b.augment == "crop-flip"
    bv = load_dataset("cinic10", tmp_path, include_valid=True)
    assert bv.x_train.shape[0] == 9
    with pytest.raises(DatasetError, match="cinic10"):
        load_dataset("cinic10", tmp_path / "none", download=False)


# ------------------------------------------------------------------------------------------
# augmentation and normalisation


def _images(b=16, c=3, h=32, w=32, seed=0):
    return torch.randint(0, 256, (b, c, h, w), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


@pytest.mark.parametrize("kind", ["crop-flip", "crop-flip-p50", "crop", "flip"])
def test_augment_shape_dtype_determinism(kind):
    x = _images()
    a = augment_batch(x, kind, torch.Generator().manual_seed(1))
    b = augment_batch(x, kind, torch.Generator().manual_seed(1))
    c = augment_batch(x, kind, torch.Generator().manual_seed(2))
    assert a.shape == x.shape and a.dtype == x.dtype and a.device == x.device
    assert torch.equal(a, b)
    assert not torch.equal(a, x) and not torch.equal(a, c)
    xf = to_float(x, DatasetBundle("t", x, torch.zeros(16), x, torch.zeros(16), 10, (3, 32, 32), (0.5,) * 3, (0.5,) * 3, "none"))
    af = augment_batch(xf, kind, torch.Generator().manual_seed(1))
    assert af.dtype == torch.float32 and af.shape == xf.shape


def test_flip_is_exact_mirror_or_identity():
    x = _images(b=64)
    y = augment_batch(x, "flip", torch.Generator().manual_seed(0))
    flipped = torch.tensor([torch.equal(y[i], x[i].flip(-1)) for i in range(64)])
    same = torch.tensor([torch.equal(y[i], x[i]) for i in range(64)])
    assert bool((flipped | same).all()) and 10 < int(flipped.sum()) < 54


def test_crop_matches_padded_window():
    x = _images(b=32, h=32, w=32)
    y = augment_batch(x, "crop", torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    moved = 0
    for i in range(32):
        hits = [(dy, dx) for dy in range(9) for dx in range(9) if torch.equal(y[i], padded[i, :, dy:dy + 32, dx:dx + 32])]
        assert hits, f"sample {i} is not a 32x32 window of the 4-padded image"
        moved += hits[0] != (4, 4)
    assert moved > 20
    y64 = augment_batch(_images(b=4, h=64, w=64), "crop", torch.Generator().manual_seed(0))
    assert y64.shape == (4, 3, 64, 64)  # padding 8 for 64x64 (Tiny-ImageNet)
    with pytest.raises(ValueError, match="Unknown augmentation"):
        augment_batch(x, "mixup", torch.Generator())
    assert augment_batch(x, "none", torch.Generator()) is x


def test_to_float_normalises_uint8_and_keeps_vectors():
    x = torch.tensor([[[[0, 255]]], [[[51, 102]]]], dtype=torch.uint8)  # [2,1,1,2]
    b = DatasetBundle("t", x, torch.zeros(2), x, torch.zeros(2), 2, (1, 1, 2), (0.5,), (0.25,), "none")
    y = to_float(x, b)
    assert y.dtype == torch.float32
    assert torch.allclose(y.flatten(), torch.tensor([-2.0, 2.0, (0.2 - 0.5) / 0.25, (0.4 - 0.5) / 0.25]))
    v = torch.randn(3, 5)
    assert to_float(v, b) is v
