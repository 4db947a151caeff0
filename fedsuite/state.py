"""Per-client state: small values in Flower's ``context.state``, large arrays on disk.

SCAFFOLD's c_i, FedDyn's gradient memory and FedInit's last local model are model-sized; kept in
``context.state`` they would be pickled to and from the Ray actor on every call and held in RAM for
every virtual client. So arrays go to ``<state_dir>/client-<partition id>/<name>.pt`` (written
atomically), and only scalars go to ``context.state``. In simulation ``state_dir`` is inside the
run directory; a real SuperNode gets it from ``--node-config "state-dir=..."``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from flwr.app import ConfigRecord, Context

_RECORD = "fedsuite-state"


class ArrayStore:
    """Named dicts of tensors on disk under ``root/<owner>/<name>.pt``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, owner: str, name: str) -> Path:
        return self.root / owner / f"{name}.pt"

    def has(self, owner: str, name: str) -> bool:
        return self.path(owner, name).is_file()

    def load(self, owner: str, name: str, device: torch.device | str = "cpu") -> dict[str, torch.Tensor] | None:
        path = self.path(owner, name)
        if not path.is_file():
            return None
        return torch.load(path, map_location=device, weights_only=True)

    def save(self, owner: str, name: str, arrays: dict[str, torch.Tensor]) -> None:
        path = self.path(owner, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({k: v.detach().cpu() for k, v in arrays.items()}, tmp)
        os.replace(tmp, path)  # atomic: a crash never leaves a half-written state file


class ClientState:
    """One client's persistent state across rounds (see module docstring)."""

    def __init__(self, context: Context | None, state_dir: str | Path, partition_id: int) -> None:
        self.context = context
        self.store = ArrayStore(state_dir)
        self.owner = f"client-{partition_id}"
        self._values: dict[str, Any] = {}
        if context is not None and _RECORD in context.state:
            self._values = dict(context.state[_RECORD])

    # small values ------------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self._values[key] = value
        if self.context is not None:
            self.context.state[_RECORD] = ConfigRecord(self._values)

    # large arrays ------------------------------------------------------------------------------
    def has_arrays(self, name: str) -> bool:
        return self.store.has(self.owner, name)

    def load_arrays(self, name: str, device: torch.device | str = "cpu") -> dict[str, torch.Tensor] | None:
        return self.store.load(self.owner, name, device)

    def save_arrays(self, name: str, arrays: dict[str, torch.Tensor]) -> None:
        self.store.save(self.owner, name, arrays)
