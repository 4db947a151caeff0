"""What the ServerApp and the ClientApp share: config from the run config, data, model, device.

Datasets and partitions are cached per worker process (a Ray actor serves many virtual clients),
so they are read from disk once, not once per round. Before a run starts, the CLI checks here that
its data and model fit together (:func:`check_data`) and that the GPUs it asks for exist
(:func:`check_hardware`): one line and exit 2 instead of a failure inside Flower.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsuite.config import BaseRunConfig, from_run_config
from fedsuite.data import load_dataset, partition_indices
from fedsuite.errors import ConfigError, DataError
from fedsuite.method.seeding import seed_for
from fedsuite.records.rundir import default_run_dir

RUN_DIR_KEY = "run_dir"

#: a Flower app of one's own (``fedsuite.engine.server_app.method_strategy``) writes fedsuite's run records
#: (``config.json``, ``metrics.jsonl``, ``summary.json``, ...) into the run directory when its run
#: config has this key set to true; like :data:`RUN_DIR_KEY` it is the app's, not a config field
RECORDS_KEY = "records"

#: a batch's Flower app (``fedsuite.launch.start.simulate_batch``) has this one run config key: its runs'
#: flat run configs (each with its :data:`RUN_DIR_KEY`), in the order they run, as a JSON list; its
#: messages carry the index of their run in that list as their ``group_id``
BATCH_KEY = "fedsuite-batch"


def app_runs(run_config: dict[str, Any]) -> list[dict[str, Any]]:
    """The flat run configs a Flower app's run config holds: its own, or a batch's (:data:`BATCH_KEY`)."""
    if BATCH_KEY in run_config:
        return [dict(flat) for flat in _batch_runs(str(run_config[BATCH_KEY]))]
    return [dict(run_config)]


@functools.lru_cache(maxsize=4)
def _batch_runs(text: str) -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(text))


def split_run_config(run_config: dict[str, Any]) -> tuple[BaseRunConfig, Path]:
    """(validated config, absolute run directory) from a Flower run config. Validated once per
    process and run config: every client message of a run carries the same one (a Ray actor or the
    in-process engine serves many), so the later calls return the first one's config object, which
    nothing changes."""
    key = tuple(sorted(run_config.items()))
    if key not in _SPLIT:
        flat = dict(run_config)
        run_dir = flat.pop(RUN_DIR_KEY, "")
        flat.pop(RECORDS_KEY, None)  # the app's own key (records_asked)
        cfg = from_run_config(flat)
        _SPLIT[key] = cfg, Path(run_dir) if run_dir else default_run_dir(cfg)
    return _SPLIT[key]


def records_asked(run_config: dict[str, Any]) -> bool:
    """Whether an app's run config asks for fedsuite's run records (:data:`RECORDS_KEY`: a TOML boolean)."""
    value = run_config.get(RECORDS_KEY, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{RECORDS_KEY} must be true or false (a TOML boolean), got {value!r}")
    return value


#: :func:`split_run_config`'s results, by run config
_SPLIT: dict[tuple, tuple[BaseRunConfig, Path]] = {}


def data_root(cfg: BaseRunConfig) -> Path:
    return Path(os.path.expandvars(cfg.data_root)).expanduser()


def load_bundle(cfg: BaseRunConfig):
    return _load_bundle(cfg.dataset, str(data_root(cfg)), _freeze(cfg.dataset_options))


@functools.cache
def _load_bundle(name: str, root: str, options: tuple):
    return load_dataset(name, root, **dict(options))


def forget_data() -> None:
    """Drop the datasets and partitions this process holds (:func:`load_bundle`'s cache): a queue
    that checked its runs' data (``fedsuite.queues.reproduce.queue.check_runs``) does not keep it while
    its runs load their own."""
    _load_bundle.cache_clear()
    _partition.cache_clear()


def client_indices(cfg: BaseRunConfig, bundle, partition_id: int) -> np.ndarray:
    """The training-sample indices of client ``partition_id`` (pure function of the config)."""
    return _partition(cfg.dataset, str(data_root(cfg)), _freeze(cfg.dataset_options), cfg.partitioner,
                      cfg.num_clients, cfg.seed, cfg.alpha, cfg.min_partition_size, cfg.classes_per_client,
                      cfg.shards_per_client, cfg.partition_by)[partition_id]


#: the purpose tag of a client's held-out share (``fedsuite.method.seeding``): :func:`client_split`
HOLDOUT_TAG = 0x7E57


@dataclass(frozen=True)
class ClientSplit:
    """A client's data under federated evaluation: ``train``, the training-sample indices it trains on;
    ``test``, the indices of its own test data, into the dataset's test split when ``natural`` (the
    client's own test split: :attr:`DatasetBundle.test_groups`), else into the training set (its
    held-out share)."""

    train: np.ndarray
    test: np.ndarray
    natural: bool


def client_split(cfg: BaseRunConfig, bundle, partition_id: int) -> ClientSplit:
    """Client ``partition_id``'s training and own test data (pure function of the config).

    ``federated_eval = "off"``: its whole partition, no test data (the training data of every run
    without federated evaluation). Otherwise, with a natural partition of a dataset whose clients have
    test splits of their own (``bundle.test_groups``: synthetic's devices, FEMNIST's writers), the
    whole partition and the client's own test split; else (and for a client whose own test split is
    empty) :func:`holdout` of its partition: ``local_test_fraction`` of it held out, seeded by
    (seed, partition id)."""
    idx = client_indices(cfg, bundle, partition_id)
    if cfg.federated_eval == "off":
        return ClientSplit(idx, np.zeros(0, np.int64), False)
    groups, test_groups = getattr(bundle, "groups", None), getattr(bundle, "test_groups", None)
    if cfg.partitioner == "natural" and cfg.partition_by is None and groups is not None and test_groups is not None \
            and len(idx):
        own = np.flatnonzero(test_groups == groups[idx[0]])
        if len(own):
            return ClientSplit(idx, own.astype(np.int64), True)
    train, test = holdout(idx, cfg.local_test_fraction, cfg.seed, partition_id)
    return ClientSplit(train, test, False)


def holdout(indices: np.ndarray, fraction: float, seed: int, partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) of a client's ``indices``: k = round(fraction · n), at least 1 and at most n − 1,
    drawn without replacement by a generator seeded from (seed, partition id, :data:`HOLDOUT_TAG`);
    both keep the partition's order. A partition of fewer than 2 samples raises ``ValueError``."""
    n = len(indices)
    if n < 2:
        raise ValueError(f"client {partition_id} has {n} training sample(s); federated evaluation holds out at "
                         f"least one and trains on at least one (raise min_partition_size or use fewer clients)")
    k = min(n - 1, max(1, int(round(fraction * n))))
    order = np.random.default_rng(seed_for(seed, partition_id, HOLDOUT_TAG)).permutation(n)
    return indices[np.sort(order[k:])], indices[np.sort(order[:k])]


