"""Watching a started run from its records until it ends, on either engine: its progress, the stall
watchdog, and the errors of a run that could not start or did not finish well.

:func:`watch` reads the run's ``metrics.jsonl`` as rows land (``fedsuite.records.rows``) until the
ServerApp writes ``summary.json`` or the run's process ends; with ``stall_timeout_s`` it raises
:class:`StallError` for a run that makes no progress that long (the caller then stops the run's
processes). The Simulation Engine's launcher
(``fedsuite.launch.start``) and the Deployment Engine's (``fedsuite.deploy.superlink``) both watch
their runs with it. Light: no torch, no Flower.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable


class LaunchError(RuntimeError):
    """The run could not be started or did not finish well."""


class StallError(LaunchError):
    """The watchdog fired: no progress for ``stall_timeout_s`` seconds."""


def watch(run_dir: Path, running: Callable[[], bool],
          on_progress: Callable[[list[dict[str, Any]]], None] | None = None, stall_timeout_s: float = 0.0) -> None:
    """Report metrics as they land until the run has ended: ``summary.json`` exists (the ServerApp
    writes it last, also on failure) or ``running()`` turns false.

    Watchdog: progress is a new line in ``metrics.jsonl`` (round 0 = start-up done, then one per
    round); with ``stall_timeout_s > 0``, that long without progress raises :class:`StallError`
    (written to ``error.txt`` too)."""
    from fedsuite.records.rows import read_metrics

    summary = run_dir / "summary.json"
    seen = -1
    last_progress = time.monotonic()
    while running() and not summary.exists():
        rows = read_metrics(run_dir, tolerant=True)
        if len(rows) != seen:
            seen, last_progress = len(rows), time.monotonic()
            if on_progress is not None:
                on_progress(rows)
        elif stall_timeout_s > 0 and time.monotonic() - last_progress > stall_timeout_s:
            done = [r["round"] for r in rows if r.get("round", 0) > 0]
            where = (f"after round {done[-1]}" if done else
                     "during start-up (no round-0 evaluation yet)" if not rows else "in round 1")
            message = (f"no progress for {stall_timeout_s:g} s (stall_timeout_s) {where}; the run was "
                       f"stopped. Logs: {run_dir / 'flower.log'}")
            err = run_dir / "error.txt"
            if not err.exists():
                err.write_text(f"StallError: {message}\n")
            raise StallError(message)
        time.sleep(0.25)
    if on_progress is not None:
        on_progress(read_metrics(run_dir, tolerant=True))
