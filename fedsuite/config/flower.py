"""A config in Flower's run-config form and back: flat keys, dotted for sections
(:func:`to_run_config`, :func:`from_run_config`)."""

from __future__ import annotations

import json
from typing import Any

from fedsuite.config.build import apply_override
from fedsuite.config.schema import BaseRunConfig, validate


def to_run_config(cfg: BaseRunConfig) -> dict[str, Any]:
    """Flatten to Flower's run-config form: ``{"rounds": 20, "fedprox.mu": 0.01}``.

    ``None`` values are dropped (TOML has no null; the default fills them back in) and
    ``dataset_options`` travels as a JSON string because its keys are free-form.
    """
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: dict[str, Any]) -> None:
        for key, value in node.items():
            if value is None:
                continue
            if key == "dataset_options" and not prefix:
                flat[key] = json.dumps(value, sort_keys=True)
            elif isinstance(value, dict):
                walk(f"{prefix}{key}.", value)
            else:
                flat[f"{prefix}{key}"] = value

    walk("", cfg.active_dump())
    return flat


def from_run_config(run_config: dict[str, Any]) -> BaseRunConfig:
    """Inverse of :func:`to_run_config` (used by the ServerApp and ClientApp)."""
    data: dict[str, Any] = {}
    for key, value in run_config.items():
        if key == "dataset_options":
            value = json.loads(value) if value else {}
        apply_override(data, key, value)
    return validate(data)
