"""A search's trials on Ray Tune (:mod:`fedsuite.queues.search`): the trainable that runs one trial
as a ``fedsuite simulate`` run and reports its evaluations (:func:`trainable`), Tune's run of the
search on a private Ray of its own, with ASHA or without (:func:`run_tune`), one line per trial that
ends (:func:`trial_lines`), and the signals that stop it (:class:`Interrupt`). Ray and Tune are
imported inside the functions that use them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

from fedsuite.records import rundir
from fedsuite.queues.search_report import trial_outcome
from fedsuite.queues.search_space import Range, trial_run
from fedsuite.queues.study import setting_label

#: ASHA's reduction factor: at each rung the better half goes on
REDUCTION_FACTOR = 2
#: exit codes of a ``fedsuite simulate`` run stopped from outside (SIGINT: 130; SIGTERM: 143; or
#: killed by either before its handler): it keeps its rounds and checkpoint, and ``--resume`` goes on
STOPPED_CODES = (130, 143, -2, -15)
#: Ray Tune's settings for a search (environment variables its driver reads): SIGINT and SIGTERM are
#: the search's (:class:`Interrupt`); no result files or progress tables of Tune's own (the trials'
#: runs hold the results, and the search prints one line per trial)
TUNE_ENV = {"TUNE_DISABLE_SIGINT_HANDLER": "1", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1", "RAY_AIR_NEW_OUTPUT": "0"}


class FedsuiteTrial:
    """A Tune trainable (built by :func:`trainable`): one ``fedsuite simulate`` run, one Tune result
    per evaluation. ``step`` waits for the run's next evaluated round in ``metrics.jsonl``; the
    run's end gives ``done`` (completed) or an error (failed: Tune marks the trial ERROR);
    ``cleanup`` (a trial stopped by the scheduler, or the search interrupted) stops the run's
    process tree with SIGTERM, as Ctrl-C would."""


def trainable(folder: Path, config: Path | None, base_set: Sequence[str], seed: int, rounds: int,
              placement: Sequence[str], env: dict[str, str], poll_s: float = 0.5):
    """The :class:`FedsuiteTrial` class for a search writing its runs under ``folder/trials``.
    ``env``: the environment the runs start with (the search's own, not a Tune worker's)."""
    from ray import tune

    from fedsuite.launch import reaper
    from fedsuite.launch.processes import stop_tree
    from fedsuite.queues.reproduce.queue import simulate_command
    from fedsuite.records.rows import read_metrics

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


def run_tune(search: str, space: Sequence[Range], samples: int, grace: int, rounds: int, config: Path | None,
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
    (the trial's record, ``search_report.trial_outcome``); each with its run folder."""
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
            label = setting_label(record["setting"])
            console.print(f"{word:13s} trial {trial.trial_id} ({label}){detail} -> {run_dir}",
                          soft_wrap=True)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.line(trial)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.line(trial, getattr(trial, "error", None) or None)

    return TrialLines()


def _last_line(error: Any) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1] if lines else "error"
