"""One run directory: what is in it, and what may be done with it.

A run directory (``<output_dir>/<run_name>``, see ``fedsuite.records.results`` for its files) is in one of
the states of :func:`state`. The CLI, the launcher, ``reproduce`` and ``report`` read it only
through this module: whether a run finished (:func:`summary_status`), how many rounds it has done
(:func:`checkpointed_round`, :func:`rounds_done`), what its summary says (:func:`summary`) and
why it failed (:func:`why_incomplete`, :func:`flower_log_reason`), whether a command may continue
it (:func:`check_resumable`, :func:`recorded_config`, :func:`resume_config`), whether its record
is whole (:func:`check_record`: no file of it a link, a folder, unreadable, undecodable or
inconsistent with the others; the readers check what they read: :func:`recorded_summary`,
:func:`recorded_rows`), whether it is the
run a queue asks for (:func:`config_mismatch`), whether it is the debris of a start-up
(:func:`start_debris`), who holds it (:func:`claimed`), and whether a folder can take a run at all
(:func:`folder_problem`, ``fedsuite.records.paths``'s, the one path check). The parent-death watcher (``fedsuite.launch.reaper``)
reads a run's outcome here too.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import stat
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from fedsuite.errors import RecordError, ResultsError, RunDirError
from fedsuite.records.paths import folder_problem  # noqa: F401  (re-exported: the one check lives in fedsuite.records.paths)
from fedsuite.launch.processes import marked

if TYPE_CHECKING:
    from fedsuite.config import BaseRunConfig


def default_run_dir(cfg: BaseRunConfig) -> Path:
    """The folder of a run whose config gives no ``run_dir``: ``output_dir``/``run_name``, the name
    made from the method, dataset, seed and the time now when the config gives none."""
    name = cfg.run_name or f"{cfg.strategy}-{cfg.dataset}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    return (Path(cfg.output_dir).expanduser() / name).resolve()


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


def state(run_dir: Path, rounds: int | None = None) -> str:
    """``completed`` or ``failed`` (:func:`summary_status`), ``partial`` (a run to ``--resume``:
    config.json, no summary), ``damaged`` (a record that ``--resume`` would refuse:
    :func:`record_problem`; a queue never counts it done nor continues it), ``debris`` (a directory without config.json: killed before the
    ServerApp started; ``fedsuite simulate`` starts the run anew in it when it holds only what a
    start-up writes, :func:`start_debris`) or ``new``.

    ``rounds``: the rounds the run is asked for (a queue's). A run that completed fewer is
    ``partial``: ``--resume`` with the larger count continues it from its last checkpoint, and its
    rounds are the ones a run asked for the larger count from the start has (tests/test_resume.py:
    2 + 2 + 2 rounds equal 6), up to what a method does on its last round (an evaluation, CCVR's
    calibration, both of the evaluated model only). A run that completed more is ``longer``: it is
    not what was asked, and a run is never cut short.

    Whether the run is the one asked for is :func:`config_mismatch`, which every queue checks
    before it starts anything; whether its records are whole and its own, :func:`record_problem`."""
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
    (:func:`check_record`) and with a config its record allows (``fedsuite.config.check_resume``);
    raises ``ConfigError`` (a :class:`~fedsuite.errors.RecordError` for a damaged record)
    otherwise, having written nothing. Returns the rounds the run has done (0 for a directory
    without a run)."""
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


def recorded_config(run_dir: Path, who: str = "--resume") -> dict[str, Any]:
    """A run's ``config.json``, checked to validate with this fedsuite; anything else (not UTF-8,
    not JSON, not a config) is a ``ConfigError`` naming the file, in one line that starts with
    ``who``."""
    from fedsuite.config import ConfigError, validate

    record = run_dir / "config.json"
    record_file(record, who, RESUME_REMEDY)
    try:
        recorded = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError and UnicodeDecodeError
        raise ConfigError(f"{who}: {record} cannot be read as JSON ({exc})") from None
    if not isinstance(recorded, dict):
        raise ConfigError(f"{who}: {record} holds {type(recorded).__name__}, not a run's config")
    try:
        validate(recorded)
    except ConfigError as exc:
        raise ConfigError(f"{who}: {record} does not validate with this fedsuite: {exc}") from None
    return recorded


def config_mismatch(run_dir: Path, cfg: BaseRunConfig, who: str = "a queued run") -> list[str]:
    """Whether the run in ``run_dir`` is the run ``cfg`` asks for: ``[]`` if it is, else each field
    where its recorded ``config.json`` differs, as ``field: recorded X, asked Y`` (values as JSON,
    as ``config.json`` holds them). The comparison is ``fedsuite.config.config_differences``, the
    one ``--resume`` makes: ``rounds`` and the other ``RESUME_MUTABLE`` fields (where a run lives,
    what hardware runs it) may differ; :func:`state` judges the rounds.

    A folder without ``config.json`` (``new``; ``debris``: a run killed in its first seconds,
    before the ServerApp recorded its config) records no run and differs from nothing: a queue
    starts the run in it as before. An unreadable record (a ``config.json`` that is a link or a
    folder too: :func:`recorded_config`) is a ``ConfigError`` naming the file (``who`` starts its
    line)."""
    if not os.path.lexists(run_dir / "config.json"):
        return []
    from fedsuite.config import ConfigError, config_differences

    recorded = recorded_config(run_dir, who)
    try:
        changed = config_differences(recorded, cfg)
    except ConfigError as exc:  # recorded_config has validated it: not expected, but one line all the same
        raise ConfigError(f"{who}: {run_dir / 'config.json'}: {exc}") from None
    return [f"{key}: recorded {json.dumps(old)}, asked {json.dumps(new)}" for key, old, new in changed]


def checkpointed_round(run_dir: Path, who: str = "--resume") -> int:
    """The last round ``<run>/checkpoint.pt`` holds (0 without one); a checkpoint that is a link, a
    folder or cannot be read (truncated, empty, not torch's format) is a
    :class:`~fedsuite.errors.RecordError` naming it, in one line."""
    ckpt = read_checkpoint(run_dir, who)
    return 0 if ckpt is None else int(ckpt["round"])


def read_checkpoint(run_dir: Path, who: str | None = "--resume") -> dict[str, Any] | None:
    """``<run>/checkpoint.pt`` (None without one), read memory-mapped (its arrays are not read
    from disk) and checked as :func:`checkpointed_round` says."""
    import torch

    ckpt = run_dir / "checkpoint.pt"
    if not record_file(ckpt, who, RESUME_REMEDY):
        return None
    try:
        try:
            held = torch.load(ckpt, weights_only=False, mmap=True)
        except Exception:  # noqa: BLE001 - not torch's zip format: read again without mmap, for the real reason
            held = torch.load(ckpt, weights_only=False)
        done = held["round"]
        if isinstance(done, bool) or not hasattr(done, "__index__") or int(done) < 0:
            raise ValueError(f"its round is {done!r}, not a round")
        return held
    except Exception as exc:  # EOFError, UnpicklingError, RuntimeError (zip), KeyError, ...
        reason = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        raise damaged(who, f"{ckpt} cannot be read ({reason})", RESUME_REMEDY) from None


# ------------------------------------------------------------------------------------------------
# a run's record is whole: every file of it fedsuite's own, readable and consistent with the others
# ------------------------------------------------------------------------------------------------

#: what ``--resume`` tells the user to do about a damaged record
RESUME_REMEDY = ("the run cannot continue from a damaged record: put the run's own file back (from a copy of "
                 "the run), or start the run anew under another --run-name")

#: what a reader (``fedsuite report``, ``fedsuite.load_run``) tells the user to do about one
READ_REMEDY = "the run's record is damaged: put the run's own file back (from a copy of the run), or leave the run out"


def damaged(who: str | None, problem: str, remedy: str) -> RecordError:
    """The one line of a damaged record: ``who: problem; remedy`` (``who``: the command, if any)."""
    return RecordError(f"{who + ': ' if who else ''}{problem}; {remedy}")


def record_file(path: Path, who: str | None = None, remedy: str = READ_REMEDY, folder: bool = False) -> bool:
    """Whether the record file ``path`` (a folder, with ``folder``: ``client-state/``) is there
    (False: it is not). One that is there but is a symbolic link, a folder where a file belongs (or
    a file where a folder does), not a regular file, or not readable by this user is a
    :class:`~fedsuite.errors.RecordError`: fedsuite writes each of them itself, in place, so none of
    these is the run's own (and a link, or a device such as ``/dev/zero``, is never read)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise damaged(who, f"{path} cannot be read ({exc.strerror})", remedy) from None
    kind = "folder" if folder else "file"
    if stat.S_ISLNK(info.st_mode):
        raise damaged(who, f"{path} is a symbolic link (to {os.readlink(path)}), not the {kind} the run wrote",
                      remedy)
    if folder != stat.S_ISDIR(info.st_mode):
        raise damaged(who, f"{path} is a {'file' if folder else 'folder'}, not a {kind}", remedy)
    if not folder and not stat.S_ISREG(info.st_mode):
        raise damaged(who, f"{path} is not a regular file (a device, a pipe or a socket)", remedy)
    if not os.access(path, os.R_OK | (os.X_OK if folder else 0)):
        raise damaged(who, f"{path} cannot be read (permission denied)", remedy)
    return True


def recorded_summary(run_dir: Path, who: str | None = None, remedy: str = READ_REMEDY) -> dict[str, Any] | None:
    """A run's ``summary.json`` (None without one), checked: UTF-8 JSON, an object with the
    ``status`` the run ended with; else a :class:`~fedsuite.errors.RecordError` naming it.
    (:func:`summary` is the lenient reading of a live run.)"""
    path = run_dir / "summary.json"
    if not record_file(path, who, remedy):
        return None
    try:
        ours = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise damaged(who, f"{path} cannot be read ({exc.strerror})", remedy) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise damaged(who, f"{path} cannot be read as JSON ({exc})", remedy) from None
    if not isinstance(ours, dict):
        raise damaged(who, f"{path} holds {type(ours).__name__}, not a run's summary", remedy)
    if ours.get("status") not in ("completed", "failed"):
        raise damaged(who, f"{path} records no outcome (status {ours.get('status')!r}, not completed or failed)",
                      remedy)
    done = ours.get("rounds_completed")
    if done is not None and (not isinstance(done, int) or isinstance(done, bool) or done < 0):
        raise damaged(who, f"{path} records {done!r} rounds completed, not a count", remedy)
    return ours


def recorded_rows(run_dir: Path, who: str | None = None, remedy: str = READ_REMEDY,
                  torn_tail: bool = False) -> list[dict[str, Any]] | None:
    """A run's ``metrics.jsonl`` rows (None without the file), checked: every line UTF-8 JSON (a
    torn last line, with ``torn_tail``, skipped: :func:`read_metrics`), one row per
    round from round 0, in order; else a :class:`~fedsuite.errors.RecordError` naming it."""
    path = run_dir / "metrics.jsonl"
    if not record_file(path, who, remedy):
        return None
    try:
        rows = read_metrics(run_dir, torn_tail=torn_tail)
    except ResultsError as exc:
        raise damaged(who, str(exc), remedy) from None
    for expected, row in enumerate(rows):
        if row["round"] != expected:
            where = f"starts at round {row['round']}, not round 0" if expected == 0 else \
                f"round {row['round']} follows round {expected - 1}"
            raise damaged(who, f"{path}: {where} (one row per round, from round 0, in order)", remedy)
    return rows


def summary_mismatch(run_dir: Path, summary: dict[str, Any], last: int, against: Path) -> str | None:
    """Why ``summary`` (``summary.json``) does not match the run's last round ``last`` as
    ``against`` holds it, or None if it does. ``summary.json``'s ``rounds_completed`` is the last
    round of the metrics it was made from (0 without rows). Against ``metrics.jsonl`` (``last``:
    its last row's round, -1 without rows) that is the same round. Against ``checkpoint.pt`` (the
    round it holds, 0 without one) a completed run's is the same round (it ends with its
    checkpoint and that row); a failed one's may be a round either side (a failure between a
    checkpoint and its row, or a resume that failed before it rewound its metrics to the
    checkpoint: :func:`check_record` bounds the rows by the checkpoint's round already)."""
    done = summary.get("rounds_completed")
    if done is None:
        return None
    checkpoint = against.name == "checkpoint.pt"
    ok = {last, max(last, 0)}
    if checkpoint and summary["status"] == "failed":
        ok |= {last - 1, last + 1}
    if done in ok:
        return None
    holds = (f"{against} holds round {last}" if checkpoint else
             f"{against} ends at round {last}" if last >= 0 else f"{against} has no row")
    verb = "completed" if summary["status"] == "completed" else "failed after"
    return f"{run_dir / 'summary.json'} says the run {verb} {done} rounds, but {holds}"


