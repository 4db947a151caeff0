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
(:func:`study_in`). A search's default folder is ``<config name>-search``, a grid's the config's
name, so the two do not meet unless ``--name`` says so. While a grid or a search runs, it holds its
folder (:class:`FolderLock`): a second command into it meanwhile is refused in one line naming the
first's PID.

The report (``<output-dir>/<name>/report.md``, ``report.csv``, ``accuracy.png``) has per setting the
mean ± sample std (n − 1) over its completed seeds of the reading (each run's mean of its last ``--last``
evaluations, :func:`fedsuite.records.results.run_value`), the best accuracy, the seeds that completed, and
the best setting per group (``--group-by KEY``: per value of that grid key; else the best of all);
the figure has one band per setting. Runs that did not complete are named with their failure.
"""

from __future__ import annotations

import csv
import fcntl
import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from rich.text import Text

from fedsuite.records import rundir
from fedsuite.config import (BaseRunConfig, ConfigError, build_config, check_settings_used, load_toml, own_settings,
                             parse_value, setting_keys, unused_setting)
from fedsuite.queues.reproduce.queue import (QueuedRun, ReproduceError, check_recorded, completed, name_failed, other_folder,
                                      pending, queue_and_report)
from fedsuite.queues.reproduce.report import aggregate


class SweepError(ReproduceError):
    """A user error in a sweep (a bad grid, a setting that does not validate); missing data is the
    queue's :class:`ReproduceError`, its base."""


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


def _toml_value(value: Any) -> str:
    """A grid value as ``--set`` text (TOML), for the run's command line; a table (``{alpha = 1}``,
    a section or ``dataset_options`` given whole) as an inline table, keys quoted."""
    import tomli_w

    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
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


def _text(value: Any) -> str:
    """A grid value as people read it: a string as it is, anything else as TOML."""
    return value if isinstance(value, str) else _toml_value(value)


def setting_label(setting: dict[str, Any]) -> str:
    return " ".join(f"{k}={_text(v)}" for k, v in setting.items())


def setting_folder(setting: dict[str, Any]) -> str:
    """A folder name for a setting: ``lr-0.01_strategy-fedavg`` (characters outside
    ``[A-Za-z0-9._-]`` become ``-``; long ones are cut and given a hash so names stay unique)."""
    import hashlib

    name = "_".join(f"{k}-{_text(v)}" for k, v in setting.items())
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
    config validated: a setting that fails is a :class:`SweepError` naming it and the field, and so is
    a grid key that a setting's run would not use (``fedprox.mu`` beside ``strategy=fedavg``: the
    grid would run one FedAvg run under several names). A base ``--set`` of a method's or plug-in's
    section goes only to the runs that use it (``fedsuite.config.own_settings``); a config file may
    hold the sections of several methods, as for ``fedsuite simulate``.
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
            items = [*base_set, *(f"{k}={_toml_value(v)}" for k, v in setting.items()), f"seed={seed}",
                     f"output_dir={json.dumps(str(run_dir.parent))}", f"run_name={json.dumps(run_dir.name)}"]
            try:
                cfg = build(items)
                for key in setting:  # a grid key its run would drop: one run under several names
                    check_settings_used(cfg, setting_keys([f"{key}={_toml_value(setting[key])}"]))
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


# ------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------


def collect(runs: Sequence[SweepRun], last: int) -> list[dict[str, Any]]:
    """Per setting: the completed seeds' readings (mean of the last ``last`` evaluations, in %),
    their mean ± sample std, the mean best accuracy, the curves and, for runs with federated evaluation,
    the mean over seeds of their ``results.client_readings`` (``clients``)."""
    from fedsuite.records.results import best_accuracy, client_readings, evaluations, reading_columns, run_value
    from fedsuite.records.rundir import read_metrics

    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        entry = out.setdefault(setting_label(run.setting), {
            "setting": run.setting, "label": setting_label(run.setting), "values": {}, "bests": [], "curves": [],
            "planned": 0, "incomplete": [], "readings": []})
        entry["planned"] += 1
        if rundir.state(run.run_dir, run.rounds) != "completed":
            entry["incomplete"].append(run)
            continue
        rows = read_metrics(run.run_dir)
        evals = evaluations(rows)
        if not evals:
            entry["incomplete"].append(run)
            continue
        entry["values"][run.seed] = run_value(evals, "accuracy", last)[0]
        entry["bests"].append(100 * best_accuracy(evals))
        entry["curves"].append(rows)
        entry["readings"].append(client_readings(rows, last))
    for entry in out.values():
        values = [entry["values"][s] for s in sorted(entry["values"])]
        entry["mean"], entry["std"] = aggregate(values)
        entry["best"] = float(np.mean(entry["bests"])) if entry["bests"] else None
        # federated evaluation (results.client_readings): the mean over the completed seeds, in %
        entry["clients"] = {c: float(np.mean([r[c] for r in entry["readings"] if c in r]))
                            for c in reading_columns(entry["readings"])}
    return list(out.values())


