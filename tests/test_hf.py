"""Dataset ``hf`` (fedsuite/data/hf.py): Hugging Face datasets, offline, on small datasets made here.

Every dataset is written with the ``datasets`` library itself, in the formats a user has: parquet
files (as the hub stores them), ``save_to_disk`` folders, folders of images (its ``imagefolder``
builder) and the datasets cache that ``datasets.load_dataset("owner/name")`` leaves behind. The
made-up datasets have the columns and feature types of the hub datasets of docs/datasets.md:
``flwrlabs/femnist`` (image: greyscale 28x28, character: ClassLabel 62, writer_id: text, hsf_id:
int; one split, train), ``uoft-cs/cifar100`` (img, fine_label: ClassLabel 100, coarse_label:
ClassLabel 20; train and test) and ``zh-plus/tiny-imagenet`` (image: 64x64, a few greyscale,
label: ClassLabel 200; train and valid). No test reaches the network: the hub is either switched
off or a local socket that never answers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedsuite.config import ConfigError, build_config
from fedsuite.data import DATASETS, PARTITIONERS, DatasetError, load_dataset, partition_indices
from fedsuite.data.hf_source import HUB_PROBE_TIMEOUT_S
from tests.conftest import fedsuite_run

datasets = pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "datasets.md"


# ------------------------------------------------------------------------------------------
# small datasets with the hub datasets' columns


def femnist_like(writers=("f0412_07", "f0031_22", "f2103_11", "f0999_40"), per_writer=20, seed=0):
    """flwrlabs/femnist's columns; rows of the writers interleaved (not sorted by writer)."""
    rng = np.random.default_rng(seed)
    n = len(writers) * per_writer
    feats = datasets.Features({
        "image": datasets.Image(), "writer_id": datasets.Value("string"), "hsf_id": datasets.Value("int64"),
        "character": datasets.ClassLabel(num_classes=62),
    })
    return datasets.Dataset.from_dict({
        "image": [Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8), mode="L") for _ in range(n)],
        "writer_id": [writers[i % len(writers)] for i in range(n)],
        "hsf_id": [int(i % 3) for i in range(n)],
        "character": rng.integers(0, 62, n).tolist(),
    }, features=feats)


def cifar100_like(n_train=80, n_test=20, seed=1):
    rng = np.random.default_rng(seed)
    feats = datasets.Features({"img": datasets.Image(), "fine_label": datasets.ClassLabel(num_classes=100),
                               "coarse_label": datasets.ClassLabel(num_classes=20)})
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        fine = rng.integers(0, 100, n)
        out[split] = datasets.Dataset.from_dict({
            "img": [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(n)],
            "fine_label": fine.tolist(), "coarse_label": (fine // 5).tolist()}, features=feats)
    return datasets.DatasetDict(out)


def tinyimagenet_like(n_train=40, n_valid=10, seed=2):
    """zh-plus/tiny-imagenet's columns and splits (train, valid); every 7th image greyscale, as
    some of Tiny-ImageNet's JPEGs are."""
    rng = np.random.default_rng(seed)
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=200)})
    out = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        imgs = [Image.fromarray(rng.integers(0, 256, (64, 64), dtype=np.uint8), mode="L") if i % 7 == 3
                else Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)) for i in range(n)]
        out[split] = datasets.Dataset.from_dict({"image": imgs, "label": rng.integers(0, 200, n).tolist()},
                                                features=feats)
    return datasets.DatasetDict(out)


def write_parquet(dd, folder: Path) -> Path:
    """The hub's layout: data/<split>-00000-of-00001.parquet."""
    for split, ds in dd.items():
        ds.to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))
    return folder


def pixels(img: Image.Image) -> np.ndarray:
    a = np.asarray(img)
    return (a[:, :, None] if a.ndim == 2 else a).transpose(2, 0, 1)


def one_line(msg: str) -> str:
    assert "\n" not in msg, msg
    return msg


@pytest.fixture
def hf_cache(tmp_path):
    """A datasets cache of this test's own (the arrow files datasets writes for parquet folders)."""
    return str(tmp_path / "hf-cache")


