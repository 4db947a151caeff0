"""``fedsuite sweep --search random|asha``: a Ray Tune search over ranges, each trial a fedsuite run.

Where a grid (:mod:`fedsuite.queues.sweep`) runs every combination, a search samples ``--samples`` settings
from a space of ranges::

    fedsuite sweep --search asha --samples 16 --space lr=log:0.001:0.3 --space local_epochs=int:1:5 \\
        --space strategy=choice:fedavg,fedprox --set rounds=100

A range is ``log:LOW:HIGH`` (log-uniform), ``uniform:LOW:HIGH``, ``int:LOW:HIGH`` (an integer,
both ends included) or ``choice:V1,V2,...`` (values read as ``--set`` reads them). Before anything
runs, both ends of a range and every choice are validated as run settings, and they and the base
settings pass the checks ``fedsuite simulate`` makes before its run folder exists (the hardware
asked for; data, partition and a model that can take the data: ``fedsuite.queues.reproduce.queue.check_runs``).

Each trial is one ``fedsuite simulate`` run (one seed: ``--seeds`` names it) in
``<output-dir>/<name>/trials/<trial>``, started by a Tune trainable
(``fedsuite.queues.search_tune.FedsuiteTrial``) that reports every evaluation of the run to Tune
as ``test_accuracy`` at ``round``. With ``asha``, Tune's asynchronous successive halving
(:class:`ray.tune.schedulers.ASHAScheduler`, reduction factor 2, first rung at ``--grace-rounds``)
stops a trial whose accuracy at a rung is below the median of those recorded there; its run is
stopped as Ctrl-C stops one (SIGTERM: the run directory keeps its rounds and checkpoint, and
``fedsuite simulate --resume --output-dir <folder>/trials --run-name <trial>`` would go on).
``random`` runs every sampled trial to the end. Tune places the trials on a private Ray of its own
(``--jobs`` trials at a time; its folder removed at the end); each trial's run starts its own private
Ray for its clients, or puts them on ``--ray-address`` (and ``--num-gpus`` is passed to every run).
The sampling is seeded with the trials' seed, so the same command samples the same settings.

A search's folder is ``<output-dir>/<name>``, by default ``<config name>-search`` (``search`` without a
config file): not the folder a grid of the same config file writes, since a grid and a search
write the same ``report.md`` and one folder holds one of them (a grid's folder is refused:
``fedsuite.queues.study.study_in``). A search is not resumed as a whole: a second search into a folder
that holds trials is refused (give ``--name``); its runs are. Where the second search's config
differs from what the trials ran (a base ``--set`` changed, say), the refusal names a trial's run
folder and the differing fields, the check every queue makes of the runs it finds
(``fedsuite.queues.reproduce.queue.check_recorded``). While a search runs, its folder is held
(``fedsuite.queues.study.FolderLock``): a second search or grid into it is refused in one line naming
the first's PID.

Each trial that ends is one line (``search_tune.trial_lines``): completed, stopped early (ASHA),
interrupted, or failed with the reason its run's ``summary.json`` gives, and its run folder; Ray
Tune's own logs (a failed trial's traceback, its progress tables) are kept quiet. Ctrl-C or SIGTERM
(``search_tune.Interrupt``) stops every running trial's run as Ctrl-C stops a run (partial, with its
checkpoint: ``fedsuite simulate --resume`` continues it), starts no further trial, writes the report
and exits 130, as an interrupted grid does.

The report (``report.md``, ``trials.csv``, ``accuracy.png``) lists every trial: its setting, what
became of it (completed; stopped by ASHA at a round; interrupted at a round; failed, with why; never
started, in an interrupted search), its rounds, its reading (mean of its last ``--last``
evaluations) and its run directory; the best completed trial; the trials that did not complete,
each interrupted one with the command that continues its run; one curve per trial. A trial that
did not complete, other than one ASHA stopped, makes the command exit 1.

This module is the command (:func:`run_search`: check, search, report) and its folder's checks;
:mod:`fedsuite.queues.search_space` reads and validates the space and makes a sampled setting a
trial's run; :mod:`fedsuite.queues.search_tune` runs the trials on Ray Tune;
:mod:`fedsuite.queues.search_report` says what became of each trial and writes the report;
:mod:`fedsuite.queues.study` holds what a grid and a search share.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rich.text import Text

from fedsuite.records.paths import folder_problem
from fedsuite.config import BaseRunConfig, build_config, setting_keys
from fedsuite.queues.search_report import read_trials, write_report
from fedsuite.queues.search_space import check_space, parse_space, space_configs, trial_run
from fedsuite.queues.search_tune import Interrupt, run_tune
from fedsuite.queues.study import FolderLock, SweepError, refuse_folder_keys, study_in

SEARCHES = ("random", "asha")


@dataclass
class EarlierTrial:
    """A trial an earlier search left in the folder, with the config this search would give its
    setting: what :func:`fedsuite.queues.reproduce.queue.check_recorded` compares with its record."""

    run_dir: Path
    cfg: BaseRunConfig

    @property
    def label(self) -> str:
        return f"trial {self.run_dir.name}"


def earlier_trials(folder: Path, config: Path | None, base_set: Sequence[str], seed: int) -> list[EarlierTrial]:
    """The trials in ``folder/trials`` (their records, ``<trial>.json``), each with the config this
    search's base gives its setting; a trial whose setting this base cannot take is left out (the
    search is refused all the same)."""
    trials = []
    for path in sorted((folder / "trials").glob("*.json")):
        try:
            setting = json.loads(path.read_text())["setting"]
            run_dir = path.with_suffix("")
            trials.append(EarlierTrial(run_dir, trial_run(config, base_set, setting, seed, run_dir)[2]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # ConfigError is a ValueError
            continue
    return trials


@dataclass
class _Planned:
    """What the checks before a search (``fedsuite.queues.reproduce.queue.missing_data`` and ``check_runs``)
    read of its runs: a label, a config and its dataset."""

    label: str
    cfg: Any

    @property
    def dataset(self) -> tuple[str, str, str]:
        return self.cfg.dataset, self.cfg.data_root, json.dumps(self.cfg.dataset_options, sort_keys=True)


def run_search(search: str, space_items: Sequence[str], samples: int, grace_rounds: int | None,
               config: Path | None, base_set: Sequence[str], seeds: Sequence[int], folder: Path, jobs: int,
               placement: Sequence[str], last: int, console) -> int:
    """The command: check, search, report. Returns the exit code (0 every trial completed or was
    stopped by ASHA, 1 a trial did not, 130 interrupted: ``Interrupt``); ``SweepError``
    for bad input, before anything is written: among it a folder another search or sweep works in
    (``fedsuite.queues.study.FolderLock``)."""
    if search not in SEARCHES:
        raise SweepError(f"--search must be one of {', '.join(SEARCHES)}, got {search!r}")
    if samples < 1:
        raise SweepError(f"--samples must be at least 1, got {samples}")
    if len(seeds) != 1:
        raise SweepError(f"a search runs one seed per trial; give one --seeds value, got {len(seeds)}")
    space = parse_space(space_items)
    refuse_folder_keys(setting_keys(list(base_set)), "--set")
    rounds = check_space(space, base_set, config)
    grace = grace_rounds if grace_rounds is not None else max(1, rounds // 4)
    if not 1 <= grace <= rounds:
        raise SweepError(f"--grace-rounds must be between 1 and the runs' {rounds} rounds, got {grace}")
    with FolderLock(folder, "give this one another --name or --output-dir (a search is not resumed as a "
                            "whole)") as lock:
        lock.take()  # a folder that exists: held before the checks read it
        _check_folder(folder, config, base_set, seeds[0])
        from fedsuite.queues.reproduce.queue import check_runs, missing_data

        # simulate's checks before its run folder exists, for the base and every value of the space
        planned = [_Planned("the search's base settings", build_config(config, list(base_set))),
                   *(_Planned(label, cfg) for label, cfg in space_configs(space, base_set, config))]
        problems = missing_data(planned)
        if problems:
            raise SweepError("missing data, nothing was started:\n  " + "\n  ".join(problems))
        check_runs(planned, placement)
        folder.mkdir(parents=True, exist_ok=True)
        lock.take()  # a folder made just now (a second search that made it too is refused here)
        console.print(Text.assemble((f"search {folder.name}", "bold"), f" ({search}): {samples} trials of {rounds} "
                                    f"rounds, seed {seeds[0]}, {jobs} at a time"
                                    + (f", ASHA rungs from round {grace}" if search == "asha" else "")
                                    + f" -> {folder}"))
        stopped: set[str] = set()  # the trials ASHA stopped
        interrupt = Interrupt()
        with interrupt:
            run_tune(search, space, samples, grace, rounds, config, base_set, seeds[0], folder, jobs, placement,
                     console, stopped, interrupt)
        trials = read_trials(folder, stopped)
        path = write_report(trials, folder, rounds, last, search, samples)
        failed = [t for t in trials if t["outcome"].startswith("failed")]
        unfinished = [t for t in trials if not t["outcome"].startswith(("completed", "stopped early", "failed"))]
        never = samples - len(trials)
        if interrupt.signalled:
            console.print(f"interrupted: {len(unfinished)} trial(s) stopped (their runs keep their rounds and "
                          f"checkpoints; the report says how to continue each), {never} never started; report -> "
                          f"{path}", soft_wrap=True)
            return 130
        console.print(f"report -> {path}" + (f"; {len(failed)} trial(s) failed (logs beside them)" if failed else "")
                      + (f"; {len(unfinished) + never} did not complete" if unfinished or never else ""),
                      soft_wrap=True)
        return 1 if failed or unfinished or never else 0


def _check_folder(folder: Path, config: Path | None, base_set: Sequence[str], seed: int) -> None:
    """A search's folder holds no grid and no earlier search's trials (naming what changed, if
    anything), and can be written; else ``SweepError``. Reads only (a probe folder aside)."""
    if study_in(folder) == "grid":
        raise SweepError(f"{folder} holds a grid sweep, whose report.md a search's would replace: give the "
                         "search another --name")
    trials_dir = folder / "trials"
    if trials_dir.is_dir() and any(trials_dir.iterdir()):
        from fedsuite.queues.reproduce.queue import check_recorded

        check_recorded(earlier_trials(folder, config, base_set, seed),  # names what changed, if anything
                       "a search is not resumed as a whole: give the new search another --name")
        raise SweepError(f"{folder} already holds a search's trials (a search is not resumed as a whole; its runs "
                         "are): give another --name, or remove the folder")
    problem = folder_problem(folder)
    if problem is not None:
        raise SweepError(f"--output-dir: {problem}")
