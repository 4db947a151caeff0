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
``<output-dir>/<name>/trials/<trial>``, started by a Tune trainable (:class:`FedsuiteTrial`) that reports
every evaluation of the run to Tune as ``test_accuracy`` at ``round``. With ``asha``, Tune's
asynchronous successive halving (:class:`ray.tune.schedulers.ASHAScheduler`, reduction factor 2,
first rung at ``--grace-rounds``) stops a trial whose accuracy at a rung is below the median of
those recorded there; its run is stopped as Ctrl-C stops one (SIGTERM: the run directory keeps its
rounds and checkpoint, and ``fedsuite simulate --resume --output-dir <folder>/trials --run-name
<trial>`` would go on).
``random`` runs every sampled trial to the end. Tune places the trials on a private Ray of its own
(``--jobs`` trials at a time; its folder removed at the end); each trial's run starts its own private
Ray for its clients, or puts them on ``--ray-address`` (and ``--num-gpus`` is passed to every run).
The sampling is seeded with the trials' seed, so the same command samples the same settings.

A search's folder is ``<output-dir>/<name>``, by default ``<config name>-search`` (``search`` without a
config file): not the folder a grid of the same config file writes, since a grid and a search
write the same ``report.md`` and one folder holds one of them (a grid's folder is refused:
``fedsuite.queues.sweep.study_in``). A search is not resumed as a whole: a second search into a folder
that holds trials is refused (give ``--name``); its runs are. Where the second search's config
differs from what the trials ran (a base ``--set`` changed, say), the refusal names a trial's run
folder and the differing fields, the check every queue makes of the runs it finds
(``fedsuite.queues.reproduce.queue.check_recorded``). While a search runs, its folder is held
(``fedsuite.queues.sweep.FolderLock``): a second search or grid into it is refused in one line naming
the first's PID.

Each trial that ends is one line (:func:`trial_lines`): completed, stopped early (ASHA),
interrupted, or failed with the reason its run's ``summary.json`` gives, and its run folder; Ray
Tune's own logs (a failed trial's traceback, its progress tables) are kept quiet. Ctrl-C or SIGTERM
(:class:`Interrupt`) stops every running trial's run as Ctrl-C stops a run (partial, with its
checkpoint: ``fedsuite simulate --resume`` continues it), starts no further trial, writes the report
and exits 130, as an interrupted grid does.

The report (``report.md``, ``trials.csv``, ``accuracy.png``) lists every trial: its setting, what
became of it (completed; stopped by ASHA at a round; interrupted at a round; failed, with why; never
started, in an interrupted search), its rounds, its reading (mean of its last ``--last``
evaluations) and its run directory; the best completed trial; the trials that did not complete,
each interrupted one with the command that continues its run; one curve per trial. A trial that
did not complete, other than one ASHA stopped, makes the command exit 1.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rich.text import Text

from fedsuite.records import rundir
from fedsuite.config import (BaseRunConfig, ConfigError, build_config, check_settings_used, own_settings, parse_value,
                             setting_keys, unused_setting)
from fedsuite.queues.sweep import (FolderLock, SweepError, _text, _toml_value, refuse_folder_keys, setting_label, split_values,
                            study_in)