class SilentHub:
    """A hub endpoint that accepts connections and never answers (a firewall that drops packets
    looks the same to a client): every network wait must be bounded by the loader itself."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)  # the kernel completes the handshakes; nothing ever reads or replies
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def contacted(self) -> bool:
        """Whether anyone connected (a connection waits in the listen queue until accepted)."""
        self.sock.setblocking(False)
        try:
            self.sock.accept()[0].close()
            return True
        except BlockingIOError:
            return False


@pytest.fixture
def silent_hub(monkeypatch):
    """The hub's endpoint (``HF_ENDPOINT``, read by ``datasets`` when imported) is a SilentHub, and
    offline mode is off, whatever this machine's environment says."""
    import datasets.config
    import huggingface_hub.constants as hub_constants

    hub = SilentHub()
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", hub.url)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    yield hub
    hub.sock.close()


# ------------------------------------------------------------------------------------------
# the loader on each local format


def test_parquet_folder_cifar100_like(tmp_path, hf_cache):
    dd = cifar100_like()
    src = write_parquet(dd, tmp_path / "cifar100")
    b = load_dataset("hf", tmp_path, path=str(src), cache_dir=hf_cache)
    assert tuple(b.x_train.shape) == (80, 3, 32, 32) and tuple(b.x_test.shape) == (20, 3, 32, 32)
    assert b.x_train.dtype == torch.uint8 and b.input_shape == (3, 32, 32)
    assert b.num_classes == 100 and b.y_train.tolist() == dd["train"]["fine_label"]  # fine_label: a common name
    assert b.y_test.tolist() == dd["test"]["fine_label"]
    assert np.array_equal(b.x_train[5].numpy(), pixels(dd["train"][5]["img"]))
    assert np.array_equal(b.x_test[-1].numpy(), pixels(dd["test"][19]["img"]))
    ref = b.x_train.double().div(255)
    assert np.allclose(b.mean, ref.mean(dim=(0, 2, 3)).numpy(), atol=1e-3)
    assert np.allclose(b.std, ref.std(dim=(0, 2, 3)).numpy(), atol=2e-3)
    assert b.augment == "none" and sorted(b.columns) == ["coarse_label", "fine_label"]
    coarse = load_dataset("hf", tmp_path, path=str(src), cache_dir=hf_cache, label_column="coarse_label")
    assert coarse.num_classes == 20 and coarse.y_train.tolist() == dd["train"]["coarse_label"]


def test_decoded_once_cached_and_decoded_again_when_the_data_changes(tmp_path, hf_cache):
    src = write_parquet(cifar100_like(), tmp_path / "c100")
    a = DATASETS["hf"](tmp_path, path=str(src), cache_dir=hf_cache)
    cached = list((tmp_path / ".fedsuite_cache").glob("hf-c100-*.pt"))
    assert len(cached) == 1
    data = torch.load(cached[0], weights_only=True)  # images and their statistics, decoded once
    assert torch.equal(data["x_train"], a.x_train) and tuple(data["mean"]) == a.mean and tuple(data["std"]) == a.std
    again = DATASETS["hf"](tmp_path, path=str(src), cache_dir=hf_cache)  # the loader itself: no in-process cache
    assert torch.equal(again.x_train, a.x_train) and again.mean == a.mean
    assert len(list((tmp_path / ".fedsuite_cache").glob("hf-c100-*.pt"))) == 1
    write_parquet(cifar100_like(seed=9), src)  # the same files, new contents
    changed = DATASETS["hf"](tmp_path, path=str(src), cache_dir=hf_cache)
    assert not torch.equal(changed.x_train, a.x_train) and changed.mean != a.mean
    assert len(list((tmp_path / ".fedsuite_cache").glob("hf-c100-*.pt"))) == 2


