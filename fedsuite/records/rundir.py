"""One run directory: the state its run is in, and whether a command may continue it.

A run directory (``<output_dir>/<run_name>``, see ``fedsuite.records.results`` for its files) is in one of
the states of :func:`state`. The CLI, the launcher, ``reproduce`` and ``report`` read it through this
module: where a run lives when its config names no folder (:func:`default_run_dir`), whether a run finished (:func:`summary_status`), how many rounds it has done
(:func:`rounds_done`, :func:`rounds_completed`), what its summary says (:func:`summary`) and why it
failed (:func:`why_incomplete`, :func:`flower_log_reason`), whether a command may continue it
(:func:`check_resumable`, :func:`resume_config`), and whether it is the run a queue asks for
(:func:`config_mismatch`). The parent-death watcher (``fedsuite.launch.reaper``) reads a run's
outcome here too.

Beside it in ``fedsuite.records``: whether the run's record is whole (``fedsuite.records.integrity``:
``check_record``, ``record_problem``, ``checkpointed_round``, ``recorded_config``), its rows
(``fedsuite.records.rows``: ``read_metrics``, ``read_clients``), making and holding the folder
(``fedsuite.records.hold``: ``create_run_dir``, ``start_debris``, ``claimed``), and whether a folder
can take a run at all (``fedsuite.records.paths.folder_problem``, the one path check).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsuite.records.hold import start_debris
from fedsuite.records.integrity import check_record, record_problem, recorded_config
from fedsuite.records.rows import read_metrics

if TYPE_CHECKING:
    from fedsuite.config import BaseRunConfig


def default_run_dir(cfg: BaseRunConfig) -> Path:
    """The folder of a run whose config gives no ``run_dir``: ``output_dir``/``run_name``, the name
    made from the method, dataset, seed and the time now when the config gives none."""
    name = cfg.run_name or f"{cfg.strategy}-{cfg.dataset}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    return (Path(cfg.output_dir).expanduser() / name).resolve()


def state(run_dir: Path, rounds: int | None = None) -> str:
    """``completed`` or ``failed`` (:func:`summary_status`), ``partial`` (a run to ``--resume``:
    config.json, no summary), ``damaged`` (a record that ``--resume`` would refuse:
    :func:`~fedsuite.records.integrity.record_problem`; a queue never counts it done nor continues
    it), ``debris`` (a directory without config.json: killed before the ServerApp started;
    ``fedsuite simulate`` starts the run anew in it when it holds only what a start-up writes,
    :func:`~fedsuite.records.hold.start_debris`) or ``new``.

    ``rounds``: the rounds the run is asked for (a queue's). A run that completed fewer is
    ``partial``: ``--resume`` with the larger count continues it from its last checkpoint, and its
    rounds are the ones a run asked for the larger count from the start has (tests/test_resume.py:
    2 + 2 + 2 rounds equal 6), up to what a method does on its last round (an evaluation, CCVR's
    calibration, both of the evaluated model only). A run that completed more is ``longer``: it is
    not what was asked, and a run is never cut short.

    Whether the run is the one asked for is :func:`config_mismatch`, which every queue checks
    before it starts anything; whether its records are whole and its own,
    :func:`~fedsuite.records.integrity.record_problem`."""
    recorded = summary_status(run_dir)
    if os.path.lexists(run_dir / "config.json") and record_problem(run_dir) is not None:
        return "damaged"
    if recorded is not None:
        if recorded[0] != "finished:completed":
            return "failed"
        if rounds is None:
            return "completed"
        done = rounds_completed(run_dir)
        return "completed" if done == rounds else "partial" if done < rounds else "longer"
    if (run_dir / "config.json").is_file():
        return "partial"
    return "debris" if run_dir.exists() else "new"


def rounds_completed(run_dir: Path) -> int:
    """The rounds a finished run's ``summary.json`` records (else its last round in ``metrics.jsonl``)."""
    done = summary(run_dir).get("rounds_completed")
    return done if isinstance(done, int) else rounds_done(run_dir)


def summary(run_dir: Path) -> dict[str, Any]:
    """The run's ``summary.json`` ({} before the ServerApp has written one, or if it is not a JSON
    object)."""
    try:
        ours = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):  # none yet, or being written (it is replaced atomically)
        return {}
    return ours if isinstance(ours, dict) else {}


def summary_status(run_dir: Path) -> tuple[str, str] | None:
    """The outcome the ServerApp recorded in ``summary.json`` (Flower's status names), or None
    before it has written one."""
    ours = summary(run_dir)
    if "status" not in ours:
        return None
    if ours.get("status") == "completed":
        return "finished:completed", ""
    if "failure" in ours:  # stopped on failed client replies
        return "finished:failed", ours["failure"]["message"]
    return "finished:failed", last_line(run_dir / "error.txt")


