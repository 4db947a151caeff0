"""A run's record is whole: every file of it fedsuite's own, readable and consistent with the others.

What ``--resume`` checks before anything starts or is written, and what a queue checks before it
counts a run done (:func:`check_record`, :func:`record_problem`): no file of the run a link, a
folder, unreadable, undecodable or inconsistent with the others, and every one of them the run's own
(``fedsuite.records.identity``). The readers check what they read: ``config.json``
(:func:`recorded_config`), ``summary.json`` (:func:`recorded_summary`), ``metrics.jsonl``
(:func:`recorded_rows`), ``checkpoint.pt`` (:func:`checkpointed_round`, :func:`read_checkpoint`)
and ``client-state/`` (:func:`check_client_state`). A damage is one line naming the file
(:func:`damaged`, a :class:`~fedsuite.errors.RecordError`), ending with what to do about it
(:data:`RESUME_REMEDY`, :data:`READ_REMEDY`). A run directory's state (``fedsuite.records.rundir.state``:
``damaged``) and ``fedsuite report`` (``fedsuite.records.results``) read a record through these.
"""

from __future__ import annotations

import json
import os
import stat
import zipfile
from pathlib import Path
from typing import Any

from fedsuite.errors import RecordError, ResultsError
from fedsuite.records.rows import read_metrics, row_json


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


def recorded_summary(run_dir: Path, who: str | None = None, remedy: str = READ_REMEDY) -> dict[str, Any] | None:
    """A run's ``summary.json`` (None without one), checked: UTF-8 JSON, an object with the
    ``status`` the run ended with; else a :class:`~fedsuite.errors.RecordError` naming it.
    (:func:`fedsuite.records.rundir.summary` is the lenient reading of a live run.)"""
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
    torn last line, with ``torn_tail``, skipped: :func:`~fedsuite.records.rows.read_metrics`), one row per
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
