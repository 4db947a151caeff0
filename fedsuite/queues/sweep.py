"""``fedsuite sweep``: your own grid of settings, times seeds, as one resumable queue, and its report.

A sweep is a base configuration (a ``--config`` file and ``--set`` overrides, as ``fedsuite
simulate`` takes them) and a grid over any config keys, each key with its values::

    fedsuite sweep --config my.toml --grid lr=0.01,0.05 --grid strategy=fedavg,fedprox --seeds 0,1,2

or, in the config file, a ``[sweep]`` section (command-line ``--grid`` and ``--seeds`` win)::

    [sweep]
    grid = { lr = [0.01, 0.05], strategy = ["fedavg", "fedprox"] }
    seeds = [0, 1, 2]

Every setting (one value per key: the grid's Cartesian product) runs once per seed, as a
``fedsuite simulate`` run in ``<output-dir>/<name>/<setting>/s<seed>``. The runs go through the queue of
``fedsuite reproduce`` (:func:`fedsuite.queues.reproduce.queue.run_queue`): ``--jobs`` at a time, finished runs
skipped, interrupted ones resumed, Ctrl-C and kill safe. Before anything runs, every run's config is
validated (an unknown key, a value that fails validation, an empty grid: one line, exit 2), every
run already in the folder is checked to be the run asked for (a sweep run again after its base
``--set`` or config file changed finds runs of the old setting: one line naming a run folder and
the fields that differ, exit 2, nothing started; ``fedsuite.queues.reproduce.queue.check_recorded``),
every dataset the runs need is checked, and every run to run is checked as its ``fedsuite simulate``
would check it before its run folder exists (the hardware it asks for; a model that cannot take the
data, ``--grid model=mlp,cnn`` on feature vectors: one line naming the setting, exit 2;
``fedsuite.queues.reproduce.queue.check_runs``). A run that failed is named at the start, one line each,
and left as it is; ``--retry-failed`` runs it again from its last checkpoint.

A sweep's folder holds one grid: a search (``fedsuite sweep --search``, :mod:`fedsuite.queues.search`)
writes its own ``report.md`` and is refused in a grid's folder, and a grid in a search's
(:func:`fedsuite.queues.study.study_in`). A search's default folder is ``<config name>-search``, a
grid's the config's name, so the two do not meet unless ``--name`` says so. While a grid or a
search runs, it holds its folder (:class:`fedsuite.queues.study.FolderLock`): a second command into
it meanwhile is refused in one line naming the first's PID.

The report (``<output-dir>/<name>/report.md``, ``report.csv``, ``accuracy.png``) has per setting the
mean ± sample std (n − 1) over its completed seeds of the reading (each run's mean of its last ``--last``
evaluations, :func:`fedsuite.records.results.run_value`), the best accuracy, the seeds that completed, and
the best setting per group (``--group-by KEY``: per value of that grid key; else the best of all);
the figure has one band per setting. Runs that did not complete are named with their failure.

This module reads the grid and plans, checks and queues its runs (:func:`run_sweep`);
:mod:`fedsuite.queues.sweep_report` writes the report; :mod:`fedsuite.queues.study` holds what a
grid and a search share (their error, a setting as text, their folder and its lock).
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rich.text import Text

from fedsuite.records.paths import folder_problem
from fedsuite.config import (BaseRunConfig, ConfigError, build_config, check_settings_used, load_toml, own_settings,
                             parse_value, setting_keys, unused_setting)
from fedsuite.queues.reproduce.queue import (QueuedRun, check_recorded, completed, name_failed, other_folder, pending,
                                             queue_and_report)
from fedsuite.queues.study import (FolderLock, SweepError, refuse_folder_keys, setting_label, setting_text,
                                   split_values, study_folder, study_in, toml_value)
from fedsuite.queues.sweep_report import write_report


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["lr=0.01,0.05", "strategy=fedavg,fedprox"]`` -> ``{"lr": [0.01, 0.05], "strategy": [...]}``;
    each value is read as ``--set`` reads it (TOML, else a bare string)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        values = split_values(text) if sep else []
        if not key or not sep or not text.strip() or any(v == "" for v in values):
            raise SweepError(f"--grid expects key=value1,value2,..., got {item!r}")
        if key in grid:
            raise SweepError(f"--grid names {key!r} twice")
        grid[key] = [parse_value(v) for v in values]
    return grid


def setting_folder(setting: dict[str, Any]) -> str:
    """A folder name for a setting: ``lr-0.01_strategy-fedavg`` (characters outside
    ``[A-Za-z0-9._-]`` become ``-``; long ones are cut and given a hash so names stay unique)."""
    import hashlib

    name = "_".join(f"{k}-{setting_text(v)}" for k, v in setting.items())
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "setting"
    if len(name) > 120:
        name = name[:100] + "-" + hashlib.sha256(name.encode()).hexdigest()[:12]
    return name


@dataclass
class SweepRun(QueuedRun):
    """One ``fedsuite simulate`` run of a sweep: a setting and a seed (the queue's unit of work)."""

    setting: dict[str, Any]
    seed: int

    @property
    def label(self) -> str:
        return f"{setting_label(self.setting)} s{self.seed}"


def plan(config: Path | None, base_set: Sequence[str], grid: dict[str, list[Any]], seeds: Sequence[int],
         folder: Path, base: dict[str, Any] | None = None) -> list[SweepRun]:
    """Every (setting, seed) run, seed-major (a queue stopped part-way leaves whole seeds), each
    config validated: a setting that fails is a :class:`~fedsuite.queues.study.SweepError` naming it
    and the field, and so is a grid key that a setting's run would not use (``fedprox.mu`` beside
    ``strategy=fedavg``: the grid would run one FedAvg run under several names). A base ``--set``
    of a method's or plug-in's section goes only to the runs that use it
    (``fedsuite.config.own_settings``); a config file may hold the sections of several methods, as
    for ``fedsuite simulate``.
    ``base``: the settings ``config`` will hold, when it is not written yet (validated from here)."""
    if not grid:
        raise SweepError("the grid is empty: give at least one --grid key=value1,value2 (or [sweep] grid in the config)")
    if not seeds:
        raise SweepError("no seeds: give --seeds 0,1,2 (or [sweep] seeds in the config)")
    if "seed" in grid:
        raise SweepError("seed is not a grid key: the seeds are --seeds")
    refuse_folder_keys(list(grid), "--grid")
    refuse_folder_keys(setting_keys(list(base_set)), "--set")
    settings = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]

    def build(items: list[str]) -> BaseRunConfig:
        return build_config(None, items, base=base) if base is not None else build_config(config, items)

    runs = []
    unused_base: dict[str, str] = {}  # base --set items no run has used so far, with why the first run does not
    for seed in seeds:
        for setting in settings:
            run_dir = (folder / setting_folder(setting) / f"s{seed}").resolve()
            items = [*base_set, *(f"{k}={toml_value(v)}" for k, v in setting.items()), f"seed={seed}",
                     f"output_dir={json.dumps(str(run_dir.parent))}", f"run_name={json.dumps(run_dir.name)}"]
            try:
                cfg = build(items)
                for key in setting:  # a grid key its run would drop: one run under several names
                    check_settings_used(cfg, setting_keys([f"{key}={toml_value(setting[key])}"]))
                # the base settings of other methods' sections (--set fedprox.mu=0.1 beside
                # --grid strategy=fedavg,fedprox) are left out of the runs that do not use them
                own = own_settings(cfg, items)
                for item in base_set:
                    if item in own:
                        unused_base[item] = ""
                    elif item not in unused_base:
                        unused_base[item] = next(filter(None, (unused_setting(cfg, k) for k in setting_keys([item]))))
                if own != items:  # the config the run's own command line builds
                    items, cfg = own, build(own)
            except ConfigError as exc:
                raise SweepError(f"setting {setting_label(setting)}: {str(exc).splitlines()[0]}") from None
            dataset = (cfg.dataset, cfg.data_root, json.dumps(cfg.dataset_options, sort_keys=True))
            runs.append(SweepRun(setting, seed, run_dir=run_dir, config=config, overrides=items, rounds=cfg.rounds,
                                 dataset=dataset, cfg=cfg))
    unused = [(item, why) for item, why in unused_base.items() if why]
    if unused:  # dropped from every run: it would change nothing, without a word
        raise SweepError(f"--set {unused[0][0]}: no run of the sweep uses it (its first run: {unused[0][1]})")
    if len({r.run_dir for r in runs}) != len(runs):
        raise SweepError("two settings of the grid share a folder name; give the grid distinct values")
    return runs