def best_per_group(settings: Sequence[dict[str, Any]], group_by: str | None) -> dict[str, dict[str, Any]]:
    """The setting with the highest mean reading per value of ``group_by`` (one group, ``all``, when
    None); settings without a completed seed take no part."""
    best: dict[str, dict[str, Any]] = {}
    for entry in settings:
        if entry["mean"] is None:
            continue
        group = "all" if group_by is None else f"{group_by}={_text(entry['setting'][group_by])}"
        if group not in best or entry["mean"] > best[group]["mean"]:
            best[group] = entry
    return best


def write_report(runs: Sequence[SweepRun], folder: Path, last: int, group_by: str | None, title: str) -> Path:
    """``report.md``, ``report.csv`` and ``accuracy.png`` (one band per setting) in ``folder``."""
    from fedsuite.records.plots import plot_groups
    from fedsuite.records.results import CLIENT_READINGS, reading_columns

    folder.mkdir(parents=True, exist_ok=True)
    data = collect(runs, last)
    extra = reading_columns([e["clients"] for e in data])
    md = [f"# Sweep: {title}", "",
          f"Reading: each run's mean test accuracy over its last {last} evaluations; per setting the mean ± sample std (n − 1) "
          "over its completed seeds; best = mean over seeds of each run's best evaluation."
          + (" Federated evaluation's columns: the same reading of the clients' accuracies, mean over seeds."
             if extra else ""), "",
          "| setting | reading (%) | seeds | best acc (%) |" + "".join(f" {CLIENT_READINGS[c]} |" for c in extra),
          "|---|---|---|---|" + "---|" * len(extra)]
    rows_csv = []
    for e in data:
        reading = "-" if e["mean"] is None else f"{e['mean']:.2f}" + (f" ± {e['std']:.2f}" if e["std"] is not None else "")
        best_acc = "-" if e["best"] is None else f"{e['best']:.2f}"
        md.append(f"| {e['label']} | {reading} | {len(e['values'])}/{e['planned']} | {best_acc} |"
                  + "".join(f" {e['clients'][c]:.2f} |" if c in e["clients"] else " - |" for c in extra))
        rows_csv.append({**{k: _text(v) for k, v in e["setting"].items()},
                         "mean": "" if e["mean"] is None else e["mean"], "std": "" if e["std"] is None else e["std"],
                         "seeds_completed": len(e["values"]), "seeds_planned": e["planned"],
                         "best_mean": "" if e["best"] is None else e["best"],
                         "values": " ".join(f"s{s}={v:.4f}" for s, v in sorted(e["values"].items())),
                         **{c: e["clients"].get(c, "") for c in extra}})
    best = best_per_group(data, group_by)
    md += ["", f"Best setting {'per ' + group_by if group_by else 'of all'}:", ""]
    md += [f"- {group}: **{e['label']}** ({e['mean']:.2f})" for group, e in best.items()] or ["- none completed"]
    incomplete = [rundir.why_incomplete(run.run_dir, run.label, run.rounds) for e in data for run in e["incomplete"]]
    if incomplete:
        md += ["", "Runs that did not complete (not in the numbers above):", "", *[f"- {line}" for line in incomplete]]
    curves = {e["label"]: e["curves"] for e in data if e["curves"]}
    if curves:
        plot_groups(curves, folder / "accuracy.png", title=f"sweep {title}: mean ± sample std over seeds")
        md += ["", "![accuracy](accuracy.png)"]
    (folder / "report.md").write_text("\n".join(md) + "\n")
    with (folder / "report.csv").open("w", newline="") as fh:
        fields = [*(runs[0].setting if runs else {}), "mean", "std", "seeds_completed", "seeds_planned", "best_mean",
                  "values", *extra]
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows_csv)
    return folder / "report.md"


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
    the folder itself, as ``fedsuite.records.rundir.claimed`` holds a run's folder. No file is added; the
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


def run_sweep(config: Path | None, base_set: Sequence[str], grid_items: Sequence[str], seeds: Sequence[int] | None,
              output_dir: Path, name: str | None, jobs: int, placement: Sequence[str], last: int,
              group_by: str | None, report_only: bool, console, retry_failed: bool = False) -> int:
    """The command: plan, check, queue, report. Returns the exit code (0 every run completed, 1 a
    run did not, 130 interrupted); raises :class:`SweepError` (or, for missing data, its base
    ``ReproduceError``) for bad input, exit 2, before anything is written: among it a folder that
    holds a search (:func:`study_in`), and a run in the folder that is not the run asked for
    (``fedsuite.queues.reproduce.queue.check_recorded``), also with ``--report``, which would read it as
    the new setting's; and a folder another sweep works in (:class:`FolderLock`: two identical
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
    problem = rundir.folder_problem(folder)
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