def test_save_to_disk_tinyimagenet_like_valid_split_and_mixed_grey(tmp_path):
    dd = tinyimagenet_like()
    dd.save_to_disk(str(tmp_path / "tiny"))
    b = load_dataset("hf", tmp_path, path=str(tmp_path / "tiny"))
    assert tuple(b.x_train.shape) == (40, 3, 64, 64) and tuple(b.x_test.shape) == (10, 3, 64, 64)  # valid = test
    assert b.num_classes == 200 and b.y_test.tolist() == dd["valid"]["label"]
    grey = np.asarray(dd["train"][3]["image"])
    assert np.array_equal(b.x_train[3].numpy(), np.stack([grey] * 3))  # a grey image among colour ones: RGB
    assert np.array_equal(b.x_train[4].numpy(), pixels(dd["train"][4]["image"]))
    forced = load_dataset("hf", tmp_path, path=str(tmp_path / "tiny"), mode="L")
    assert forced.input_shape == (1, 64, 64)
    # a save_to_disk folder of one Dataset is its train split; a relative path is under the data root
    dd["train"].save_to_disk(str(tmp_path / "single"))
    one = load_dataset("hf", tmp_path, path="single", test_fraction=0.25)
    assert len(one.y_train) == 30 and len(one.y_test) == 10
    held = sorted(one.y_train.tolist() + one.y_test.tolist())
    assert held == sorted(dd["train"]["label"])  # a split of the rows, nothing lost or repeated


def test_imagefolder_builder_grey_and_sizes(tmp_path, hf_cache):
    rng = np.random.default_rng(3)
    for split, n in (("train", 3), ("test", 1)):
        for cls in ("cat", "dog"):
            for i in range(n):
                p = tmp_path / "imgs" / split / cls / f"{i}.png"
                p.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(rng.integers(0, 256, (10, 10), dtype=np.uint8), mode="L").save(p)
    b = load_dataset("hf", tmp_path, path=str(tmp_path / "imgs"), cache_dir=hf_cache)
    assert tuple(b.x_train.shape) == (6, 1, 10, 10) and tuple(b.x_test.shape) == (2, 1, 10, 10)  # greyscale: C=1
    assert b.num_classes == 2 and sorted(b.y_train.tolist()) == [0, 0, 0, 1, 1, 1]
    Image.fromarray(rng.integers(0, 256, (12, 12), dtype=np.uint8), mode="L").save(tmp_path / "imgs" / "train" / "dog" / "9.png")
    with pytest.raises(DatasetError, match="different sizes") as ei:  # the loader itself: load_dataset cached it
        DATASETS["hf"](tmp_path, path=str(tmp_path / "imgs"), cache_dir=hf_cache)
    assert "size=<pixels>" in one_line(str(ei.value))
    resized = load_dataset("hf", tmp_path, path=str(tmp_path / "imgs"), cache_dir=hf_cache, size=8)
    assert tuple(resized.x_train.shape) == (7, 1, 8, 8)


def test_hub_id_is_read_from_the_datasets_cache_without_the_network(tmp_path, silent_hub):
    """The cache ``datasets.load_dataset("flwrlabs/femnist")`` leaves, made by the same builder
    (parquet, repo_id flwrlabs/femnist) from local files; the loader reads it with the hub off,
    so the silent endpoint is never waited for."""
    src = tmp_path / "files" / "femnist"  # the folder's name is the dataset's name, as the hub's repo name
    femnist_like().to_parquet(str(src / "data" / "train-00000-of-00001.parquet"))
    cache = str(tmp_path / "hf-cache")
    builder = datasets.load_dataset_builder(str(src), cache_dir=cache, repo_id="flwrlabs/femnist")
    builder.download_and_prepare()
    assert (Path(cache) / "flwrlabs___femnist").is_dir()
    b = load_dataset("hf", tmp_path / "root", path="flwrlabs/femnist", cache_dir=cache, test_fraction=0.1)
    assert not silent_hub.contacted()
    assert len(b.y_train) == 72 and len(b.y_test) == 8 and b.input_shape == (1, 28, 28)
    assert b.num_classes == 62 and sorted(b.columns) == ["character", "hsf_id", "writer_id"]
    assert len(np.unique(b.columns["writer_id"])) == 4


def test_local_copy_under_the_data_root_is_found_by_its_hub_id(tmp_path, silent_hub):
    cifar100_like().save_to_disk(str(tmp_path / "uoft-cs" / "cifar100"))
    b = load_dataset("hf", tmp_path, path="uoft-cs/cifar100")
    assert tuple(b.x_train.shape) == (80, 3, 32, 32) and b.num_classes == 100
    assert not silent_hub.contacted()


# ------------------------------------------------------------------------------------------
# a hub dataset that is not cached, the hub unreachable: one line, quickly