def _dotted(node: Any, prefix: str = "") -> Any:
    """A TOML grid with its sections as dotted keys (``{fedprox = {mu = [...]}}`` -> ``fedprox.mu``);
    anything that is not a table is returned as it is (and refused by the caller)."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(_dotted(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def read_sweep_section(config: Path | None) -> tuple[dict[str, Any] | None, dict[str, list[Any]], list[int]]:
    """A config file's ``[sweep]`` section: (the file's settings without it, or None when the file
    has none (the runs read the file itself), its grid, its seeds)."""
    if config is None:
        return None, {}, []
    try:
        data = load_toml(config)
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    section = data.pop("sweep", None)
    if section is None:
        return None, {}, []
    if not isinstance(section, dict) or set(section) - {"grid", "seeds"}:
        raise SweepError(f"{config}: [sweep] takes grid = {{key = [values]}} and seeds = [ints]")
    grid = _dotted(section.get("grid", {}))
    seeds = section.get("seeds", [])
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise SweepError(f"{config}: [sweep] grid must map each key to a non-empty list of values")
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise SweepError(f"{config}: [sweep] seeds must be a list of integers")
    return data, dict(grid), list(seeds)


def run_sweep(config: Path | None, base_set: Sequence[str], grid_items: Sequence[str], seeds: Sequence[int] | None,
              output_dir: Path, name: str | None, jobs: int, placement: Sequence[str], last: int,
              group_by: str | None, report_only: bool, console, retry_failed: bool = False) -> int:
    """The command: plan, check, queue, report. Returns the exit code (0 every run completed, 1 a
    run did not, 130 interrupted); raises :class:`~fedsuite.queues.study.SweepError` (or, for missing data, its base
    ``ReproduceError``) for bad input, exit 2, before anything is written: among it a folder that
    holds a search (``study_in``), and a run in the folder that is not the run asked for
    (``fedsuite.queues.reproduce.queue.check_recorded``), also with ``--report``, which would read it as
    the new setting's; and a folder another sweep works in (``FolderLock``: two identical
    sweeps at once would each start the other's runs, which would fail). A failed run is named at
    the start and left as it is, or run again with ``retry_failed`` (``--retry-failed``)."""
    if jobs < 1:
        raise SweepError(f"--jobs must be at least 1, got {jobs}")
    if last < 1:
        raise SweepError(f"--last must be at least 1, got {last}")
    if report_only and retry_failed:
        raise SweepError("--report only writes the report; --retry-failed belongs to a sweep that runs")
    stripped, file_grid, file_seeds = read_sweep_section(config)
    grid = {**file_grid, **parse_grid(grid_items)} if grid_items else file_grid
    seed_list = list(seeds) if seeds else file_seeds or [0]
    if group_by is not None and group_by not in grid:
        raise SweepError(f"--group-by {group_by!r} is not a grid key; allowed: {', '.join(grid)}")
    name = name if name is not None else config.stem if config is not None else "sweep"  # --name '' is refused
    folder = study_folder(output_dir, name)
    if study_in(folder) == "search":
        raise SweepError(f"{folder} holds a search (trials/), whose report.md a grid's would replace: give the grid "
                         "another --name")
    # the runs read the config file itself, or, when it has a [sweep] section, a copy without it
    runs_config = config if stripped is None else folder / "base.toml"
    runs = plan(runs_config, base_set, grid, seed_list, folder, base=stripped)
    remedy = other_folder("another --name or --output-dir")
    if report_only:  # reads the runs on disk, and may while a sweep runs them: it takes no lock
        check_recorded(runs, remedy)
        _prepare(folder, stripped, runs_config)
        console.print(f"report -> {write_report(runs, folder, last, group_by, name)}")
        return 0
    with FolderLock(folder, "wait for it to end (the same command then finds its runs done), or give this one "
                            "another --name or --output-dir") as lock:
        lock.take()  # a folder that exists: held before the checks read its runs
        todo = pending(runs, retry_failed, remedy, placement, lambda run: f"setting {setting_label(run.setting)}")
        _prepare(folder, stripped, runs_config, lock)
        settings = len(runs) // len(seed_list)
        console.print(Text.assemble((f"sweep {name}", "bold"), f": {settings} settings x {len(seed_list)} seeds = "
                                    f"{len(runs)} runs, {completed(runs)} already done, {len(todo)} to run, {jobs} at "
                                    f"a time -> {folder}"))
        name_failed(runs, retry_failed, console)
        return queue_and_report(runs, jobs, placement, console,
                                lambda: write_report(runs, folder, last, group_by, name), retry_failed)


def _prepare(folder: Path, stripped: dict[str, Any] | None, runs_config: Path | None,
             lock: FolderLock | None = None) -> None:
    """After a sweep's checks, which only read (a refused sweep leaves its folder as it was, to its
    mtime; this makes and removes a probe folder in it): that the folder can be written, the folder
    (held with ``lock`` once it exists: a second sweep that made it too is refused here), and its
    ``base.toml`` (a config file's settings without its ``[sweep]`` section)."""
    problem = folder_problem(folder)
    if problem is not None:
        raise SweepError(f"--output-dir: {problem}")
    folder.mkdir(parents=True, exist_ok=True)
    if lock is not None:
        lock.take()
    if stripped is not None:  # written once every setting and every run on disk have passed
        import tomli_w

        text = tomli_w.dumps(stripped)
        if not runs_config.is_file() or runs_config.read_text() != text:
            runs_config.write_text(text)

