"""A run's rows read back: ``metrics.jsonl`` (one row per round) and ``clients.jsonl`` (one per
client and round), and a row as ``metrics.jsonl`` holds it.

:func:`read_metrics` and :func:`read_clients` are the one reading of those files, for a live run
(``tolerant``: a line being written is skipped) and a finished one (any damage is a
:class:`~fedsuite.errors.ResultsError` naming file and line; ``torn_tail``: a last line a kill cut
short is not). :func:`row_json` is what the recorder writes (``fedsuite.records.recording``) and
what the record check compares (``fedsuite.records.integrity``). Light: no torch, no Flower.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fedsuite.errors import ResultsError


def read_metrics(run_dir: str | Path, tolerant: bool = False, torn_tail: bool = False) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl``. A line that is not UTF-8 text holding a JSON object with an
    integer ``round`` raises :class:`ResultsError` naming file and line, or is skipped with
    ``tolerant`` (a live run's line being written). ``torn_tail``: a last line without its newline
    that a kill in the middle of an append can have left (:func:`torn_row`) is skipped; anything
    else there is damage as in any line."""
    return read_rows(Path(run_dir) / "metrics.jsonl", "metrics", tolerant, torn_tail)


def read_clients(run_dir: str | Path, tolerant: bool = False, torn_tail: bool = False) -> list[dict[str, Any]]:
    """The rows of ``clients.jsonl`` (one per client and round: ``fedsuite.method.rounds.CLIENT_FIELDS``),
    read as :func:`read_metrics` reads ``metrics.jsonl``; [] without the file (a run made before
    fedsuite wrote it)."""
    return read_rows(Path(run_dir) / "clients.jsonl", "client", tolerant, torn_tail)


def read_rows(path: Path, kind: str, tolerant: bool = False, torn_tail: bool = False) -> list[dict[str, Any]]:
    """The rows of a run's JSON-lines record ``path`` of ``kind`` rows (:func:`read_metrics`)."""
    if not path.is_file():
        return []
    try:
        data = path.read_bytes()
    except OSError as exc:
        if tolerant:
            return []
        raise ResultsError(f"{path} cannot be read ({exc.strerror})") from None
    lines = data.split(b"\n")  # the last item: what follows the last newline (b"" in a whole file)
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
            if not isinstance(row, dict) or not isinstance(row.get("round"), int):
                raise ValueError(f"not a {kind} row (a JSON object with an integer 'round')")
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError too
            if tolerant or (torn_tail and number == len(lines) and torn_row(line)):
                continue
            raise ResultsError(f"{path}, line {number}: not a valid {kind} row, the file is truncated or "
                               f"corrupt ({exc})") from None
        rows.append(row)
    return rows


def row_json(value: Any) -> Any:
    """``value`` (a metrics row, or anything in one) as ``metrics.jsonl`` holds it: a non-finite
    float as None (JSON has no NaN), numpy scalars as Python's, tuples as lists."""
    import numpy as np

    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: row_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [row_json(v) for v in value]
    if isinstance(value, np.generic):
        return row_json(value.item())
    return value


def torn_row(tail: bytes) -> bool:
    """Whether ``tail``, a last line without its newline, can be the start of a row that a kill cut
    short: the recorder writes each row as ASCII JSON (``json.dumps``: every other character is
    escaped), starting with ``{``."""
    return tail[:1] == b"{" and all(32 <= b < 127 for b in tail)