def test_missing_hub_dataset_is_one_line_after_a_bounded_wait(tmp_path, silent_hub):
    t0 = time.monotonic()
    with pytest.raises(DatasetError) as ei:
        load_dataset("hf", tmp_path, path="uoft-cs/cifar10", cache_dir=str(tmp_path / "empty-cache"))
    took = time.monotonic() - t0
    msg = one_line(str(ei.value))
    assert HUB_PROBE_TIMEOUT_S - 0.5 < took < HUB_PROBE_TIMEOUT_S + 5, took  # waited for the hub, and no longer
    assert "'uoft-cs/cifar10' is not in the datasets cache" in msg
    assert silent_hub.contacted()
    assert f"{silent_hub.url} did not answer within {HUB_PROBE_TIMEOUT_S:g} s" in msg
    assert """run `python -c 'import datasets; datasets.load_dataset("uoft-cs/cifar10")'`""" in msg
    assert "~/.cache/huggingface/datasets" in msg and "point path at a local copy" in msg


def test_offline_mode_is_respected_without_any_wait(tmp_path, silent_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    with pytest.raises(DatasetError, match="HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set") as ei:
        load_dataset("hf", tmp_path, path="flwrlabs/femnist", config_name="default",
                     cache_dir=str(tmp_path / "empty-cache"))
    assert time.monotonic() - t0 < HUB_PROBE_TIMEOUT_S and not silent_hub.contacted()
    assert """datasets.load_dataset("flwrlabs/femnist", "default")""" in one_line(str(ei.value))
    assert os.environ["HF_HUB_OFFLINE"] == "1" and "HF_DATASETS_OFFLINE" not in os.environ  # put back as it was


def test_cli_says_the_missing_dataset_in_one_line(tmp_path):
    """`fedsuite simulate --dataset hf` with the hub unreachable (HF_ENDPOINT: a silent socket):
    exit 2, one error line, no traceback, no run directory."""
    hub = SilentHub()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                                                            "HF_DATASETS_CACHE")}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "fedsuite.cli.main", "simulate", "--dataset", "hf", "--set",
             'dataset_options={path="uoft-cs/cifar10"}', "--set", f"data_root={tmp_path / 'data'}",
             "--output-dir", str(tmp_path / "runs")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    finally:
        hub.sock.close()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()
    line = one_line(proc.stderr.strip())
    assert line.startswith("error: hf: the Hugging Face dataset 'uoft-cs/cifar10' is not in the datasets cache "
                           f"{tmp_path / 'hf-home' / 'datasets'}"), line


# ------------------------------------------------------------------------------------------
# column and split detection, and their one-line errors


def _saved(tmp_path, name, columns, features, splits=("train", "test")):
    dd = datasets.DatasetDict({s: datasets.Dataset.from_dict(columns, features=datasets.Features(features))
                               for s in splits})
    dd.save_to_disk(str(tmp_path / name))
    return str(tmp_path / name)


def _imgs(n, rng=np.random.default_rng(4)):
    return [Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)) for _ in range(n)]


