"""Per-client state, committed with the round it belongs to.

SCAFFOLD's c_i, FedDyn's gradient memory and FedInit's last local model are model-sized; kept in
``context.state`` they would be pickled to and from the Ray actor on every call and held in RAM for
every virtual client. So arrays go to disk under ``<state_dir>/client-<partition id>/``, written
atomically; a real SuperNode gets ``state_dir`` from ``--node-config "state-dir=..."``, in
simulation it is ``<run>/client-state``.

**Versioned by round** (what makes ``--resume`` exact): the state a client writes in round t goes to
``<name>.r<t>.pt``, and a client in round t reads the newest version made in a round < t. The server
sends round t only after it has checkpointed round t − 1, so every version < t belongs to a committed
round, while a version written during a round that was killed (and is re-run after ``--resume``)
is never read: the re-run overwrites it. After writing round t a client deletes the versions older
than the one it read (no later round can need them); the ServerApp, once it has checkpointed round
t, keeps only the newest version ≤ t of the clients it sampled (:func:`prune_committed`). So a client
holds one version of each name, two while a round that sampled it is in flight.

Small values (``get``/``set``) follow the same rule, as ``values.r<t>.json``: Flower's
``context.state`` is not used for them, since it neither survives a process restart nor rolls back
with a killed round.

``ClientState(..., server_round=None)`` (tools and benchmarks outside a federated round) keeps one
unversioned ``<name>.pt``/``values.json`` per name instead.

**Whose state it is.** With ``identity`` (the run's digest, ``fedsuite.records.identity.digest``: the
ClientApp passes it), every file written carries it under :data:`STATE_KEY`, beside
the arrays or the values (readers here never see that entry). ``--resume`` refuses a run whose
client-state files of committed rounds carry another run's identity
(``fedsuite.records.integrity.check_client_state``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable

import torch
from flwr.app import Context

#: a versioned state file's name: ``<name>.r<round>.<pt|json>`` (``fedsuite.records.integrity.check_client_state``
#: reads a run's client state by it too)
VERSIONED = _VERSION = re.compile(r"^(?P<name>.+)\.r(?P<round>\d+)\.(?P<ext>pt|json)$")
_VALUES = "values"
#: the entry of a client-state file that holds the run's identity (``.pt``: beside the arrays;
#: ``.json``: beside the values); ``fedsuite.records.identity`` says what it is
STATE_KEY = "__run__"


class ArrayStore:
    """Named dicts of tensors on disk under ``root/<owner>/<name>.pt``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, owner: str, name: str) -> Path:
        return self.root / owner / f"{name}.pt"

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


def _versions(folder: Path) -> dict[tuple[str, str], list[int]]:
    """{(name, ext): sorted rounds} of the versioned files in ``folder``."""
    out: dict[tuple[str, str], list[int]] = {}
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return out
    for entry in entries:
        m = _VERSION.match(entry.name)
        if m:
            out.setdefault((m["name"], m["ext"]), []).append(int(m["round"]))
    return {k: sorted(v) for k, v in out.items()}


def _file(folder: Path, name: str, ext: str, rnd: int | None) -> Path:
    return folder / (f"{name}.{ext}" if rnd is None else f"{name}.r{rnd}.{ext}")


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)  # atomic: a crash never leaves a half-written state file


class ClientState:
    """One client's persistent state across rounds, as seen from round ``server_round``
    (see module docstring). Within one instance a client reads what it wrote itself."""

    def __init__(self, context: Context | None, state_dir: str | Path, partition_id: int,
                 server_round: int | None = None, identity: str | None = None) -> None:
        self.context = context  # kept for callers; state does not live in context.state (see module)
        self.identity = identity  # the run's, written into every file (see module)
        self.folder = Path(state_dir) / f"client-{partition_id}"
        self.round = server_round
        self._written: set[tuple[str, str]] = set()
        self._seen = _versions(self.folder) if server_round is not None else {}
        raw = self._read(_VALUES, "json")
        self._values: dict[str, Any] = json.loads(raw.read_text()) if raw is not None else {}
        self._values.pop(STATE_KEY, None)

    # which file holds a name ---------------------------------------------------------------------
    def _committed_round(self, name: str, ext: str) -> int | None:
        """The newest version made before this round (None: none)."""
        older = [r for r in self._seen.get((name, ext), []) if r < self.round]
        return older[-1] if older else None

    def _read(self, name: str, ext: str) -> Path | None:
        if self.round is None or (name, ext) in self._written:
            path = _file(self.folder, name, ext, self.round)
            return path if path.is_file() else None
        rnd = self._committed_round(name, ext)
        return None if rnd is None else _file(self.folder, name, ext, rnd)

    def _wrote(self, name: str, ext: str) -> None:
        """After writing this round's version: drop versions older than the one this round read."""
        first = (name, ext) not in self._written
        self._written.add((name, ext))
        if self.round is None or not first:
            return
        keep = self._committed_round(name, ext)
        for rnd in self._seen.get((name, ext), []):
            if keep is not None and rnd < keep:
                _file(self.folder, name, ext, rnd).unlink(missing_ok=True)

    # small values ------------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self._values[key] = value
        path = _file(self.folder, _VALUES, "json", self.round)
        held = self._values if self.identity is None else {**self._values, STATE_KEY: self.identity}
        _atomic_write(path, lambda tmp: tmp.write_text(json.dumps(held, sort_keys=True)))
        self._wrote(_VALUES, "json")

    # large arrays ------------------------------------------------------------------------------
    def has_arrays(self, name: str) -> bool:
        return self._read(name, "pt") is not None

    def load_arrays(self, name: str, device: torch.device | str = "cpu") -> dict[str, torch.Tensor] | None:
        path = self._read(name, "pt")
        if path is None:
            return None
        held = torch.load(path, map_location=device, weights_only=True)
        held.pop(STATE_KEY, None)
        return held

    def save_arrays(self, name: str, arrays: dict[str, torch.Tensor]) -> None:
        data: dict[str, Any] = {k: v.detach().cpu() for k, v in arrays.items()}
        if self.identity is not None:
            data[STATE_KEY] = self.identity
        _atomic_write(_file(self.folder, name, "pt", self.round), lambda tmp: torch.save(data, tmp))
        self._wrote(name, "pt")


def prune_committed(state_dir: str | Path, partition_ids: Iterable[int], committed_round: int) -> None:
    """Called by the ServerApp after it has checkpointed ``committed_round``: for each client in
    ``partition_ids`` keep, per name, only the newest version made in a round ≤ ``committed_round``
    (versions of later rounds, if any, are left alone). A missing folder is not an error."""
    for pid in partition_ids:
        folder = Path(state_dir) / f"client-{pid}"
        for (name, ext), rounds in _versions(folder).items():
            done = [r for r in rounds if r <= committed_round]
            for rnd in done[:-1]:
                _file(folder, name, ext, rnd).unlink(missing_ok=True)