def check_record(run_dir: Path, who: str | None = "--resume", finished: bool = False) -> tuple[dict[str, Any], int]:
    """What ``--resume`` checks before anything starts or is written: the run's record is whole.
    Returns its ``config.json`` (:func:`recorded_config`) and the round its checkpoint holds (0
    without one); raises a :class:`~fedsuite.errors.RecordError`, one line naming the file, if any
    file of it is a link, a folder, unreadable, undecodable, or inconsistent with the others:

    * ``config.json`` a run's config (:func:`recorded_config`), ``summary.json`` (if any) a run's
      outcome (:func:`recorded_summary`), ``checkpoint.pt`` (if any) a checkpoint
      (:func:`checkpointed_round`); ``metrics.jsonl`` one row per round from round 0, in order
      (:func:`recorded_rows`), where only a last line without its newline that a kill in the
      middle of an append can have left is no damage (a run without ``summary.json``: the
      resume rewrites the file to end with the checkpoint's row);
    * the metrics hold every round before the checkpoint's (a kill between the checkpoint and its
      row leaves that row out), and at most one after it (a row whose checkpoint never came);
      without a checkpoint, none after round 1; ``summary.json``'s rounds are the checkpoint's;
    * ``client-state/`` (:func:`check_client_state`): every file readable, and each client that
      trained in a committed round (the metrics' cohorts) holds each piece of state the run keeps;
    * every record is the run's own (``fedsuite.records.identity``): the checkpoint's, the summary's and
      each client-state file's identity are those of ``config.json``'s run, and the checkpoint's
      metrics row is ``metrics.jsonl``'s row of its round.

    ``finished``: the run's results are judged (a queue's "done"), not a resume: a run whose
    ``summary.json`` carries no identity (written before identities, as committed records are) may
    lack its checkpoint.
    """
    from fedsuite.records import identity

    recorded = recorded_config(run_dir, who)
    summary = recorded_summary(run_dir, who, RESUME_REMEDY)
    held = read_checkpoint(run_dir, who)
    done = 0 if held is None else int(held["round"])
    legacy_results = finished and held is None and summary is not None and identity.KEY not in summary
    ckpt, metrics = run_dir / "checkpoint.pt", run_dir / "metrics.jsonl"
    rows = recorded_rows(run_dir, who, RESUME_REMEDY, torn_tail=summary is None)
    last = rows[-1]["round"] if rows else -1
    problem = None
    if os.path.lexists(ckpt):
        if rows is None:
            problem = f"{metrics} is missing, but {ckpt} holds round {done}"
        elif not rows and done > 0:
            problem = f"{metrics} has no row, but {ckpt} holds round {done}"
        elif last < done - 1:
            problem = (f"{metrics} ends at round {last}, but {ckpt} holds round {done} (the rows of rounds "
                       f"{last + 1} to {done - 1} are missing)")
        elif last > done + 1:
            problem = f"{metrics} has rows up to round {last}, but {ckpt} holds round {done}"
    elif legacy_results:  # results committed without their checkpoint: the summary is checked against the metrics
        problem = summary_mismatch(run_dir, summary, last, metrics)
    elif last > 1:
        problem = f"{ckpt} is missing, but {metrics} has rows up to round {last}"
    elif summary is not None and summary["status"] == "completed" and summary.get("rounds_completed"):
        problem = (f"{ckpt} is missing, but {run_dir / 'summary.json'} says the run completed "
                   f"{summary['rounds_completed']} rounds")
    if problem is None and summary is not None and not legacy_results:
        problem = summary_mismatch(run_dir, summary, done, ckpt)
    if problem is None and held is not None:
        problem = identity.problem(held.get(identity.KEY), recorded, str(ckpt)) or \
            identity.row_problem(row_json(held.get("metrics_row")), rows or [], done, str(ckpt), str(metrics))
    if problem is None and summary is not None:
        problem = identity.problem(summary.get(identity.KEY), recorded, str(run_dir / "summary.json"))
    if problem is not None:
        raise damaged(who, problem, RESUME_REMEDY)
    digests = [identity.digest(recorded)] if held is None else (held.get(identity.KEY) or {}).get("digests")
    check_client_state(run_dir, rows or [], done, who, digests)
    return recorded, done