def test_column_detection_and_its_errors(tmp_path):
    two_images = _saved(tmp_path, "two-images", {"a": _imgs(4), "b": _imgs(4), "label": [0, 1, 0, 1]},
                        {"a": datasets.Image(), "b": datasets.Image(), "label": datasets.ClassLabel(num_classes=2)})
    with pytest.raises(DatasetError) as ei:
        load_dataset("hf", tmp_path, path=two_images)
    assert one_line(str(ei.value)).startswith("hf: cannot tell which column of ")
    assert "holds the images (a, b could); name it with image_column=<column>; its columns: a (Image), b (Image), " \
           "label (ClassLabel, 2 classes)." in str(ei.value)
    assert load_dataset("hf", tmp_path, path=two_images, image_column="b").input_shape == (3, 6, 6)

    two_labels = _saved(tmp_path, "two-labels", {"image": _imgs(4), "y1": [0, 1, 0, 1], "y2": [1, 1, 0, 0]},
                        {"image": datasets.Image(), "y1": datasets.ClassLabel(num_classes=2),
                         "y2": datasets.ClassLabel(num_classes=3)})
    with pytest.raises(DatasetError, match=r"holds the labels \(y1, y2 could\); name it with label_column=<column>"):
        load_dataset("hf", tmp_path, path=two_labels)
    b = load_dataset("hf", tmp_path, path=two_labels, label_column="y2")
    assert b.num_classes == 3 and b.y_train.tolist() == [1, 1, 0, 0]
    with pytest.raises(DatasetError) as ei:
        load_dataset("hf", tmp_path, path=two_labels, label_column="y3")
    assert one_line(str(ei.value)).endswith("has no column 'y3' (label_column); its columns: image (Image), "
                                            "y1 (ClassLabel, 2 classes), y2 (ClassLabel, 3 classes).")
    with pytest.raises(DatasetError, match="the label column 'image' .* is Image, not a ClassLabel feature"):
        load_dataset("hf", tmp_path, path=two_labels, label_column="image")

    text = _saved(tmp_path, "text-labels", {"img": _imgs(4), "label": ["dog", "cat", "emu", "cat"]},
                  {"img": datasets.Image(), "label": datasets.Value("string")})
    b = load_dataset("hf", tmp_path, path=text)  # text labels: indices of the sorted names
    assert b.num_classes == 3 and b.y_train.tolist() == [1, 0, 2, 0]

    tabular = _saved(tmp_path, "tabular", {"x1": [0.5, 1.0], "x2": [2.0, 3.0], "label": [0, 1]},
                     {"x1": datasets.Value("float32"), "x2": datasets.Value("float32"), "label": datasets.Value("int64")})
    with pytest.raises(DatasetError) as ei:
        load_dataset("hf", tmp_path, path=tabular)
    assert "has no image column (an Image feature); its columns: x1 (float32), x2 (float32), label (int64). " \
           "Datasets of tabular features are not supported by dataset hf" in one_line(str(ei.value))