@functools.cache
def _partition(name, root, options, scheme, num_clients, seed, alpha, min_size, classes, shards, partition_by):
    bundle = _load_bundle(name, root, options)
    return partition_indices(
        bundle, scheme, num_clients, seed, alpha=alpha, min_partition_size=min_size,
        classes_per_client=classes, shards_per_client=shards, partition_by=partition_by,
        cache_dir=Path(root) / "partitions",
    )


def device_for(cfg: BaseRunConfig) -> torch.device:
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda")


def _freeze(options: dict[str, Any]) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items()))


def is_data_error(exc: BaseException) -> bool:
    """Whether a loader's or partitioner's exception is the user's (missing or damaged files, an
    impossible partition: ``DatasetError``, ``ValueError``; a file or folder the operating system
    will not read: ``OSError``) rather than a bug."""
    return exc.__class__.__name__ in ("DatasetError", "ValueError") or isinstance(exc, OSError)


def check_data(cfg: BaseRunConfig) -> None:
    """Missing data, an impossible partition or a model that cannot take the data (``--model cnn`` on
    feature vectors): :class:`~fedsuite.errors.DataError`, one line. A first run computes and caches its
    partition here."""
    from fedsuite.models import make_model

    try:
        bundle = load_bundle(cfg)
        client_indices(cfg, bundle, 0)
        if cfg.federated_eval != "off":  # every client must have data to train on and to test on
            for pid in range(cfg.num_clients):
                client_split(cfg, bundle, pid)
        with torch.device("meta"):  # the builders check the input shape; no weights are made
            make_model(cfg, bundle)
    except Exception as exc:  # data errors from loaders and partitioners are user errors
        if is_data_error(exc):
            raise DataError(str(exc)) from None
        raise


def check_hardware(cfg: BaseRunConfig) -> None:
    """A client's CPU cores (``num_cpus``) must fit the cores this process may use, and GPUs asked
    for (``num_gpus`` > 0 or ``device=cuda``) must be visible here; else ``ConfigError``
    (one line, exit 2) instead of Ray failing late ("ActorPool is empty") or training silently on the CPU."""
    from fedsuite.config import ConfigError

    if cfg.ray_address:  # the clients run on the cluster's nodes: ask the cluster (fedsuite.launch.raycluster)
        from fedsuite.launch.raycluster import ClusterError, check_cluster

        try:
            check_cluster(cfg.ray_address, cfg.num_cpus, cfg.num_gpus)
        except ClusterError as exc:
            raise ConfigError(str(exc)) from None
        if cfg.device != "cuda":
            return
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if cfg.num_cpus > cores:
            raise ConfigError(f"num_cpus={cfg.num_cpus} is the CPU cores of one client, but this process may use "
                              f"{cores}; use at most {cores} (or --ray-address for a cluster with bigger nodes)")
        if cfg.num_gpus <= 0 and cfg.device != "cuda":
            return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    asked = f"num_gpus={cfg.num_gpus:g}" if cfg.num_gpus > 0 else "device=cuda"
    if count == 0:
        raise ConfigError(f"{asked} asks for a GPU, but no CUDA GPU is visible on this machine "
                          "(torch.cuda.is_available() is False); use num_gpus=0 and device=auto or cpu")
    if cfg.num_gpus > count and not cfg.ray_address:
        raise ConfigError(f"num_gpus={cfg.num_gpus:g} is the GPU share of one client, but this machine has "
                          f"{count} GPU(s); use a share of at most {count} (e.g. 0.25 puts 4 clients on a GPU)")