def record_problem(run_dir: Path) -> str | None:
    """Why the run in ``run_dir`` would be refused by ``--resume`` (:func:`check_record`, its
    results judged as a queue judges them: ``finished``), or None if its record is whole and its
    own. Remembered while none of the run's files changes."""
    from fedsuite.config import ConfigError

    key = (str(run_dir), _record_signature(run_dir))
    if key not in _PROBLEMS:
        try:
            check_record(run_dir, None, finished=True)
            _PROBLEMS[key] = None
        except ConfigError as exc:  # a RecordError too
            _PROBLEMS[key] = str(exc)
        if len(_PROBLEMS) > 4096:
            _PROBLEMS.pop(next(iter(_PROBLEMS)))
    return _PROBLEMS[key]


_PROBLEMS: dict[tuple[str, tuple], str | None] = {}


def _record_signature(run_dir: Path) -> tuple:
    """What changes when any record file of ``run_dir`` changes: each one's (name, inode, size,
    modification time), client-state files included."""
    out = []
    for path in (run_dir / name for name in ("config.json", "summary.json", "metrics.jsonl", "checkpoint.pt")):
        try:
            info = os.lstat(path)
            out.append((path.name, info.st_ino, info.st_size, info.st_mtime_ns))
        except OSError:
            out.append((path.name,))
    root = run_dir / "client-state"
    if root.is_dir():
        for folder, _, files in os.walk(root):
            for name in sorted(files):
                try:
                    info = os.lstat(os.path.join(folder, name))
                except OSError:
                    continue
                out.append((folder, name, info.st_ino, info.st_size, info.st_mtime_ns))
    return tuple(out)