def test_split_detection_and_its_errors(tmp_path):
    cols = {"image": _imgs(4), "label": [0, 1, 0, 1]}
    feats = {"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=2)}
    train_only = _saved(tmp_path, "train-only", cols, feats, splits=("train",))
    with pytest.raises(DatasetError) as ei:
        load_dataset("hf", tmp_path, path=train_only)
    assert one_line(str(ei.value)).endswith("has no test split (its splits: train); name one with test_split=<name> "
                                            "or hold out a share of the training split with test_fraction=0.1.")
    with pytest.raises(DatasetError, match="test_fraction must be between 0 and 1"):
        load_dataset("hf", tmp_path, path=train_only, test_fraction=1.5)
    validation = _saved(tmp_path, "train-validation", cols, feats, splits=("train", "validation"))
    assert len(load_dataset("hf", tmp_path, path=validation).y_test) == 4
    both = _saved(tmp_path, "two-validations", cols, feats, splits=("train", "valid", "validation"))
    with pytest.raises(DatasetError, match=r"name the test split with test_split=<name> \(validation or valid\)"):
        load_dataset("hf", tmp_path, path=both)
    assert len(load_dataset("hf", tmp_path, path=both, test_split="valid").y_test) == 4
    odd = _saved(tmp_path, "odd-names", cols, feats, splits=("fit", "holdout"))
    with pytest.raises(DatasetError, match="has no split named 'train'; its splits: fit, holdout"):
        load_dataset("hf", tmp_path, path=odd)
    assert len(load_dataset("hf", tmp_path, path=odd, train_split="fit", test_split="holdout").y_train) == 4
    with pytest.raises(DatasetError, match="has no split 'tset' \\(test_split\\); its splits: fit, holdout"):
        load_dataset("hf", tmp_path, path=odd, train_split="fit", test_split="tset")


def test_bad_paths_and_options_are_one_line(tmp_path):
    with pytest.raises(DatasetError, match="needs the option path="):
        load_dataset("hf", tmp_path)
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset("hf", tmp_path, path=str(tmp_path / "nowhere"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "blob.bin").write_bytes(b"no data here")
    with pytest.raises(DatasetError) as ei:
        load_dataset("hf", tmp_path, path=str(tmp_path / "notes"), cache_dir=str(tmp_path / "c"))
    assert "holds no dataset the datasets library can read" in one_line(str(ei.value))
    with pytest.raises(DatasetError, match="Unknown option"):
        load_dataset("hf", tmp_path, path="x/y", colour="red")
    with pytest.raises(DatasetError, match="mode must be"):
        load_dataset("hf", tmp_path, path="x/y", mode="CMYK")


# ------------------------------------------------------------------------------------------
# partitions: every partitioner, and natural by a column


def _femnist_bundle(tmp_path):
    femnist_like().save_to_disk(str(tmp_path / "femnist"))
    return load_dataset("hf", tmp_path, path=str(tmp_path / "femnist"), test_fraction=0.1)


def test_natural_partition_by_a_column(tmp_path):
    b = _femnist_bundle(tmp_path)
    writers = np.asarray(femnist_like()["writer_id"])[np.sort(np.random.default_rng(0).permutation(80)[8:])]
    parts = partition_indices(b, "natural", 4, seed=0, partition_by="writer_id")
    assert sorted(np.concatenate(parts).tolist()) == list(range(72))
    firsts = [writers[p][0] for p in parts]
    assert firsts == sorted(set(writers))  # one client per writer, in the order of the sorted ids
    assert all(len(set(writers[p])) == 1 for p in parts)
    assert [len(p) for p in parts] == [int((writers == w).sum()) for w in firsts]
    again = partition_indices(b, "natural", 4, seed=5, partition_by="writer_id", cache_dir=tmp_path / "parts")
    assert all(np.array_equal(x, y) for x, y in zip(parts, again))  # no seeded choice: the column decides
    by_hsf = partition_indices(b, "natural", 3, seed=0, partition_by="hsf_id")
    assert len(by_hsf) == 3


def test_natural_partition_by_refuses_another_num_clients(tmp_path):
    b = _femnist_bundle(tmp_path)
    with pytest.raises(ValueError) as ei:
        partition_indices(b, "natural", 100, seed=0, partition_by="writer_id")
    assert one_line(str(ei.value)) == ("The 'natural' partition by writer_id has 4 clients (the distinct writer_id "
                                       "values; 4 in all), but num_clients=100; set num_clients=4.")
    with pytest.raises(ValueError, match=r"has 0 clients \(the distinct writer_id values with at least "
                                         r"min_partition_size=50 samples; 4 in all\), but num_clients=4; "
                                         r"lower min_partition_size\.$"):
        partition_indices(b, "natural", 4, seed=0, partition_by="writer_id", min_partition_size=50)
    with pytest.raises(ValueError) as ei:
        partition_indices(b, "natural", 4, seed=0, partition_by="writer")
    assert one_line(str(ei.value)).startswith("partition_by='writer' is not a column of dataset 'hf'; its columns "
                                              "of ids: character, hsf_id, writer_id")
    with pytest.raises(ValueError, match="set partition_by=<column> \\(its columns of ids: character, hsf_id, writer_id\\)"):
        partition_indices(b, "natural", 4, seed=0)
    with pytest.raises(ValueError, match="applies to the 'natural' partition only"):
        partition_indices(b, "iid", 4, seed=0, partition_by="writer_id")
    synthetic = load_dataset("synthetic", tmp_path, num_devices=5)
    with pytest.raises(ValueError, match="has no columns .* leave partition_by unset to use its own groups"):
        partition_indices(synthetic, "natural", 5, seed=0, partition_by="device")


@pytest.mark.parametrize("scheme", [s for s in PARTITIONERS if s != "natural"])
def test_every_partitioner_takes_an_hf_bundle(tmp_path, hf_cache, scheme):
    b = load_dataset("hf", tmp_path, path=str(write_parquet(cifar100_like(), tmp_path / "c100")), cache_dir=hf_cache)
    kw = {"min_partition_size": 2} if scheme == "dirichlet" else {}
    parts = partition_indices(b, scheme, 4, seed=0, **kw)
    assert len(parts) == 4 and all(len(p) for p in parts)
    flat = np.concatenate(parts)
    assert flat.min() >= 0 and flat.max() < 80


def test_config_partition_by_only_with_natural():
    with pytest.raises(ConfigError) as ei:
        build_config(overrides=["partition_by=writer_id"])
    assert str(ei.value) == ("config: partition_by applies to the natural partitioner only (partitioner is "
                             "'dirichlet'); use --partitioner natural or drop partition_by")
    cfg = build_config(overrides=["partitioner=natural", "partition_by=writer_id"])
    assert cfg.partition_by == "writer_id"


# ------------------------------------------------------------------------------------------
# docs/datasets.md's recipes, trained offline on their small look-alikes


def test_docs_recipes_name_what_the_tests_run():
    text = DOCS.read_text()
    for words in ('path="flwrlabs/femnist"', "test_fraction=0.1", "--partitioner natural", "partition_by=writer_id",
                  'path="uoft-cs/cifar100"', 'label_column="coarse_label"', 'path="zh-plus/tiny-imagenet"',
                  "HF_HUB_OFFLINE", "save_to_disk", "--dataset npz", "--dataset imagefolder"):
        assert words in text, words


def test_recipe_femnist_by_writer_through_fedsuite_simulate(tmp_path):
    """The FEMNIST recipe as the docs write it (hub id replaced by a parquet copy, tiny scale):
    `fedsuite simulate --dataset hf --partitioner natural --set partition_by=writer_id`."""
    from fedsuite.engine import runtime

    src = tmp_path / "femnist"
    femnist_like().to_parquet(str(src / "data" / "train-00000-of-00001.parquet"))
    options = f'dataset_options={{path="{src}", test_fraction=0.1, cache_dir="{tmp_path / "hf-cache"}"}}'
    common = ["--dataset", "hf", "--model", "cnn", "--partitioner", "natural", "--set", "partition_by=writer_id",
              "--set", options, "--set", f"data_root={tmp_path / 'data'}", "--output-dir", str(tmp_path / "runs")]
    refused = fedsuite_run(["simulate", *common], cwd=tmp_path, timeout=600)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert one_line(refused.stderr.strip()) == (
        "error: The 'natural' partition by writer_id has 4 clients (the distinct writer_id values; 4 in all), "
        "but num_clients=100; set num_clients=4.")
    proc = fedsuite_run(["simulate", "--strategy", "fedavg", *common, "--num-clients", "4", "--clients-per-round", "2",
                         "--rounds", "1", "--batch-size", "16", "--run-name", "femnist"], cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = tmp_path / "runs" / "femnist"
    summary = json.loads((run / "summary.json").read_text())
    assert 0.0 <= summary["final_accuracy"] <= 1.0
    config = json.loads((run / "config.json").read_text())
    assert config["partition_by"] == "writer_id" and config["dataset"] == "hf"
    cfg = build_config(values={k: config[k] for k in ("dataset", "dataset_options", "data_root", "partitioner",
                                                     "partition_by", "num_clients", "min_partition_size")})
    bundle = runtime.load_bundle(cfg)
    sizes = [len(runtime.client_indices(cfg, bundle, i)) for i in range(4)]
    assert sorted(sizes) == sorted(np.bincount(bundle.columns["writer_id"]).tolist())


@pytest.mark.parametrize("recipe", ["cifar100", "tinyimagenet"])
def test_recipe_trains_one_round(simulate, tmp_path, recipe):
    """CIFAR-100 (coarse labels, as FedMR) from parquet files and Tiny-ImageNet from a save_to_disk
    folder: one round of a real simulation, the docs' dataset options at a tiny scale, on the in-process
    engine (the data is what is tested here; the FEMNIST recipe above runs on Flower's)."""
    if recipe == "cifar100":
        src = write_parquet(cifar100_like(), tmp_path / "cifar100")
        options = {"path": str(src), "label_column": "coarse_label", "cache_dir": str(tmp_path / "hf-cache"),
                   "augment": "crop-flip"}
        classes = 20
    else:
        tinyimagenet_like().save_to_disk(str(tmp_path / "tiny-imagenet"))
        options = {"path": str(tmp_path / "tiny-imagenet"), "augment": "crop-flip"}
        classes = 200
    res = simulate(dataset="hf", dataset_options=options, model="cnn", partitioner="dirichlet", alpha=0.5,
                   min_partition_size=2, num_clients=4, clients_per_round=2, rounds=1, batch_size=16,
                   data_root=str(tmp_path / "data"), engine="inprocess")
    assert [r["round"] for r in res.rows] == [0, 1]
    assert 0.0 <= res.summary["final_accuracy"] <= 1.0
    head = [k for k in res.arrays if k.endswith("weight")][-1]
    assert res.arrays[head].shape[0] == classes
