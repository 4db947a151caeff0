"""What a grid sweep (:mod:`fedsuite.queues.sweep`) and a search (:mod:`fedsuite.queues.search`)
share: their one-line user error (:class:`SweepError`), a setting as text (:func:`toml_value` for a
run's ``--set``, :func:`setting_text` and :func:`setting_label` for people), the config keys they
set themselves (:func:`refuse_folder_keys`), and the folder each works in: where it is
(:func:`study_folder`), which of the two it holds (:func:`study_in`: one folder holds one grid or
one search, since both write the same ``report.md``), and the hold on it while one runs
(:class:`FolderLock`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

from fedsuite.queues.reproduce.queue import ReproduceError


class SweepError(ReproduceError):
    """A user error in a sweep or a search (a bad grid or space, a setting that does not validate, a
    folder in use); missing data is the queue's :class:`ReproduceError`, its base."""


def split_values(text: str) -> list[str]:
    """``"0.01,0.05"`` -> ``["0.01", "0.05"]``, splitting on commas outside brackets, braces and
    quotes (so ``dataset_options={a=1,b=2},{a=3}`` is two values)."""
    parts, depth, quote, current = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += ch
    parts.append(current.strip())
    return parts


def toml_value(value: Any) -> str:
    """A grid value as ``--set`` text (TOML), for the run's command line; a table (``{alpha = 1}``,
    a section or ``dataset_options`` given whole) as an inline table, keys quoted."""
    import tomli_w

    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


#: the config keys a queue sets for each of its runs itself (its folder): a grid, a search space or a
#: base ``--set`` that names one would be overridden without a word
FOLDER_KEYS = ("output_dir", "run_name")


def refuse_folder_keys(keys: Sequence[str], option: str) -> None:
    """:class:`SweepError` (one line) for the first of ``keys`` (dotted) that is one of
    :data:`FOLDER_KEYS`, which a sweep or search sets for every run (``<output-dir>/<name>/...``)."""
    for key in keys:
        if key.split(".", 1)[0] in FOLDER_KEYS:
            raise SweepError(f"{option} {key}: a sweep or search puts each run in its own folder "
                             "(<output-dir>/<name>/...); choose where with --output-dir and --name")


def study_folder(output_dir: Path, name: str) -> Path:
    """A sweep's or search's folder, ``output_dir/name`` resolved, where ``name`` is a plain folder
    name and ``output_dir`` can be followed (``fedsuite.records.paths``, the check of ``simulate``'s
    ``run_name`` and ``output_dir``); else :class:`SweepError`, one line."""
    from fedsuite.records.paths import name_problem, path_problem

    problem = name_problem(name)
    if problem is not None:
        raise SweepError(f"--name {problem}")
    problem = path_problem(output_dir / name)
    if problem is not None:
        raise SweepError(f"--output-dir: {problem}")
    return (output_dir / name).expanduser().resolve()


def setting_text(value: Any) -> str:
    """A grid value as people read it: a string as it is, anything else as TOML."""
    return value if isinstance(value, str) else toml_value(value)


def setting_label(setting: dict[str, Any]) -> str:
    return " ".join(f"{k}={setting_text(v)}" for k, v in setting.items())


def study_in(folder: Path) -> str | None:
    """What a sweep's folder holds: ``search`` (a search's ``trials/``, ``trials.csv`` or Tune's
    ``tune/``), ``grid`` (a grid's ``report.csv`` or ``base.toml``, or a setting folder holding a
    run ``s<seed>`` or its log), or None (nothing of either). A grid and a search write the same
    ``report.md`` and ``accuracy.png``, so one folder holds one of them: each refuses the other's."""
    if not folder.is_dir():
        return None
    trials = folder / "trials"
    if (trials.is_dir() and any(trials.iterdir())) or (folder / "trials.csv").exists() or (folder / "tune").exists():
        return "search"
    if (folder / "report.csv").exists() or (folder / "base.toml").exists():
        return "grid"
    for entry in folder.iterdir():
        if entry.is_dir() and entry.name not in ("trials", "tune") and any(
                re.fullmatch(r"s\d+(\.log)?", run.name) for run in entry.iterdir()):
            return "grid"
    return None


def lock_holder(folder: Path) -> int | None:
    """The PID of the process holding an ``flock`` on ``folder`` (Linux's ``/proc/locks``), or None
    where it cannot be told."""
    try:
        inode = os.stat(folder).st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:  # "3: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; a waiter's has "->" after the number
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4].isdigit() and fields[5].endswith(f":{inode}"):
            return int(fields[4])
    return None


class FolderLock:
    """A sweep's (or a search's) hold on its folder while it works in it: an exclusive ``flock`` on
    the folder itself, as ``fedsuite.records.hold.claimed`` holds a run's folder. No file is added; the
    kernel drops it when the process ends, also on SIGKILL, so no stale lock ever blocks; the
    processes the sweep starts do not inherit it. A second command that would work in the same
    folder at once (two identical sweeps: both would start the same runs, each refused by the
    other's) is refused in one line naming the holder's PID and what to do (``remedy``). A command
    that only reads the runs (``--report``) takes no lock. Without ``flock`` (a file system that has
    none) there is no lock, as before."""

    def __init__(self, folder: Path, remedy: str) -> None:
        self.folder, self.remedy, self.fd = folder, remedy, None

    def take(self) -> None:
        """Hold the folder if it exists and is not held yet; :class:`SweepError` if another process does."""
        if self.fd is not None or not self.folder.is_dir():
            return
        fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)  # not inherited (O_CLOEXEC, PEP 446)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = lock_holder(self.folder)
            raise SweepError(f"{self.folder} is in use by another fedsuite sweep"
                             f"{'' if pid is None else f' (PID {pid})'}: {self.remedy}") from None
        except OSError:
            os.close(fd)
            return
        self.fd = fd

    def __enter__(self) -> "FolderLock":
        return self

    def __exit__(self, *_: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