def check_client_state(run_dir: Path, rows: list[dict[str, Any]], done: int, who: str | None = "--resume",
                       digests: list[str] | None = None) -> None:
    """``<run>/client-state`` (``fedsuite.method.state``: ``client-<id>/<name>.r<round>.<pt|json>``) is
    whole for a resume from round ``done`` (``rows``: the run's metrics): a real folder of real
    folders and files, each file readable (a ``.pt`` torch's zip, a ``.json`` JSON), and each
    client that trained in a round up to ``done`` (in a row's ``cohort``, not ``dropped``) holds
    a version of a round up to ``done`` of every name the run's clients keep (after round t is
    checkpointed a client keeps its newest such version: ``fedsuite.method.state.prune_committed``). A
    client without one would start afresh, and the resumed run would differ from the run never
    interrupted. A run whose clients keep no state has no such folder, and a SuperNode's state
    lives on the SuperNode (its ``state-dir``), not here. Each file of a round up to ``done`` is
    the run's own: its identity is one of ``digests`` (the checkpoint's; None: a legacy checkpoint,
    ``fedsuite.records.identity``)."""
    from fedsuite.method.state import VERSIONED

    root = run_dir / "client-state"
    if not record_file(root, who, RESUME_REMEDY, folder=True):
        return
    held: dict[int, set[tuple[str, str]]] = {}  # partition id -> names with a version of a round <= done
    names: set[tuple[str, str]] = set()
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        pid = entry.name[len("client-"):]
        if not (entry.name.startswith("client-") and pid.isdigit()):
            continue
        folder = root / entry.name
        record_file(folder, who, RESUME_REMEDY, folder=True)
        mine = held.setdefault(int(pid), set())
        for item in sorted(os.scandir(folder), key=lambda e: e.name):
            version = VERSIONED.match(item.name)
            if version is None:  # a write a kill cut short (.<name>.tmp<pid>), or not fedsuite's
                continue
            path = folder / item.name
            record_file(path, who, RESUME_REMEDY)
            readable_state(path, version["ext"], who, digests if int(version["round"]) <= done else None)
            if int(version["round"]) <= done:
                mine.add((version["name"], version["ext"]))
                names.add((version["name"], version["ext"]))
    if not names:
        return
    for row in rows:
        if not 1 <= row["round"] <= done:
            continue
        left_out = {str(pid) for pid in row.get("dropped") or []} | set(row.get("failure_reasons") or {})
        for pid in row.get("cohort") or []:
            if str(pid) in left_out or not isinstance(pid, int):
                continue
            lacking = sorted(name for name, ext in names - held.get(pid, set()))
            if lacking:
                folder = root / f"client-{pid}"
                what = f"holds no {lacking[0]!r} state of round {done} or earlier" if pid in held else "is missing"
                raise damaged(who, f"{folder} {what}, but {run_dir / 'metrics.jsonl'} has client {pid} training in "
                              f"round {row['round']} (it would start afresh, and the resumed run would differ from "
                              "the run never interrupted)", RESUME_REMEDY)


