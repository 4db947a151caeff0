"""What the ServerApp and the ClientApp share: config from the run config, data, model, device.

Datasets and partitions are cached per worker process (a Ray actor serves many virtual clients),
so they are read from disk once, not once per round.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsuite.config import BaseRunConfig, from_run_config
from fedsuite.data import load_dataset, partition_indices

RUN_DIR_KEY = "run_dir"


def split_run_config(run_config: dict[str, Any]) -> tuple[BaseRunConfig, Path]:
    """(validated config, absolute run directory) from a Flower run config."""
    flat = dict(run_config)
    run_dir = flat.pop(RUN_DIR_KEY, "")
    cfg = from_run_config(flat)
    return cfg, Path(run_dir) if run_dir else default_run_dir(cfg)


def run_name(cfg: BaseRunConfig) -> str:
    return cfg.run_name or f"{cfg.strategy}-{cfg.dataset}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def default_run_dir(cfg: BaseRunConfig) -> Path:
    return (Path(cfg.output_dir).expanduser() / run_name(cfg)).resolve()


def data_root(cfg: BaseRunConfig) -> Path:
    return Path(os.path.expandvars(cfg.data_root)).expanduser()


def load_bundle(cfg: BaseRunConfig):
    return _load_bundle(cfg.dataset, str(data_root(cfg)), _freeze(cfg.dataset_options))


@functools.cache
def _load_bundle(name: str, root: str, options: tuple):
    return load_dataset(name, root, **dict(options))


def client_indices(cfg: BaseRunConfig, bundle, partition_id: int) -> np.ndarray:
    """The training-sample indices of client ``partition_id`` (pure function of the config)."""
    return _partition(cfg.dataset, str(data_root(cfg)), _freeze(cfg.dataset_options), cfg.partitioner,
                      cfg.num_clients, cfg.seed, cfg.alpha, cfg.min_partition_size, cfg.classes_per_client,
                      cfg.shards_per_client)[partition_id]


@functools.cache
def _partition(name, root, options, scheme, num_clients, seed, alpha, min_size, classes, shards):
    bundle = _load_bundle(name, root, options)
    return partition_indices(
        bundle, scheme, num_clients, seed, alpha=alpha, min_partition_size=min_size,
        classes_per_client=classes, shards_per_client=shards, cache_dir=Path(root) / "partitions",
    )


def device_for(cfg: BaseRunConfig) -> torch.device:
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda")


def _freeze(options: dict[str, Any]) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items()))
