"""What a server rule is given and what each of its rounds leaves: :class:`ServerSetup` (the run's
config, the handshake's node map, w^0, the run folder, the model builder and the central evaluator),
:class:`RoundLog` (one round's line of ``metrics.jsonl``) and :class:`RoundFailure` (a round that
failed the run). Shared by the strategy base (``fedsuite.method.strategy``), the ServerApp and the
plug-ins' server halves (``fedsuite.method.plugins.base.ServerHooks``), which get these, not the strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fedsuite.method.arrays import NDArrays, trainable_keys
from fedsuite.method.client_records import CLIENT_FIELDS



#: ``RoundLog.drop_reasons`` for a sampled client whose SuperNode is not connected
DROP_NOT_CONNECTED = "node not connected"
#: ... and for one that was sent work but did not answer before the round timed out
DROP_TIMEOUT = "no reply within round_timeout_s"

@dataclass
class ServerSetup:
    """What a server rule is built from."""

    cfg: Any  # fedsuite.config.BaseRunConfig
    node_to_pid: dict[int, int]  # Flower node id -> partition id (from the handshake)
    initial: NDArrays  # w^0, state_dict order
    run_dir: Path | None = None
    build_model: Callable[[], Any] | None = None  # a fresh torch model of the run's architecture
    # central evaluation of a model given as arrays on the run's test set: {"accuracy", "loss"}
    # (the ServerApp's, fedsuite.method.training.evaluate; None in hand-built setups)
    evaluate: Callable[[NDArrays], dict[str, float]] | None = None
    # n_i: the number of training samples of a partition id in the run's partition (the ServerApp's;
    # None in hand-built setups). A server rule that weighs clients before they reply asks here.
    partition_size: Callable[[int], int] | None = None

    def trainable_keys(self) -> list[str]:
        """Names of the trainable parameters in w^0's order: from a fresh model when the setup can
        build one, else every floating-point array of w^0 (hand-built setups in tests)."""
        if self.build_model is not None:
            names = set(trainable_keys(self.build_model()))
            return [k for k in self.initial if k in names]
        return [k for k, v in self.initial.items() if np.issubdtype(v.dtype, np.floating)]


@dataclass
class RoundLog:
    """What one round did: the line the ServerApp writes into ``metrics.jsonl`` (besides the test
    metrics and the wall time). The base strategy fills the fixed fields; a method or plug-in adds
    its own columns with :meth:`add`. Columns merge: a writer adds its keys and never replaces
    another writer's (the method's columns and a plug-in's live side by side)."""

    round: int = 0
    cohort: list[int] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0
    dropped: list[int] = field(default_factory=list)
    drop_reasons: dict[int, str] = field(default_factory=dict)
    failed: int = 0
    num_replies: int = 0
    train_loss: float | None = None
    columns: dict[str, Any] = field(default_factory=dict)
    #: each client's part in the round by partition id (its ``clients.jsonl`` row: :meth:`client_rows`)
    clients: dict[int, dict[str, Any]] = field(default_factory=dict)

    def add(self, columns: dict[str, Any]) -> None:
        """Add (or update) columns of this round's line (JSON-serialisable values)."""
        self.columns.update(columns)

    def note(self, pid: int, **fields: Any) -> None:
        """Set fields of client ``pid``'s row of this round (``fedsuite.method.client_records.CLIENT_FIELDS``).
        A training reply's ``num_steps``, ``train_loss`` and ``train_seconds`` are None where its
        ClientApp (another than fedsuite's) does not report them: they describe the reply, the server
        rule does not need them."""
        unknown = set(fields) - set(CLIENT_FIELDS)
        if unknown:
            raise KeyError(f"not a clients.jsonl field: {', '.join(sorted(unknown))}")
        self.clients.setdefault(pid, {}).update(fields)

    def count_bytes(self, pid: int, sent: int = 0, received: int = 0) -> None:
        """Add a message's bytes to the round's totals and to client ``pid``'s."""
        self.bytes_sent += sent
        self.bytes_received += received
        row = self.clients.setdefault(pid, {})
        row["bytes_sent"] = row.get("bytes_sent", 0) + sent
        row["bytes_received"] = row.get("bytes_received", 0) + received

    def client_rows(self) -> list[dict[str, Any]]:
        """The round's ``clients.jsonl`` rows: one per client that was sampled or evaluated, by
        partition id, every ``CLIENT_FIELDS`` key present (None where it does not apply), the
        training failure's reason from ``drop_reasons``."""
        rows = []
        for pid in sorted(set(self.cohort) | set(self.clients)):
            row = {name: None for name in CLIENT_FIELDS}
            row.update({"round": self.round, "partition_id": pid, "sampled": pid in self.cohort,
                        "bytes_sent": 0, "bytes_received": 0, **self.clients.get(pid, {})})
            row["failure"] = self.drop_reasons.get(pid)
            rows.append(row)
        return rows

    def drop(self, pid: int, reason: str) -> None:
        """Record a dropped client (the first reason given for it is kept)."""
        self.dropped.append(pid)
        self.drop_reasons.setdefault(pid, reason)

    def row(self) -> dict[str, Any]:
        """The round's fields after ``train_loss`` in ``metrics.jsonl`` order (the ServerApp adds the
        round, test metrics, ``train_loss`` and the wall time before them)."""
        return {
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "cohort": self.cohort,
            "dropped": self.dropped,
            "failed": self.failed,
            "failure_reasons": {str(k): v for k, v in self.drop_reasons.items()},
            **self.columns,
        }


class RoundFailure(RuntimeError):
    """Too many of a round's client replies failed or were rejected (see ``max_failed_fraction``).

    Carries what ``summary.json`` records under ``failure``: the round, the failed partition ids,
    the cohort size and the first error message."""

    def __init__(self, server_round: int, failed: list[int], cohort_size: int, first_error: str, limit: float) -> None:
        self.server_round, self.failed, self.cohort_size = server_round, failed, cohort_size
        self.first_error, self.limit = first_error, limit
        shown = ", ".join(map(str, failed[:20])) + (", ..." if len(failed) > 20 else "")
        super().__init__(
            f"round {server_round}: {len(failed)} of {cohort_size} client replies failed "
            f"(partitions {shown}; max_failed_fraction={limit:g}); first error: {first_error}"
        )

    def record(self) -> dict[str, Any]:
        return {"round": self.server_round, "partition_ids": self.failed, "cohort_size": self.cohort_size,
                "first_error": self.first_error, "max_failed_fraction": self.limit, "message": str(self)}
