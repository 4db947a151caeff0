"""The datasets whose samples come with their clients: FedProx's Synthetic(alpha, beta) (one group
per device) and LEAF's FEMNIST (one group per writer). Their bundles carry ``groups`` (per training
sample) and ``test_groups`` (per test sample), which ``--partitioner natural`` splits by."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .bundle import DatasetBundle, DatasetError, _as_labels
from .files import _missing_error

__all__ = ["load_femnist", "load_synthetic"]


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
