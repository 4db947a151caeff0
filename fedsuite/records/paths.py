"""The one check of the folders, files and names fedsuite is given, for every command and the Python API.

Each function says why a path or name cannot be used, as text (None when it can), or raises
:class:`~fedsuite.errors.ConfigError` with that text after the field's name; callers put the field
first (``--output-dir: ...``, ``run_name: ...``), so every refusal is one line naming what was given:

* :func:`name_problem`: a folder name to be made inside a parent (``run_name``, ``sweep --name``):
  not empty, not ``.`` or ``..``, no ``/`` or ``\\``, printable, at most :data:`NAME_MAX` bytes;
* :func:`path_problem`: a path that cannot be followed (a symlink loop, a file where a folder is
  on the way) or is longer than the system allows (:data:`RUN_DIR_MAX`, :data:`NAME_MAX`);
* :func:`folder_problem`: a folder that nothing can be written under (the above, a nearest existing
  parent that is a file, not writable, not a real folder as ``/proc``, or a full file system);
* :func:`input_problem`: a file or folder to be read that is missing, of the other kind, unreadable
  or cannot be followed;
* :func:`as_path`: a value given as a path (Python API) that is not one (``config=123``).

Light: the standard library and ``fedsuite.errors`` only (``fedsuite.config``, ``fedsuite.deploy.certs``
and every command, queue and API function given a path import it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fedsuite.errors import ConfigError

#: the longest file or folder name, in bytes, of Linux's file systems (and macOS's)
NAME_MAX = 255
#: the longest run folder path, in bytes: Linux's PATH_MAX (4096) less room for the files a run
#: writes inside it (client-state/client-00099/...)
RUN_DIR_MAX = 4096 - 512
#: the least free space a folder's file system must have for fedsuite to write a run or a report there
MIN_FREE_BYTES = 64 * 2**20


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a folder made inside its parent folder, or None."""
    if not isinstance(name, str):
        return f"expected a folder name (text), got {type(name).__name__} {name!r}"
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        return f"must be a plain folder name inside its parent folder (no '/', '..'), got {name!r}"
    if not name.isprintable():
        return f"must be printable text (no newline, tab or other control character), got {name!r}"
    if len(name.encode()) > NAME_MAX:
        return f"is {len(name.encode())} bytes long; a folder name has at most {NAME_MAX}"
    return None


def unresolvable(path: str | Path) -> str | None:
    """Why ``path`` cannot be followed to a place (a symlink loop, a name that is not a folder on
    the way), or None. Python raises RuntimeError (3.11, 3.12) or OSError (3.13) for a loop."""
    try:
        Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as exc:
        return f"{path} cannot be followed ({exc})"
    return None


def path_length_problem(path: str | Path) -> str | None:
    """Why ``path`` (``~`` expanded, made absolute) is too long to be a run folder, or cannot be
    followed (:func:`unresolvable`), or None."""
    full = os.fsencode(os.path.abspath(os.path.expanduser(path)))
    if len(full) > RUN_DIR_MAX:
        return f"the path is {len(full)} bytes long; at most {RUN_DIR_MAX} leave room for a run's files"
    long = next((part for part in full.split(b"/") if len(part) > NAME_MAX), None)
    if long is not None:
        return (f"a name in it is {len(long)} bytes long ({long[:24].decode(errors='replace')}...); a name has at "
                f"most {NAME_MAX}")
    return unresolvable(path)


#: the one check of a path's form, by the name its callers use for it
path_problem = path_length_problem


def resolved(path: str | Path, field: str) -> Path:
    """``path`` with ``~`` expanded, made absolute and its links followed; :class:`ConfigError`
    ``"<field>: <why>"`` for one :func:`path_problem` refuses (where ``Path.resolve`` would raise)."""
    problem = path_problem(path)
    if problem is not None:
        raise ConfigError(f"{field}: {problem}")
    return Path(path).expanduser().resolve()


def folder_problem(folder: str | Path) -> str | None:
    """Why nothing can be written under ``folder`` (None if it can): a path past the system's
    length limits or that cannot be followed (:func:`path_problem`), a nearest existing parent that
    is a file, not writable, not a real folder (``/proc``, ``/sys``: a probe folder is made and
    removed to find out), or on a file system with less than :data:`MIN_FREE_BYTES` free."""
    folder = Path(os.path.abspath(os.path.expanduser(folder)))
    too_long = path_problem(folder)
    if too_long is not None:
        return too_long
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder, so {folder} cannot be created"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable, so nothing can be written under {folder}"
    try:
        shutil.rmtree(tempfile.mkdtemp(prefix=".fedsuite-probe-", dir=existing))
    except OSError as exc:
        return f"a folder cannot be created in {existing} ({exc.strerror})"
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        return (f"the file system of {existing} has {free / 2**20:.1f} MiB free; a run needs at least "
                f"{MIN_FREE_BYTES / 2**20:.0f} MiB")
    return None


def file_target_problem(path: str | Path) -> str | None:
    """Why a file cannot be written at ``path``, or None: its folder's :func:`folder_problem`, or a
    folder (or other non-file) where the file is to be."""
    path = Path(os.path.abspath(os.path.expanduser(path)))
    problem = folder_problem(path.parent)
    if problem is not None:
        return problem
    if os.path.lexists(path) and not path.is_file():
        return f"{path} is a folder (or another non-file), not a file that can be written"
    return None


def input_problem(path: str | Path, kind: str = "file") -> str | None:
    """Why ``path``, a ``kind`` (``file`` or ``folder``) to be read, cannot be, or None: it cannot
    be followed, is missing, is the other kind, or cannot be read (a folder: listed)."""
    problem = path_problem(path)
    if problem is not None:
        return problem
    path = Path(path).expanduser()
    if not path.exists():
        return f"{path} is not a folder (it does not exist)" if kind == "folder" else f"{path} does not exist"
    if kind == "folder" and not path.is_dir():
        return f"{path} is a file, not a folder"
    if kind == "file" and not path.is_file():
        return f"{path} is a folder (or another non-file), not a file"
    try:
        if kind == "folder":
            next(os.scandir(path), None)
        else:
            with open(path, "rb") as fh:
                fh.read(1)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    return None


def as_path(value: Any, field: str, optional: bool = False) -> Path | None:
    """``value`` (a ``str`` or ``os.PathLike``, ``~`` expanded) as a :class:`~pathlib.Path`; None for
    None where ``optional``; anything else (``config=123``, ``True``, ``b"x"``) a :class:`ConfigError`
    naming ``field``, where ``Path`` would raise a bare ``TypeError``."""
    if value is None and optional:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{field}: expected a path (a non-empty str or os.PathLike), got "
                          f"{type(value).__name__} {value!r}")
    return Path(value).expanduser()