def why_incomplete(run_dir: Path, who: str, rounds: int | None = None) -> str:
    """One line for a run that did not complete (``rounds``: as asked, see :func:`state`): ``who``,
    its state, the rounds it did, and why (the failure ``summary.json`` records, else the last line
    of ``error.txt``)."""
    now = state(run_dir, rounds)
    if now == "new":
        return f"{who}: not run"
    if now == "longer":
        return (f"{who}: has {rounds_completed(run_dir)} rounds, more than the {rounds} asked "
                "(a run is not cut short: ask for its rounds, or use another output folder)")
    if now == "damaged":
        return f"{who}: damaged, not continued: {record_problem(run_dir)}"
    if now == "partial" and summary_status(run_dir) is not None:
        return f"{who}: partial, completed {rounds_completed(run_dir)} of {rounds} rounds (the queue continues it)"
    recorded = summary_status(run_dir)
    reason = recorded[1] if recorded is not None else last_line(run_dir / "error.txt")
    where = f", stopped after round {rounds_done(run_dir)}" if now in ("failed", "partial") else ""
    return f"{who}: {now}{where}" + (f": {reason}" if reason else "")


def flower_log_reason(run_dir: Path) -> str | None:
    """The real reason of a run that failed before the ServerApp could record one, from flower.log
    (Flower's own status says only "An error was encountered")."""
    log = run_dir / "flower.log"
    if not log.is_file():
        return None
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    if any("ActorPool is empty" in line for line in lines):
        return ("Ray could not start any client (ActorPool is empty): the per-client resources "
                "(num_cpus, num_gpus) exceed what this machine offers")
    errors = [line for line in lines if ("ERROR" in line or "Error:" in line or "Exception:" in line)
              and "An error was encountered" not in line and "exception occurred !!" not in line]
    return errors[-1] if errors else None


def last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
    return lines[-1] if lines else ""


def rounds_done(run_dir: Path) -> int:
    """The last round with a row in ``metrics.jsonl`` (a live run's half-written line is skipped)."""
    rows = read_metrics(run_dir, tolerant=True)
    return max((r["round"] for r in rows), default=0)


def check_resumable(cfg: BaseRunConfig, run_dir: Path) -> int:
    """A run directory that already holds a run is continued only from a whole record
    (:func:`~fedsuite.records.integrity.check_record`) and with a config its record allows
    (``fedsuite.config.check_resume``); raises ``ConfigError`` (a
    :class:`~fedsuite.errors.RecordError` for a damaged record) otherwise, having written nothing.
    Returns the rounds the run has done (0 for a directory without a run)."""
    if not os.path.lexists(run_dir / "config.json"):
        return 0
    from fedsuite.config import check_resume

    recorded, done = check_record(run_dir)
    check_resume(recorded, cfg, done)
    return done


def resume_config(given: BaseRunConfig, config: Path | None, set_: list[str], values: dict[str, Any]) -> BaseRunConfig:
    """The config ``fedsuite simulate --resume`` continues with: the run's recorded ``config.json``
    with the command line's options (``config``, ``set_``, ``values``: as ``build_config`` takes
    them) on top, refused (``ConfigError``, exit 2, nothing written) if they change a field outside
    ``fedsuite.config.RESUME_MUTABLE`` or ask for fewer rounds than the run has done
    (:func:`check_resumable`). A folder without ``config.json`` (empty, or a start-up's debris left
    by a fedsuite that made the folder before its config) holds no run to continue: refused, with
    what to do (a fresh start of the same name runs the command line's config in it)."""
    from fedsuite.config import ConfigError, build_config

    if given.run_name is None:
        raise ConfigError("--resume needs the run's --run-name (and --output-dir, if not the default)")
    run_dir = default_run_dir(given)
    if not os.path.lexists(run_dir / "config.json"):  # a config.json that is a folder or a link is damage
        if start_debris(run_dir):
            raise ConfigError(f"--resume: {run_dir} holds no run to continue (no config.json: nothing of a run was "
                              "recorded there); start the run without --resume, with its config, to run it in it")
        raise ConfigError(f"--resume: {run_dir} holds no run to continue (no config.json); check --output-dir and "
                          "--run-name, or start the run without --resume")
    cfg = build_config(config, set_, values, base=recorded_config(run_dir))
    cfg.output_dir, cfg.run_name = given.output_dir, given.run_name  # where the run was found
    check_resumable(cfg, run_dir)
    return cfg


def config_mismatch(run_dir: Path, cfg: BaseRunConfig, who: str = "a queued run") -> list[str]:
    """Whether the run in ``run_dir`` is the run ``cfg`` asks for: ``[]`` if it is, else each field
    where its recorded ``config.json`` differs, as ``field: recorded X, asked Y`` (values as JSON,
    as ``config.json`` holds them). The comparison is ``fedsuite.config.config_differences``, the
    one ``--resume`` makes: ``rounds`` and the other ``RESUME_MUTABLE`` fields (where a run lives,
    what hardware runs it) may differ; :func:`state` judges the rounds.

    A folder without ``config.json`` (``new``; ``debris``: a run killed in its first seconds,
    before the ServerApp recorded its config) records no run and differs from nothing: a queue
    starts the run in it as before. An unreadable record (a ``config.json`` that is a link or a
    folder too: :func:`~fedsuite.records.integrity.recorded_config`) is a ``ConfigError`` naming
    the file (``who`` starts its line)."""
    if not os.path.lexists(run_dir / "config.json"):
        return []
    from fedsuite.config import ConfigError, config_differences

    recorded = recorded_config(run_dir, who)
    try:
        changed = config_differences(recorded, cfg)
    except ConfigError as exc:  # recorded_config has validated it: not expected, but one line all the same
        raise ConfigError(f"{who}: {run_dir / 'config.json'}: {exc}") from None
    return [f"{key}: recorded {json.dumps(old)}, asked {json.dumps(new)}" for key, old, new in changed]