def readable_state(path: Path, ext: str, who: str | None, digests: list[str] | None = None) -> None:
    """A client-state file is what ``fedsuite.method.state`` writes: a ``.pt`` torch's zip format (read
    memory-mapped: its arrays are not read from disk, a resume of a large run must not load every
    client's state), a ``.json`` a JSON object; and, with ``digests``, the run's own
    (``fedsuite.records.identity.state_problem``)."""
    import torch

    from fedsuite.records import identity
    from fedsuite.method.state import STATE_KEY

    try:
        if ext == "pt":
            with zipfile.ZipFile(path) as archive:
                if not archive.namelist():
                    raise ValueError("an empty archive")
            held = torch.load(path, weights_only=True, mmap=True) if digests is not None else {}
        else:
            held = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(held, dict):
            raise ValueError("not a JSON object" if ext == "json" else "not a dict of arrays")
    except Exception as exc:  # OSError, ValueError, zipfile.BadZipFile, EOFError, torch's UnpicklingError
        reason = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        raise damaged(who, f"{path} cannot be read ({exc.__class__.__name__}: {reason})", RESUME_REMEDY) from None
    problem = identity.state_problem(held.get(STATE_KEY), digests, str(path))
    if problem is not None:
        raise damaged(who, problem, RESUME_REMEDY)


