"""A run's record as the ServerApp writes it (:class:`RunRecorder`): ``metrics.jsonl`` row by row,
``clients.jsonl`` (one row per client and round: ``fedsuite.method.client_records.CLIENT_FIELDS``), the
TensorBoard event files beside them, and at the end ``accuracy.png``, ``diagnostics.png``,
``clients.png`` (federated evaluation) and ``summary.json`` (the run directory's layout:
``fedsuite.records.results``; its ``activity``: how much each of the run's distinguishing components
acted, ``fedsuite.method.activity``)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fedsuite.method.activity import Component, summarize_activity
from fedsuite.config import flat_config
from fedsuite.method.client_records import FEDERATED_COLUMNS
from fedsuite.records.plots import (has_client_evaluations, has_pool_diagnostics, plot_accuracy, plot_clients,
                            plot_pool_diagnostics)
from fedsuite.records.results import write_json
from fedsuite.records.rows import read_clients, read_metrics, row_json


def tensorboard_installed() -> bool:
    """Whether the ``tensorboard`` package (which torch's ``SummaryWriter`` writes for) is importable."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics row that TensorBoard plots: every finite int or float but ``round``
    (the step) and booleans; lists (cohort, dropped) and dicts (failure_reasons) are not scalars."""
    return {k: float(v) for k, v in row.items() if k != "round" and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardLog:
    """The run's metrics as TensorBoard event files in its folder (``tensorboard --logdir runs``
    shows every run under its folder name): each row's :func:`scalars` at step = round, and the
    config as hparams (the HParams tab compares runs and sweeps by their settings).

    ``purge_from``: on a resume, the round the run continues from; events of that round and later
    that an interrupted attempt wrote are hidden by TensorBoard (``SummaryWriter(purge_step=...)``),
    so each step shows the values of the round that counted."""

    def __init__(self, run_dir: Path, config: dict[str, Any], purge_from: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=purge_from)
        if purge_from is None:  # a new run: its settings, once
            flat = {k: (v if isinstance(v, (int, float, str, bool)) else json.dumps(v, sort_keys=True))
                    for k, v in flat_config(config).items() if v is not None}
            for summary in hparams(flat, {"test_accuracy": 0.0}):
                self.writer.file_writer.add_summary(summary)

    def add(self, row: dict[str, Any]) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, global_step=row["round"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class RunRecorder:
    """Appends per-round metrics and keeps summary and plot up to date (called by the ServerApp);
    with ``tensorboard``, the same rows go to a :class:`TensorBoardLog` (after metrics.jsonl, which
    is the record). ``components``: the run's distinguishing components (``cfg.components``), whose
    measures' columns ``summary.json``'s ``activity`` summarises."""

    def __init__(self, run_dir: Path, config: dict[str, Any] | None = None, tensorboard: bool = False,
                 components: Sequence[Component] = ()) -> None:
        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        self.clients_path = run_dir / "clients.jsonl"
        self.config = config or {}
        self.tensorboard = tensorboard
        self.components = list(components)
        self.board: TensorBoardLog | None = None

    def _board(self, purge_from: int | None = None) -> TensorBoardLog | None:
        if self.tensorboard and self.board is None:
            self.board = TensorBoardLog(self.run_dir, self.config, purge_from)
        return self.board

    def append(self, row: dict[str, Any], clients: list[dict[str, Any]] = ()) -> None:
        """Append a round's ``metrics.jsonl`` row, then its ``clients.jsonl`` rows (one per client)."""
        row = row_json(row)
        _append_lines(self.metrics_path, [row])
        if clients:
            _append_lines(self.clients_path, [row_json(r) for r in clients])
        if self._board() is not None:
            self.board.add(row)

    def rewind(self, checkpoint_round: int, checkpoint_row: dict[str, Any] | None,
               checkpoint_clients: list[dict[str, Any]] | None = None) -> None:
        """Make ``metrics.jsonl`` and ``clients.jsonl`` end at the checkpoint a run resumes from:
        keep the rows of earlier rounds, then the checkpoint's own rows (a checkpoint without them
        keeps the file's rows of that round). Rows of a round the checkpoint does not hold, and a
        half-written last line, go."""
        keep = _rewound(self.metrics_path, checkpoint_round, None if checkpoint_row is None else [checkpoint_row],
                        first_only=True)
        _rewound(self.clients_path, checkpoint_round, checkpoint_clients)
        if self.tensorboard and any(self.run_dir.glob("events.out.tfevents.*")):
            # an earlier attempt logged to TensorBoard: hide its events from the last kept row on,
            # and log that row again (a kill may have come between the checkpoint and its row)
            purge_from = keep[-1]["round"] if keep else 0
            self._board(purge_from)
            if keep:
                self.board.add(keep[-1])

    def close(self) -> None:
        """End the TensorBoard log (if any) without an outcome: a run stopped from outside."""
        if self.board is not None:
            self.board.close()
            self.board = None

    def finish(self, status: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        rows = read_metrics(self.run_dir)
        summary = summarize(rows, self.components)
        summary.update({"status": status, **(extra or {})})
        if "failure" in summary:  # the failed round has no metrics row: count its failures too
            summary["failed_replies"] += len(summary["failure"]["partition_ids"])
            summary["rounds_with_failures"] += 1
        if rows:
            plot_accuracy({self.run_dir.name: rows}, self.run_dir / "accuracy.png")
        if has_pool_diagnostics(rows):
            plot_pool_diagnostics(rows, self.run_dir / "diagnostics.png", title=self.run_dir.name)
        client_rows = read_clients(self.run_dir)
        if has_client_evaluations(client_rows):
            plot_clients(client_rows, self.run_dir / "clients.png", title=self.run_dir.name)
        self.close()
        # last: the launcher takes summary.json as the sign that the run has ended and stops its processes
        write_json(self.run_dir / "summary.json", summary)
        return summary


def summarize(rows: list[dict[str, Any]], components: Sequence[Component] = ()) -> dict[str, Any]:
    """``summary.json`` from a run's ``metrics.jsonl`` rows: rounds, final and best accuracy, failed
    replies, time per round, for a run with federated evaluation its last evaluated round's columns
    (``federated_evaluation``: ``fedsuite.method.client_records.FEDERATED_COLUMNS``) and, for a run with
    distinguishing ``components``, their ``activity``
    (``fedsuite.method.activity.summarize_activity``; left out when no round recorded a measure)."""
    evals = [(r["round"], r["test_accuracy"]) for r in rows if r.get("test_accuracy") is not None]
    out: dict[str, Any] = {"rounds_completed": max((r["round"] for r in rows), default=0)}
    if evals:
        out["final_accuracy"] = evals[-1][1]
        best_round, best = max(evals, key=lambda e: e[1])
        out["best_accuracy"], out["best_round"] = best, best_round
        losses = [r["test_loss"] for r in rows if r.get("test_loss") is not None]
        out["final_loss"] = losses[-1] if losses else None
    failed = [r.get("failed", 0) or 0 for r in rows if r["round"] > 0]
    out["failed_replies"] = int(sum(failed))
    out["rounds_with_failures"] = int(sum(1 for f in failed if f))
    walls = [r["wall_seconds"] for r in rows if r.get("wall_seconds") is not None and r["round"] > 0]
    if walls:
        out["seconds_per_round"] = float(np.median(walls))
        out["total_seconds"] = float(np.sum(walls))
    evaluated = [r for r in rows if r.get("clients_evaluated")]
    if evaluated:  # federated evaluation: its last round's columns
        out["federated_evaluation"] = {"round": evaluated[-1]["round"],
                                       **{k: evaluated[-1][k] for k in FEDERATED_COLUMNS if k in evaluated[-1]}}
    activity = summarize_activity(rows, components)
    if activity:
        out["activity"] = activity
    return out


def _append_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` to a JSON-lines file, one line each, and sync it."""
    with path.open("a") as f:
        f.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())


def _rewound(path: Path, checkpoint_round: int, own: list[dict[str, Any]] | None,
             first_only: bool = False) -> list[dict[str, Any]]:
    """Rewrite the JSON-lines file ``path`` to its rows of rounds before ``checkpoint_round``, then
    ``own`` (the checkpoint's rows of its round) or, when None, the file's rows of that round (the
    first one only with ``first_only``); a line cut short by a kill goes. Returns the rows kept."""
    if not path.is_file():
        if not own:
            return []
        lines = []
    else:
        lines = path.read_text().splitlines()
    rows: list[dict[str, Any]] = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
    keep = [r for r in rows if r["round"] < checkpoint_round]
    if own is not None:
        keep += [row_json(r) for r in own]
    elif checkpoint_round > 0:
        same = [r for r in rows if r["round"] == checkpoint_round]
        keep += same[:1] if first_only else same
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))
    os.replace(tmp, path)
    return keep