SEARCHES = ("random", "asha")
#: ASHA's reduction factor: at each rung the better half goes on
REDUCTION_FACTOR = 2
#: exit codes of a ``fedsuite simulate`` run stopped from outside (SIGINT: 130; SIGTERM: 143; or
#: killed by either before its handler): it keeps its rounds and checkpoint, and ``--resume`` goes on
STOPPED_CODES = (130, 143, -2, -15)
#: Ray Tune's settings for a search (environment variables its driver reads): SIGINT and SIGTERM are
#: the search's (:class:`Interrupt`); no result files or progress tables of Tune's own (the trials'
#: runs hold the results, and the search prints one line per trial)
TUNE_ENV = {"TUNE_DISABLE_SIGINT_HANDLER": "1", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1", "RAY_AIR_NEW_OUTPUT": "0"}


@dataclass(frozen=True)
class Range:
    """One key's range: ``kind`` is log, uniform, int or choice; ``values`` the ends or the choices."""

    key: str
    kind: str
    values: tuple[Any, ...]

    def domain(self):
        from ray import tune

        if self.kind == "log":
            return tune.loguniform(*self.values)
        if self.kind == "uniform":
            return tune.uniform(*self.values)
        if self.kind == "int":
            return tune.randint(self.values[0], self.values[1] + 1)  # Tune's upper end is excluded
        return tune.choice(list(self.values))


def parse_space(items: Sequence[str]) -> list[Range]:
    """``["lr=log:0.001:0.3", "strategy=choice:fedavg,fedprox"]`` -> ranges; one line for a bad one."""
    ranges: dict[str, Range] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key, (kind, _, spec) = key.strip(), text.partition(":")
        usage = (f"--space expects key=log:LOW:HIGH, uniform:LOW:HIGH, int:LOW:HIGH or choice:V1,V2,..., "
                 f"got {item!r}")
        if not key or not sep or kind not in ("log", "uniform", "int", "choice") or not spec.strip():
            raise SweepError(usage)
        if key in ranges:
            raise SweepError(f"--space names {key!r} twice")
        if key == "seed":
            raise SweepError("seed is not a search key: --seeds names the trials' seed")
        refuse_folder_keys([key], "--space")
        if kind == "choice":
            values = split_values(spec)
            if any(v == "" for v in values):
                raise SweepError(usage)
            ranges[key] = Range(key, kind, tuple(parse_value(v) for v in values))
            continue
        ends = spec.split(":")
        try:
            low, high = (int(e) for e in ends) if kind == "int" else (float(e) for e in ends)
        except ValueError:
            raise SweepError(usage) from None
        if not (math.isfinite(low) and math.isfinite(high) and low < high) or (kind == "log" and low <= 0):
            raise SweepError(f"--space {key}: the range needs LOW < HIGH{' and LOW > 0' if kind == 'log' else ''}, "
                             f"got {spec!r}")
        ranges[key] = Range(key, kind, (low, high))
    return list(ranges.values())


def space_configs(space: Sequence[Range], base_set: Sequence[str],
                  config: Path | None) -> list[tuple[str, BaseRunConfig]]:
    """``("--space key=value", its run's config)`` for both ends of every range and every choice, each
    validated as a run setting on the base (:class:`SweepError` naming the key and the field). A key
    of a method's or plug-in's section must be one that the base's strategy, or a strategy of the
    space's ``strategy`` choice, uses (``fedsuite.config.unused_setting``): else no trial's run
    would use it (a trial that draws a strategy that does not use it runs without it:
    :func:`trial_run`); its config is then the one with such a strategy."""
    if not space:
        raise SweepError("the search space is empty: give at least one --space key=log:LOW:HIGH (or uniform, int, "
                         "choice)")
    strategies = next((r.values for r in space if r.key == "strategy"), ())
    cfgs = []
    for rng in space:
        for value in rng.values:
            item = f"{rng.key}={_toml_value(value)}"
            try:
                cfg = build_config(config, [*base_set, item])
                for strategy in strategies:  # the base's strategy may not use it where one of these does
                    if any(unused_setting(cfg, key) for key in setting_keys([item])):
                        cfg = build_config(config, [*base_set, f"strategy={_toml_value(strategy)}", item])
                check_settings_used(cfg, setting_keys([item]))
            except ConfigError as exc:
                raise SweepError(f"--space {rng.key}={_text(value)}: {str(exc).splitlines()[0]}") from None
            cfgs.append((f"--space {rng.key}={_text(value)}", cfg))
    return cfgs


def check_space(space: Sequence[Range], base_set: Sequence[str], config: Path | None) -> int:
    """Validate the space (:func:`space_configs`) and that every base ``--set`` of a method's or
    plug-in's section is used by some trial (else it would change nothing, without a word);
    :class:`SweepError` naming what is wrong. Returns the runs' number of rounds."""
    cfgs = [cfg for _, cfg in space_configs(space, base_set, config)]
    for item in base_set:
        if not any(own_settings(cfg, [item]) for cfg in cfgs):
            why = next(filter(None, (unused_setting(cfgs[0], k) for k in setting_keys([item]))))
            raise SweepError(f"--set {item}: no trial of the search would use it ({why})")
    return int(cfgs[-1].rounds)


class FedsuiteTrial:
    """A Tune trainable (built by :func:`trainable`): one ``fedsuite simulate`` run, one Tune result
    per evaluation. ``step`` waits for the run's next evaluated round in ``metrics.jsonl``; the
    run's end gives ``done`` (completed) or an error (failed: Tune marks the trial ERROR);
    ``cleanup`` (a trial stopped by the scheduler, or the search interrupted) stops the run's
    process tree with SIGTERM, as Ctrl-C would."""


def trial_overrides(base_set: Sequence[str], setting: dict[str, Any], seed: int, run_dir: Path) -> list[str]:
    """The ``--set`` overrides of a trial's setting: the base, the trial's setting, the seed and where it lives."""
    return [*base_set, *(f"{k}={_toml_value(v)}" for k, v in setting.items()), f"seed={seed}",
            f"output_dir={json.dumps(str(run_dir.parent))}", f"run_name={json.dumps(run_dir.name)}"]


def trial_run(config: Path | None, base_set: Sequence[str], setting: dict[str, Any], seed: int,
              run_dir: Path) -> tuple[dict[str, Any], list[str], BaseRunConfig]:
    """A trial's run as it runs: (the setting its run uses, its ``--set`` overrides, its config). A
    sampled key or base setting of a section the run does not use (``fedprox.mu`` in a trial that
    drew ``strategy=fedavg``) is left out of both, as a queue leaves it out of its runs
    (``fedsuite.config.own_settings``): ``fedsuite simulate`` refuses it."""
    items = trial_overrides(base_set, setting, seed, run_dir)
    cfg = build_config(config, items)
    used = {k: v for k, v in setting.items()
            if all(unused_setting(cfg, key) is None for key in setting_keys([f"{k}={_toml_value(v)}"]))}
    own = own_settings(cfg, items)
    return used, own, (cfg if own == items else build_config(config, own))


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


def trainable(folder: Path, config: Path | None, base_set: Sequence[str], seed: int, rounds: int,
              placement: Sequence[str], env: dict[str, str], poll_s: float = 0.5):
    """The :class:`FedsuiteTrial` class for a search writing its runs under ``folder/trials``.
    ``env``: the environment the runs start with (the search's own, not a Tune worker's)."""
    from ray import tune

    from fedsuite.launch import reaper
    from fedsuite.launch.processes import stop_tree
    from fedsuite.queues.reproduce.queue import simulate_command
    from fedsuite.records.rundir import read_metrics

    class Trial(tune.Trainable, FedsuiteTrial):
        def setup(self, setting: dict[str, Any]) -> None:
            self.run_dir = folder / "trials" / self.trial_id
            setting, items, _ = trial_run(config, base_set, setting, seed, self.run_dir)
            self.run_dir.parent.mkdir(parents=True, exist_ok=True)
            self.log = (self.run_dir.parent / f"{self.run_dir.name}.log").open("ab")
            self.proc = subprocess.Popen(simulate_command(config, items, False, placement), stdout=self.log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         preexec_fn=reaper.die_with_parent())
            self.reported = 0  # evaluations passed to Tune so far
            self.record = {"trial": self.trial_id, "setting": setting, "rounds": rounds, "started": time.time()}
            self._write_record()

        def _write_record(self) -> None:
            path = folder / "trials" / f"{self.trial_id}.json"
            path.with_suffix(".json.tmp").write_text(json.dumps(self.record))
            path.with_suffix(".json.tmp").replace(path)

        def step(self) -> dict[str, Any]:
            while True:
                ended = self.proc.poll() is not None  # before reading: an ended run's rows are all there
                evals = [r for r in read_metrics(self.run_dir, tolerant=True)  # as results.evaluations
                         if r["round"] > 0 and r.get("test_accuracy") is not None]
                if self.reported < len(evals) and (ended or evals[self.reported]["round"] < rounds):
                    # the last round's evaluation waits for the run's end, so that a scheduler that
                    # stops trials at max_t = rounds never stops a run before it has written its summary
                    row = evals[self.reported]
                    self.reported += 1
                    return {"round": row["round"], "test_accuracy": row["test_accuracy"],
                            "test_loss": row.get("test_loss"), "train_loss": row.get("train_loss")}
                if ended:
                    now, code = rundir.state(self.run_dir), self.proc.returncode
                    if now == "completed" and code == 0 and evals:
                        return {"round": evals[-1]["round"], "test_accuracy": evals[-1]["test_accuracy"], "done": True}
                    if now == "partial" and code in STOPPED_CODES:  # stopped as Ctrl-C stops a run: resumable
                        self.record["interrupted"] = True
                    else:
                        self.record["error"] = (rundir.why_incomplete(self.run_dir, "its run") +
                                                f" (exit {code}; log {self.run_dir}.log)")
                    self._write_record()
                    # Tune marks the trial ERROR (its scheduler forgets it); the search says why in one
                    # line (TrialLines), from the record
                    raise RuntimeError(f"trial {self.trial_id}: {self.record.get('error', 'interrupted')}")
                time.sleep(poll_s)

        def cleanup(self) -> None:
            if self.proc.poll() is None:
                stop_tree(self.proc)
            self.log.close()

    return Trial


def run_search(search: str, space_items: Sequence[str], samples: int, grace_rounds: int | None,
               config: Path | None, base_set: Sequence[str], seeds: Sequence[int], folder: Path, jobs: int,
               placement: Sequence[str], last: int, console) -> int:
    """The command: check, search, report. Returns the exit code (0 every trial completed or was
    stopped by ASHA, 1 a trial did not, 130 interrupted: :class:`Interrupt`); :class:`SweepError`
    for bad input, before anything is written: among it a folder another search or sweep works in
    (``fedsuite.queues.sweep.FolderLock``)."""
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
            _tune(search, space, samples, grace, rounds, config, base_set, seeds[0], folder, jobs, placement, console,
                  stopped, interrupt)
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
    anything), and can be written; else :class:`SweepError`. Reads only (a probe folder aside)."""
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
    problem = rundir.folder_problem(folder)
    if problem is not None:
        raise SweepError(f"--output-dir: {problem}")


class Interrupt:
    """SIGINT and SIGTERM while a search runs (``with``: its handlers, the previous ones put back at
    the end). The first asks Tune to stop every trial (:meth:`stop_all`, Tune's ``Stopper``): each
    trial's run is stopped as Ctrl-C stops one, keeping its rounds and checkpoint, no trial is
    started after it, and the search writes its report and exits 130, as an interrupted grid does.
    A second one raises ``KeyboardInterrupt`` (Tune is then left at once; the runs still stop, with
    the Ray workers that started them: ``fedsuite.launch.reaper.die_with_parent``)."""

    def __init__(self) -> None:
        self.signalled = False
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "Interrupt":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *_: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def handle(self, *_: Any) -> None:
        if self.signalled:
            raise KeyboardInterrupt
        self.signalled = True

    def stop_all(self) -> bool:
        return self.signalled


def _tune(search: str, space: Sequence[Range], samples: int, grace: int, rounds: int, config: Path | None,
          base_set: Sequence[str], seed: int, folder: Path, jobs: int, placement: Sequence[str], console,
          stopped: set[str], interrupt: Interrupt) -> None:
    """Ray Tune's run of the search: a private Ray that places the trials, the trials (``trials/``),
    one line per trial that ends (:func:`trial_lines`); ``stopped`` gets the trials ASHA stops.
    Returns when every trial has ended, or all were stopped by ``interrupt``."""
    import logging

    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler
    from ray.tune.search import BasicVariantGenerator

    from fedsuite.launch import reaper
    from fedsuite.launch.processes import fedsuite_first
    from fedsuite.launch.simulation import lean_private_ray

    class RecordingASHA(ASHAScheduler):
        """ASHA, noting the trials it stops (a partial run of one of them is "stopped early", of any
        other "interrupted")."""

        def on_trial_result(self, tune_controller, trial, result):
            decision = super().on_trial_result(tune_controller, trial, result)
            if decision == TrialScheduler.STOP:
                stopped.add(trial.trial_id)
            return decision

    key = id(interrupt)  # Tune pickles its run config: the stopper and callback reach these through _live

    class Stopper(tune.Stopper):
        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            return False

        def stop_all(self) -> bool:
            return _live(key)[1].stop_all()

    env = fedsuite_first(os.environ)  # the trials' runs get the search's environment, not Tune's settings
    ray_tmpdir = reaper.make_ray_tmpdir(folder)
    scheduler = (RecordingASHA(time_attr="round", max_t=rounds, grace_period=grace, reduction_factor=REDUCTION_FACTOR)
                 if search == "asha" else FIFOScheduler())
    saved = {key: os.environ.get(key) for key in (*TUNE_ENV, "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO")}
    os.environ.update(TUNE_ENV)
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # trials' runs see the GPUs (their clients do)
    # Tune logs a failed trial's traceback and its own progress: the search says each trial's end in one line
    quiet = {name: logging.getLogger(name).level for name in ("ray.tune", "ray.train", "ray.air")}
    for name in quiet:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    _LIVE[key] = (console, interrupt)
    try:
        # Tune's own Ray only places the trials (a trial is a process that starts a run, one CPU each:
        # --jobs at a time); the runs' clients go to their own private Ray, or to --ray-address. It
        # starts without the daemons Tune does not use either (API server, autoscaler monitor, log
        # monitor: simulation.lean_private_ray)
        lean_private_ray()
        ray.init(num_cpus=jobs, num_gpus=0, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                 _temp_dir=str(ray_tmpdir / "ray"))
        tuner = tune.Tuner(
            tune.with_resources(trainable(folder, config, base_set, seed, rounds, placement, env), {"cpu": 1}),
            param_space={r.key: r.domain() for r in space},
            tune_config=tune.TuneConfig(metric="test_accuracy", mode="max", num_samples=samples, scheduler=scheduler,
                                        search_alg=BasicVariantGenerator(max_concurrent=jobs, random_state=seed)),
            run_config=tune.RunConfig(name="tune", storage_path=str(folder), verbose=0, stop=Stopper(),
                                      callbacks=[trial_lines(folder, rounds, stopped, key)],
                                      failure_config=tune.FailureConfig(max_failures=0),
                                      # the run directory is the trial's checkpoint: Tune keeps none
                                      checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False)),
        )
        try:
            tuner.fit()
        except KeyboardInterrupt:  # a second signal: Tune is left at once
            pass
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmpdir, ignore_errors=True)
        _LIVE.pop(key, None)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for name, level in quiet.items():
            logging.getLogger(name).setLevel(level)


#: the console and :class:`Interrupt` of each search running in this process, by key: Tune pickles
#: its run config, so its stopper and callbacks hold the key (:func:`_live` is pickled by name)
_LIVE: dict[int, tuple[Any, Interrupt]] = {}


def _live(key: int) -> tuple[Any, Interrupt]:
    return _LIVE[key]


def trial_lines(folder: Path, rounds: int, stopped: set[str], key: int):
    """A Tune callback (in the search's process) that prints one line per trial that ends, on the
    console of the search ``key`` (:data:`_LIVE`), as a grid's queue prints one per run: completed;
    stopped early by ASHA; interrupted; failed, with the reason its run's ``summary.json`` gives
    (the trial's record, :func:`trial_outcome`); each with its run folder."""
    from ray import tune

    class TrialLines(tune.Callback):
        def line(self, trial: Any, error: BaseException | None = None) -> None:
            console = _live(key)[0]
            record_path = folder / "trials" / f"{trial.trial_id}.json"
            if not record_path.is_file():  # never set up: not a trial of ours to speak of
                if error is not None:
                    console.print(f"{'failed':13s} trial {trial.trial_id}: {_last_line(error)}", soft_wrap=True)
                return
            record = json.loads(record_path.read_text())
            run_dir = record_path.with_suffix("")
            outcome = trial_outcome(run_dir, rounds, record.get("error"), trial.trial_id in stopped)
            if outcome.startswith("failed") and record.get("error") is None and error is not None:
                outcome = f"failed: {_last_line(error)}"  # the trial itself failed, not its run
            if outcome.startswith("failed"):  # "failed: its run: failed, stopped after round r: why (exit, log)"
                word, detail = "failed", ": " + outcome.removeprefix("failed: ").removeprefix("its run: ").removeprefix(
                    "failed, ")
            else:  # "completed", "stopped early at round r of R", "interrupted at round r of R"
                word = outcome.split(" at round")[0]
                detail = outcome[len(word):]
            console.print(f"{word:13s} trial {trial.trial_id} ({setting_label(record['setting'])}){detail} -> {run_dir}",
                          soft_wrap=True)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.line(trial)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.line(trial, getattr(trial, "error", None) or None)

    return TrialLines()


def _last_line(error: Any) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1] if lines else "error"


@dataclass
class _Planned:
    """What the checks before a search (``fedsuite.queues.reproduce.queue.missing_data`` and ``check_runs``)
    read of its runs: a label, a config and its dataset."""

    label: str
    cfg: Any

    @property
    def dataset(self) -> tuple[str, str, str]:
        return self.cfg.dataset, self.cfg.data_root, json.dumps(self.cfg.dataset_options, sort_keys=True)


def read_trials(folder: Path, stopped: set[str] = frozenset()) -> list[dict[str, Any]]:
    """Every trial the search started (``trials/<trial>.json``, written as it starts): its id,
    setting, run directory, rounds and outcome (:func:`trial_outcome`; ``stopped``: the trials ASHA
    stopped), in the order they started."""
    trials = []
    for path in (folder / "trials").glob("*.json"):
        record = json.loads(path.read_text())
        run_dir = path.with_suffix("")
        trials.append({**record, "run_dir": run_dir, "outcome": trial_outcome(
            run_dir, record["rounds"], record.get("error"), record["trial"] in stopped)})
    return sorted(trials, key=lambda t: t["started"])


def trial_outcome(run_dir: Path, rounds: int, error: str | None, stopped_by_asha: bool = False) -> str:
    """What became of a trial: ``completed``; ``stopped early at round r of R`` (ASHA stopped it: the
    run is partial; r = R when the stop landed after the run's last round but before its summary,
    since a run trains on while Tune decides); ``interrupted at round r of R`` (a partial run that
    ASHA did not stop: the search, or the run, was interrupted; ``--resume`` continues it);
    ``failed: why`` (a run whose record is damaged too: ``rundir.state``)."""
    now = rundir.state(run_dir)
    if error is not None or now in ("failed", "new", "debris", "damaged"):
        return "failed: " + (error or rundir.why_incomplete(run_dir, "its run"))
    if now == "completed":
        return "completed"
    return f"{'stopped early' if stopped_by_asha else 'interrupted'} at round {rundir.rounds_done(run_dir)} of {rounds}"


def write_report(trials: Sequence[dict[str, Any]], folder: Path, rounds: int, last: int, search: str,
                 samples: int | None = None) -> Path:
    """``report.md``, ``trials.csv`` and ``accuracy.png`` (one curve per trial) in ``folder``: every
    trial, and, of ``samples``, those that never started (an interrupted search), each a row with
    no setting; the trials that did not complete are named once more below the table, an
    interrupted one with the command that continues its run."""
    from fedsuite.records.plots import plot_groups
    from fedsuite.records.results import evaluations, run_value
    from fedsuite.records.rundir import read_metrics
    from fedsuite.launch.runner import CLI

    samples = len(trials) if samples is None else samples
    rows, curves = [], {}
    for t in trials:
        metrics = read_metrics(t["run_dir"], tolerant=True)
        evals = evaluations(metrics)
        reading = run_value(evals, "accuracy", last)[0] if evals else None
        rows.append({"trial": t["trial"], **{k: _text(v) for k, v in t["setting"].items()}, "outcome": t["outcome"],
                     "rounds": rundir.rounds_done(t["run_dir"]), "reading": reading, "run_dir": str(t["run_dir"])})
        if evals:
            curves[f"{t['trial']} {setting_label(t['setting'])}"] = [metrics]
    rows.sort(key=lambda r: -1 if r["reading"] is None else r["reading"], reverse=True)
    never = max(0, samples - len(trials))
    rows += [{"trial": "-", "outcome": "never started", "rounds": 0, "reading": None, "run_dir": ""}] * never
    md = [f"# Search: {folder.name} ({search}, {samples} trials)", "",
          f"Reading: each trial's mean test accuracy over its last {last} evaluations (a stopped trial: "
          "over those it did). Sorted by reading.", "",
          "| trial | setting | outcome | rounds | reading (%) |", "|---|---|---|---|---|"]
    by_id = {t["trial"]: t for t in trials}
    for r in rows:
        reading = "-" if r["reading"] is None else f"{r['reading']:.2f}"
        setting = setting_label(by_id[r["trial"]]["setting"]) if r["trial"] in by_id else "-"
        md.append(f"| {r['trial']} | {setting} | {r['outcome']} | {r['rounds']} | {reading} |")
    completed = [r for r in rows if r["outcome"] == "completed" and r["reading"] is not None]
    md += ["", f"Best completed trial: **{completed[0]['trial']}** ({completed[0]['reading']:.2f}), "
           f"run directory `{completed[0]['run_dir']}`" if completed else "No trial completed."]
    incomplete = [f"- {t['trial']} ({setting_label(t['setting'])}): {t['outcome']}"
                  + (f"; continue its run with `{CLI.resume(t['run_dir'])}`" if t["outcome"].startswith("interrupted")
                     else "") for t in trials if not t["outcome"].startswith(("completed", "stopped early"))]
    if never:
        incomplete.append(f"- {never} of the {samples} trials never started (the search was interrupted before "
                          "them): the same command with another --name runs the search again, drawing the same "
                          "settings (the sampling is seeded)")
    if incomplete:
        md += ["", "Trials that did not complete:", "", *incomplete]
    if curves:
        plot_groups(curves, folder / "accuracy.png", title=f"search {folder.name}: one curve per trial")
        md += ["", "![accuracy](accuracy.png)"]
    (folder / "report.md").write_text("\n".join(md) + "\n")
    fields = list(dict.fromkeys(["trial", *(k for r in rows for k in r if k not in ("trial", "outcome", "rounds",
                                                                              "reading", "run_dir")),
                                 "outcome", "rounds", "reading", "run_dir"]))
    with (folder / "trials.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)
    return folder / "report.md"