def create_run_dir(run_dir: Path, config: dict[str, Any]) -> bool:
    """Create the folder ``run_dir`` holding its ``config.json`` (``config``) in one step, so that
    no kill can leave a run folder without its config: the folder is made beside it under a hidden
    name (``.fedsuite-new-<random>``), the config written into it, and the folder renamed into
    place (a kill before the rename leaves only that hidden folder, which no reader takes for a
    run). Returns False, having written nothing, if ``run_dir`` exists already (its missing
    parents are made)."""
    if os.path.lexists(run_dir):
        return False
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = run_dir.parent / f".fedsuite-new-{os.urandom(6).hex()}"
    tmp.mkdir()
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if os.path.lexists(run_dir):
            raise FileExistsError(run_dir)
        os.rename(tmp, run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.lexists(run_dir):
            return False
        raise
    return True


def record_config(run_dir: Path, config: dict[str, Any]) -> None:
    """Put ``config.json`` into the existing ``run_dir`` if it has none: a folder a start-up left
    before its config existed (:func:`start_debris`, cleared first by the caller), or one made
    by hand; written atomically (whole, or not at all)."""
    if os.path.lexists(run_dir / "config.json"):
        return
    tmp = run_dir / f".config.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, run_dir / "config.json")


#: what a fedsuite before run identities wrote into a run directory before the ServerApp recorded the
#: run's ``config.json`` (a start-up window of about 2-3.5 s on 2 cores); the folder is now created
#: with its config (:func:`create_run_dir`), and such debris is cleared by a fresh start
START_FILES = frozenset({"app", ".flwr", "flower.log", "reaper.log", "ray-logs", "error.txt"})


def start_debris(run_dir: Path) -> bool:
    """Whether ``run_dir`` is what a run killed in its start-up window left: a folder without
    ``config.json`` that holds only :data:`START_FILES` (or nothing). Such a folder records no run,
    so a fresh start and ``--resume`` of the same name both start the run anew in it. A folder
    holding anything else is not ours to remove."""
    if not run_dir.is_dir() or (run_dir / "config.json").exists():
        return False
    return all(entry.name in START_FILES for entry in run_dir.iterdir())


def clear_start_debris(run_dir: Path) -> None:
    """Empty a start-up's debris (:func:`start_debris`) out of ``run_dir``, which the caller holds
    (:func:`claimed`: no run is starting in it now)."""
    for entry in run_dir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


#: how long a start waits for the processes of an earlier, killed attempt of its run to end (the
#: dead launcher's watcher and PDEATHSIG stop them; a Ray agent may outlive its raylet by seconds)
REMNANT_WAIT_S = 20.0


@contextmanager
def claimed(run_dir: Path, wait_s: float = REMNANT_WAIT_S, exclude: tuple[int, ...] = ()) -> Iterator[None]:
    """Hold the existing folder ``run_dir`` for this process while it runs or continues the run in
    it: an exclusive ``flock`` on the folder itself, which the kernel drops when the process ends,
    also on SIGKILL (no file is added to the folder; child processes do not inherit it). A second
    fedsuite process on the same run (``--resume`` while the run goes on, two queues of one target)
    is refused with :class:`RunDirError` before anything in the folder is touched. Processes of an
    earlier attempt whose launcher was killed (:func:`remnants`) are waited for, up to ``wait_s``
    seconds, then refused the same way; ``exclude``: this attempt's own processes (its simulation
    process, started before the run was named, works wherever the CLI does)."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if not _lock_now(fd):
            raise RunDirError(f"{run_dir} is in use by another fedsuite process (its run is going on); "
                              "wait for it or stop it first")
        deadline = time.monotonic() + wait_s
        while left := remnants(run_dir, exclude):
            if time.monotonic() >= deadline:
                raise RunDirError(f"processes of an earlier attempt of {run_dir} are still running "
                                  f"({describe(left[0])}); stop them first")
            time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def held_elsewhere(run_dir: Path) -> bool:
    """Whether ``run_dir`` is held (:func:`claimed`) at this moment, by another process or by another
    claim of this one: a run of it is going on there (a second queue of the same target, a
    ``--resume`` in another terminal)."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # no folder (yet): nobody holds it
        return False
    try:
        return not _lock_now(fd)
    finally:
        os.close(fd)  # closing drops a lock this call took


def _lock_now(fd: int) -> bool:
    """Take the exclusive ``flock`` of the folder open as ``fd`` if no one holds it; whether it did."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def remnants(run_dir: Path, exclude: tuple[int, ...] = ()) -> list[psutil.Process]:
    """Live processes of an earlier attempt of the run in ``run_dir``: its private Ray's (they carry
    its ``FLWR_HOME``) and its simulation process; this process and ``exclude`` left out."""
    return marked("FLWR_HOME", str(run_dir / ".flwr"), exclude=(os.getpid(), *exclude), simulation_in=str(run_dir))


def describe(proc: psutil.Process) -> str:
    """``process PID: its command line``, as far as it can still be read."""
    try:
        return f"process {proc.pid}: {' '.join(proc.cmdline())[:120]}"
    except psutil.Error:
        return f"process {proc.pid}"

