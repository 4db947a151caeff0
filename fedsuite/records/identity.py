"""A run's identity, carried by every record it writes, so that one run never continues from another's.

**What it is.** The identity of a run is the digest (SHA-256, hex) of its *defining* config: the
resolved config as ``config.json`` holds it (``BaseRunConfig.active_dump``), flattened to dotted
keys, without the fields of ``fedsuite.config.RESUME_MUTABLE`` (``rounds``, where the run lives,
what hardware runs it: the fields ``--resume`` may change). So a run extended to more rounds
(``--resume --rounds``, a ``reproduce`` or ``sweep`` queue asked for more rounds) keeps its
identity, and a run of another learning rate, seed, partition, method, ... has another.

**Who carries it.**

* ``checkpoint.pt``: ``{"identity": {"digest": d, "config": defining config, "digests": [d, ...]}}``
  (:func:`checkpoint_identity`); ``digests`` are every identity the run's records have carried
  (the config's digest changes only when a fedsuite upgrade adds or renames a field; see below);
* ``summary.json``: the same ``identity`` entry;
* every client-state file (``fedsuite.method.state``): the digest under ``fedsuite.method.state.STATE_KEY``;
* a partition cache (``fedsuite.data.partition_cache``) carries the digest of its inputs and of its
  contents, and is recomputed when either does not match.

**The check** (:func:`problem`): a record whose identity is not its run's is refused, one line
(``--resume``: exit code 2, nothing written; a queue: the run is ``damaged``, never counted done).
A checkpoint matches when its digest is the run's, or, after a fedsuite upgrade changed the
config's fields, when its recorded defining config equals the run's up to fields at their
defaults (``fedsuite.config.config_differences``, the comparison ``--resume`` makes with
``config.json``). A client-state file matches when its digest is one of the checkpoint's.

**Records written before identities existed** (no ``identity`` entry, no ``STATE_KEY``) are
accepted where everything else of the record agrees: their folder's ``config.json`` is the run's
(``--resume`` and the queues check it), and a legacy checkpoint's metrics row equals that round's
row in ``metrics.jsonl`` (:func:`row_problem`: a checkpoint copied from another run carries that
run's row). A finished run whose summary carries no identity may lack its checkpoint (committed
records keep only ``config.json``, ``metrics.jsonl`` and ``summary.json``); one whose summary
carries an identity may not: its checkpoint is part of its record.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedsuite.config import BaseRunConfig

#: the entry of a checkpoint and of ``summary.json`` that holds the run's identity
KEY = "identity"


def defining(config: BaseRunConfig | dict[str, Any]) -> dict[str, Any]:
    """The defining config of ``config`` (a config, or a recorded ``config.json``, validated):
    its dotted keys and values, :data:`~fedsuite.config.RESUME_MUTABLE`'s fields left out."""
    from fedsuite.config import RESUME_MUTABLE, flat_config, validate

    cfg = validate(config) if isinstance(config, dict) else config
    flat = flat_config(cfg.active_dump())
    return {key: flat[key] for key in sorted(flat) if key.split(".", 1)[0] not in RESUME_MUTABLE}


def digest(config: BaseRunConfig | dict[str, Any]) -> str:
    """The run's identity: the SHA-256 of its :func:`defining` config as sorted JSON."""
    return hashlib.sha256(json.dumps(defining(config), sort_keys=True).encode()).hexdigest()


def checkpoint_identity(cfg: BaseRunConfig, earlier: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a checkpoint (and ``summary.json``) of a run of ``cfg`` records as its identity;
    ``earlier``: the identity of the checkpoint the run resumed from (its digests are kept)."""
    own = digest(cfg)
    digests = [d for d in (earlier or {}).get("digests", []) if isinstance(d, str) and d != own]
    return {"digest": own, "config": defining(cfg), "digests": [*digests, own]}


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys back into sections (``{"fedprox.mu": 1}`` -> ``{"fedprox": {"mu": 1}}``)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *sections, last = key.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[last] = value
    return out


def problem(recorded: Any, cfg: BaseRunConfig | dict[str, Any], what: str) -> str | None:
    """Why the identity ``recorded`` (a checkpoint's or summary's ``identity`` entry; None: a
    record written before identities) is not the run of ``cfg`` (its config, or its ``config.json``),
    or None if it is. ``what`` names the record in the line."""
    if recorded is None:
        return None  # a legacy record: the module docstring says when it is accepted
    if not isinstance(recorded, dict) or not isinstance(recorded.get("digest"), str):
        return f"{what} carries no readable run identity ({KEY!r} is {recorded!r:.60})"
    if recorded["digest"] == digest(cfg):
        return None
    from fedsuite.config import ConfigError, config_differences, validate

    config = recorded.get("config")
    try:
        mine = validate(cfg) if isinstance(cfg, dict) else cfg
        # the digests differ: the same run under a fedsuite whose fields changed, or another run
        changed = config_differences(nested(config), mine) if isinstance(config, dict) else None
    except ConfigError:
        changed = None
    if changed == []:
        return None
    differs = "; ".join(f"{key}: {json.dumps(old)} there, {json.dumps(new)} here" for key, old, new in
                        (changed or [])[:3]) or "its identity differs"
    return f"{what} is another run's ({differs})"


def state_problem(stored: Any, digests: list[str] | None, what: str) -> str | None:
    """Why a client-state file whose :data:`STATE_KEY` is ``stored`` (None: a legacy file) is not
    the run's whose checkpoint carries ``digests`` (None: a legacy checkpoint, or none yet: then the
    run's current digest is the one list), or None."""
    if stored is None or digests is None or stored in digests:
        return None
    return f"{what} is another run's (its run identity {str(stored)[:12]}... is not this run's)"


def row_problem(ckpt_row: Any, rows: list[dict[str, Any]], done: int, what: str, metrics: str) -> str | None:
    """Why a checkpoint of round ``done`` whose metrics row is ``ckpt_row`` (as ``metrics.jsonl`` holds
    rows: ``fedsuite.records.rows.row_json``) does not belong with the
    run's ``metrics.jsonl`` ``rows`` (its row of that round differs: a checkpoint copied from
    another run), or None. A checkpoint without a row, or a round without a row (a kill between the
    checkpoint and its row), is no evidence either way."""
    row = next((r for r in rows if r.get("round") == done), None)
    if not isinstance(ckpt_row, dict) or row is None or done == 0:
        return None
    mine = json.loads(json.dumps(ckpt_row, sort_keys=True))
    if mine == row:
        return None
    keys = sorted(k for k in set(mine) | set(row) if k != "wall_seconds" and mine.get(k) != row.get(k))
    if not keys:  # the wall time alone: the same computation
        return None
    key = keys[0]
    return (f"{what} holds another run's round {done} ({key}: {json.dumps(mine.get(key))} there, "
            f"{json.dumps(row.get(key))} in {metrics})")
