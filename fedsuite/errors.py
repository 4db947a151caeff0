"""fedsuite's exceptions, in one light module (no imports: ``import fedsuite`` exports them at no cost).

Every exception fedsuite raises on purpose is a :class:`FedsuiteError` whose message is one line,
ready to print: the CLI prints it after ``error:`` and exits 2 (bad input) or 1 (a run that did not
complete); the Python API (``fedsuite.simulate``, ``fedsuite.load_run``) raises it as it is::

    FedsuiteError
    ├── ConfigError    bad settings: an unknown key, a value out of range, hardware that is not there,
    │                  a run folder that exists or cannot be written (``fedsuite.config``)
    ├── DataError      the run's data is missing or cannot be partitioned as configured (``fedsuite.engine.runtime``)
    ├── RunDirError    a run folder is in use by another fedsuite process (``fedsuite.records.hold``)
    ├── ResultsError   a run folder's files cannot be read back (``fedsuite.records.results``)
    │   └── RecordError    ... because they are damaged: a record file that is a link, a folder,
    │                      unreadable, undecodable or inconsistent with the others (``fedsuite.records.integrity``);
    │                      a ConfigError too, so ``--resume`` refuses it as bad input (exit 2)
    ├── RunFailed      a run started but did not complete; ``run_dir`` and ``run`` say what it left
    ├── CertError      credentials that cannot be made, read, or do not belong together (``fedsuite.deploy.certs``)
    └── ReproduceError a queue's bad input: a target, a grid, a sweep's folder (``fedsuite.queues.reproduce.queue``)

:class:`RunInterrupted` is not one of them: it is a :class:`KeyboardInterrupt` (Ctrl-C, a notebook's
stop button) that says how to continue the run, so ``except Exception`` never swallows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class FedsuiteError(Exception):
    """Something fedsuite refuses or could not do; the message is one line, ready to print."""


class ConfigError(FedsuiteError, ValueError):
    """A user error in the configuration (message is one line, ready to print)."""


class DataError(FedsuiteError):
    """The run's data is missing or cannot be partitioned as configured (a user error, exit 2)."""


class RunDirError(FedsuiteError, RuntimeError):
    """A run directory cannot be used as asked (another process holds it: ``fedsuite.records.hold.claimed``)."""


class ResultsError(FedsuiteError, ValueError):
    """A run directory's files cannot be read; the message is one line naming the file."""


class RecordError(ConfigError, ResultsError):
    """A run's record is damaged: one of its files (``config.json``, ``metrics.jsonl``,
    ``checkpoint.pt``, ``summary.json``, a client-state file) is a link, a folder, unreadable, not
    decodable or inconsistent with the others (``fedsuite.records.integrity.check_record``). The message is one
    line naming the file, what is wrong with it and what the user can do. Both a
    :class:`ConfigError` (``--resume`` refuses it before anything starts, exit 2) and a
    :class:`ResultsError` (what the readers, ``fedsuite report`` and ``fedsuite.load_run``, raise)."""


class RunFailed(FedsuiteError, RuntimeError):
    """A run started but did not complete (failed client replies, an error in the ServerApp, the stall
    watchdog, the simulation process dying). ``run_dir``: its folder (None if none was made);
    ``run``: the run as far as it got (a ``fedsuite.Run`` whose ``status`` is ``failed`` or
    ``partial``), set by the Python API when the run recorded its config."""

    def __init__(self, message: str, run_dir: Path | None = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir
        self.run: Any = None


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a notebook's stop) stopped a run and every process it started. The message says what
    the run kept and how to continue it; ``run_dir`` is its folder (None if the config was not built
    yet). A :class:`KeyboardInterrupt`, so whatever stops on Ctrl-C stops on this too."""

    def __init__(self, message: str, run_dir: Path | None = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir
