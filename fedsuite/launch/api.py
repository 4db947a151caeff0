"""fedsuite from Python (a notebook, a script): run a simulation, read runs back as pandas tables.

``fedsuite.simulate(...)`` runs one simulation exactly as ``fedsuite simulate`` does (the same code:
``fedsuite.launch.runner``) and returns a :class:`Run`; ``fedsuite.load_run(path)`` and
``fedsuite.load_runs(folder)`` read finished runs back (through ``fedsuite.records.results``) into the same
:class:`Run` objects. docs/python-api.md is the guide, with a worked example that
tests/test_api.py runs.

The package exports these names lazily (``fedsuite/__init__.py``): ``import fedsuite`` imports
neither torch nor Flower, Ray or pandas; this module imports them only when a function is called.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from fedsuite.errors import ConfigError, FedsuiteError, ResultsError, RunFailed, RunInterrupted
from fedsuite.records.paths import as_path, input_problem

if TYPE_CHECKING:
    import pandas as pd

#: :func:`simulate`'s own keywords; every other keyword is a config key (tests/test_api.py checks
#: that no config field has one of these names)
OWN_KEYWORDS = ("config", "resume", "progress")


def simulate(*, config: str | os.PathLike | None = None, resume: bool = False, progress: bool = True,
             **settings: Any) -> Run:
    """Run one federated simulation, as ``fedsuite simulate`` does, and return it as a :class:`Run`.

    ``settings``: config keys, as in a TOML config file: every field (``strategy="fedmr"``,
    ``dataset="fmnist"``, ``rounds=50``, ``output_dir``, ``run_name``, ...) and the sections of the
    methods and plug-ins, either as a dict (``fedprox={"mu": 0.1}``, which sets the keys it holds
    and keeps the others' values) or as dotted keys (``**{"fedprox.mu": 0.1}``). A path may be a
    ``Path``. ``config``: a TOML file underneath them (``--config``); ``resume``: continue the
    interrupted or shorter run named by ``output_dir`` and ``run_name`` (``--resume``: its recorded
    config is the base, so nothing else is needed); ``progress``: print what runs, the method's
    warnings, a progress bar and the final accuracy (``False``: print nothing).

    Raises, with the CLI's one-line messages (``fedsuite.errors``): :class:`~fedsuite.ConfigError`
    for bad settings (an unknown key, a value out of range, a run folder that exists) and
    :class:`~fedsuite.DataError` for missing data, before anything is written;
    :class:`~fedsuite.RunFailed` when the run started but did not complete (its ``run`` attribute
    holds what it recorded, ``status`` ``failed`` or ``partial``); :class:`~fedsuite.RunInterrupted`,
    a ``KeyboardInterrupt``, on Ctrl-C or a notebook's stop, once every process of the run has
    stopped, saying how to continue it. A returned run has completed: ``run.status == "completed"``.
    """
    from fedsuite.cli.support import plain_console
    from fedsuite.launch.runner import PYTHON, run_simulation

    try:
        path = as_path(config, "config", optional=True)  # config=123: a ConfigError, not a bare TypeError
        for name, flag in (("resume", resume), ("progress", progress)):
            if not isinstance(flag, bool):
                raise ConfigError(f"{name}: expected True or False, got {type(flag).__name__} {flag!r}")
    except ConfigError as exc:
        raise exc.with_traceback(None) from None
    values = {key: _plain(value) for key, value in settings.items()}
    try:
        outcome = run_simulation(path, [], values, resume=resume, console=plain_console() if progress else None,
                                 spelling=PYTHON)
    except RunFailed as exc:
        if exc.run_dir is not None and (exc.run_dir / "config.json").is_file():
            try:
                exc.run = load_run(exc.run_dir)
            except ResultsError:  # files the failure left unreadable: the message and the logs remain
                pass
        raise exc.with_traceback(None) from None  # the message says it all: no frames of fedsuite's inside
    except (FedsuiteError, RunInterrupted) as exc:
        raise exc.with_traceback(None) from None
    return load_run(outcome.run_dir)


def _plain(value: Any) -> Any:
    """``value`` with every path (``os.PathLike``) as its string, as a config file would hold it."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass(eq=False, repr=False)
class Run:
    """One run directory, read back.

    ``dir``: the folder; ``config``: the resolved config (its ``config.json``: every field, and the
    sections of the method and plug-ins the run uses); ``metrics``: ``metrics.jsonl`` as a DataFrame,
    one row per round, round 0 being the initial model's evaluation (columns as the file's:
    ``round``, ``test_accuracy``, ``test_loss``, ``train_loss``, ``wall_seconds``, ``bytes_sent``,
    ..., and the method's own; round 0 has only the evaluation's); ``summary``: ``summary.json``
    ({} for a run that did not end); ``clients``: ``clients.jsonl`` as a DataFrame, one row per
    client and round (:attr:`clients`); ``status``: ``completed``, ``failed`` (it ended without
    completing) or ``partial`` (stopped before it ended: interrupted or killed;
    ``fedsuite.simulate(resume=True, output_dir=..., run_name=...)`` continues it); ``error``: why it
    failed, when it says (``summary.json``'s failure, else ``error.txt``'s last line).
    """

    dir: Path
    config: dict[str, Any]
    metrics: pd.DataFrame
    summary: dict[str, Any]
    status: str
    error: str | None = None

    @property
    def settings(self) -> dict[str, Any]:
        """The config as dotted keys (``fedprox.mu``), as ``--set`` and ``load_runs``'s columns name them."""
        from fedsuite.config import flat_config

        return flat_config(self.config)

    @property
    def clients(self) -> pd.DataFrame:
        """``clients.jsonl`` as a DataFrame: one row per client and round it took part in (sampled,
        or evaluated under ``federated_eval = "all"``), columns ``fedsuite.method.client_records.CLIENT_FIELDS``
        (``round``, ``partition_id``, ``sampled``, ``num_examples``, ``num_steps``, ``train_loss``,
        ``train_seconds``, ``bytes_sent``, ``bytes_received``, ``failure``, and the client's own
        evaluation: ``eval_examples``, ``eval_accuracy``, ``eval_loss``, ``personal_accuracy``,
        ``personal_loss``, ``eval_failure``); read from the folder at each access (a run made before
        fedsuite recorded it has none: an empty frame with those columns)."""
        import pandas as pd

        from fedsuite.method.client_records import CLIENT_FIELDS
        from fedsuite.records.rows import read_clients

        try:
            rows = read_clients(self.dir, torn_tail=self.status == "partial")
        except ResultsError as exc:
            raise exc.with_traceback(None) from None
        return pd.DataFrame(rows, columns=list(CLIENT_FIELDS))

    @property
    def rounds_done(self) -> int:
        """The last round in ``metrics``."""
        return int(self.metrics["round"].max()) if len(self.metrics) else 0

    def __repr__(self) -> str:
        c = self.config
        acc = self.summary.get("final_accuracy")
        reading = f", final accuracy {100 * acc:.2f}%" if isinstance(acc, (int, float)) else ""
        return (f"<Run {c.get('strategy')} on {c.get('dataset')}, seed {c.get('seed')}: {self.status}, "
                f"{self.rounds_done}/{c.get('rounds')} rounds{reading}, {self.dir}>")


def load_run(path: str | os.PathLike) -> Run:
    """The run in the folder ``path`` (one that holds ``config.json``), as a :class:`Run`, whatever its
    status. A folder that is not a run, or whose files cannot be read, is a :class:`~fedsuite.ResultsError`
    (a :class:`~fedsuite.RecordError` for a damaged file: ``fedsuite.records.results.load_run``)."""
    from fedsuite.records import rundir
    from fedsuite.records.results import load_run as read_run

    run_dir = _folder(path, "path")
    try:
        loaded = read_run(run_dir)
    except ResultsError as exc:
        raise exc.with_traceback(None) from None
    status = rundir.state(run_dir)  # a folder with config.json: completed, failed or partial
    recorded = rundir.summary_status(run_dir)
    reason = recorded[1] if recorded is not None else rundir.last_line(run_dir / "error.txt")
    return Run(run_dir, loaded["config"], metrics_frame(loaded["rows"]), loaded["summary"], status,
               None if status == "completed" else reason or None)


def _folder(value: Any, field: str) -> Path:
    """``value``, a folder to read runs from, as an absolute path; :class:`~fedsuite.ResultsError`
    (one line, ``fedsuite.records.paths``' check) for a value that is not a path, or a folder that is
    missing, a file, a loop or unreadable."""
    try:
        path = as_path(value, field)
    except ConfigError as exc:
        raise ResultsError(str(exc)) from None
    problem = input_problem(path, "folder")
    if problem is not None:
        raise ResultsError(f"{field}: {problem}")
    return path.absolute()


def metrics_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """``metrics.jsonl``'s rows (``fedsuite.records.rows.read_metrics``) as a DataFrame, ``round`` first. A
    column whose recorded values are all integers (``round``, ``bytes_sent``, ``failed``, a method's
    counts) stays integer: ``int64``, or pandas' nullable ``Int64`` where some rows lack it (round 0
    has only the evaluation's), not the floats a missing value would make of it."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame({"round": pd.Series(dtype="int64")})
    for column in frame.columns:
        values = [row.get(column) for row in rows]
        present = [v for v in values if v is not None]
        if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
            frame[column] = pd.array(values, dtype="int64" if len(present) == len(values) else "Int64")
    return frame[["round", *(c for c in frame.columns if c != "round")]]


def load_runs(folder: str | os.PathLike) -> Runs:
    """Every run under ``folder`` (a sweep's folder, a reproduce output, any folder of runs, at any
    depth; ``folder`` itself if it is a run), in path order, as :class:`Runs`. A folder without a run
    is a :class:`~fedsuite.ResultsError`, and so is any run that cannot be read."""
    from fedsuite.records.results import run_dirs

    root = _folder(folder, "folder")
    found = run_dirs(root)
    if not found:
        raise ResultsError(f"no fedsuite runs under {root} (a run's folder holds config.json)")
    return Runs(root, [load_run(d) for d in found])


class Runs(list):
    """The runs of a folder (:func:`load_runs`): a list of :class:`Run`, and their metrics as one table.

    ``folder``: where they were found. ``keys``: the columns that tell their settings apart:
    ``strategy``, then every config key whose value differs between the runs (a sweep's grid keys,
    as dotted keys: ``lr``, ``fedprox.mu``), the seed left out (``seed`` is a column of its own).
    """

    def __init__(self, folder: Path, runs: Iterable[Run]) -> None:
        super().__init__(runs)
        self.folder = folder

    @property
    def keys(self) -> list[str]:
        from fedsuite.records.results import setting, varying_keys

        return ["strategy", *(k for k in varying_keys(setting(run.config) for run in self) if k != "strategy")]

    @property
    def metrics(self) -> pd.DataFrame:
        """Every run's metrics, one row per run and round, after columns that name the run: ``run``
        (its folder, relative to ``folder``), ``status``, :attr:`keys` and ``seed``; a key a run does
        not have (another method's section) is empty. Ready for ``groupby([*runs.keys, "round"])``."""
        import pandas as pd

        keys = self.keys
        frames = []
        for run in self:
            settings = run.settings
            names = {"run": self.name(run), "status": run.status, **{k: _cell(settings.get(k)) for k in keys},
                     "seed": run.config.get("seed")}
            frame = run.metrics.copy()
            for position, (column, value) in enumerate(names.items()):
                frame.insert(position, column, [value] * len(frame))
            frames.append(frame)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["run", "status", *keys])

    def name(self, run: Run) -> str:
        """A run's folder relative to :attr:`folder` (its own name when it is the folder)."""
        try:
            relative = run.dir.relative_to(self.folder).as_posix()
        except ValueError:  # a run added from elsewhere
            return str(run.dir)
        return run.dir.name if relative == "." else relative

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for run in self:
            counts[run.status] = counts.get(run.status, 0) + 1
        states = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        return f"<Runs: {len(self)} runs under {self.folder} ({states}); keys: {', '.join(self.keys)}>"


def _cell(value: Any) -> Any:
    """A config value as a table cell pandas can group by: a list or dict as its JSON text."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value
