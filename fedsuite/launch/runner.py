"""One ``fedsuite simulate`` run, from its settings to its outcome: what the CLI command
(``fedsuite.cli.main.simulate``) and the Python API (``fedsuite.simulate``, ``fedsuite.launch.api``) both call.

:func:`run_simulation`

1. starts the run's simulation process (``launch.simulation_process``): it imports torch and
   Flower's engine on the second core while this process builds the config (not for a run its
   inputs put on the in-process engine, :func:`engine_asked`, which has no such process: it would
   import torch and be called off, 4 CPU-seconds for nothing);
2. builds the config as ``--config``, the options and ``--set`` give it (``config.build_config``;
   with ``resume``, the run's recorded config is the base: ``rundir.resume_config``) and checks the
   hardware it asks for (``runtime.check_hardware``);
3. checks the run's folder: it holds no run (unless resumed) and can be written;
4. runs it (``launch.simulate``): the data is checked while Ray starts (``runtime.check_data``), then
   what runs, the method's warnings and the progress bar are printed on ``console`` (None: nothing is);
5. says how it ended: returns the outcome of a run that completed (or was complete already), raises
   :class:`~fedsuite.errors.RunFailed` for one that did not, and :class:`~fedsuite.errors.RunInterrupted`
   (a ``KeyboardInterrupt``) on Ctrl-C once every process of the run has stopped; a Ctrl-C after
   the run recorded itself completed (while its processes are stopped) is no interruption: the
   completed run's outcome is returned.

Bad input is raised before anything is written: ``ConfigError``, ``DataError``, ``RunDirError``
(``fedsuite.errors``). The messages name options the way the caller's interface spells them
(:class:`Spelling`: the CLI's ``--run-name``, Python's ``run_name``). Light imports only: the CLI
imports this module before its simulation process has started.
"""

from __future__ import annotations

import shlex
import tomllib
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from fedsuite.errors import ConfigError, RunFailed, RunInterrupted

if TYPE_CHECKING:
    from rich.console import Console

    from fedsuite.config import BaseRunConfig
    from fedsuite.launch.start import RunOutcome


@dataclass(frozen=True)
class Spelling:
    """How the caller's interface names things in :func:`run_simulation`'s messages."""

    cli: bool

    @property
    def invocation(self) -> str:
        return "command" if self.cli else "call"

    def option(self, key: str) -> str:
        """A config key as the caller sets it: ``--run-name``, or ``run_name``."""
        return "--" + key.replace("_", "-") if self.cli else key

    def flag(self, key: str) -> str:
        """A switch turned on: ``--resume``, or ``resume=True``."""
        return "--" + key.replace("_", "-") if self.cli else f"{key}=True"

    def resume(self, run_dir: Path) -> str:
        """What continues the run in ``run_dir`` (its recorded config is the base: nothing else is needed)."""
        if self.cli:
            return shlex.join(["fedsuite", "simulate", "--resume", "--output-dir", str(run_dir.parent),
                               "--run-name", run_dir.name])
        return f"fedsuite.simulate(resume=True, output_dir={str(run_dir.parent)!r}, run_name={run_dir.name!r})"


CLI = Spelling(cli=True)
PYTHON = Spelling(cli=False)


def run_simulation(config: Path | None, overrides: Sequence[str], values: dict[str, Any], *, resume: bool = False,
                   console: Console | None = None, spelling: Spelling = CLI) -> RunOutcome:
    """Run one simulation as ``fedsuite simulate`` does (the module's steps). ``config``: a TOML file;
    ``values``: config keys (dotted for sections: ``fedprox.mu``) and their typed values, over the
    file's; a section may be given as a dict (``{"fedprox": {"mu": 0.1}}``), which sets the keys it
    holds and leaves the file's others; ``overrides``: ``key=value`` texts (``--set``), which win.
    Returns the outcome of a completed run; raises as the module says."""
    from fedsuite.launch import start as launch# light: it imports torch and the registry only where a function needs them

    run_dir: Path | None = None  # the run's folder once the config names it: an interruption says how to continue it
    total_rounds = 0
    try:
        # started first: its imports use the second core while this process builds the config
        prestart = engine_asked(config, overrides, values) != "inprocess"
        with launch.simulation_process() if prestart else nullcontext() as process:
            from fedsuite.records import rundir
            from fedsuite.records.hold import start_debris
            from fedsuite.records.paths import folder_problem
            from fedsuite.engine import runtime

            cfg = resolve_config(config, overrides, values, resume)
            runtime.check_hardware(cfg)
            run_dir, total_rounds = rundir.default_run_dir(cfg), cfg.rounds
            if run_dir.exists() and not resume and not start_debris(run_dir):
                raise ConfigError(f"run directory {run_dir} exists; choose another {spelling.option('run_name')} "
                                  f"or pass {spelling.flag('resume')}")
            problem = folder_problem(run_dir)
            if problem is not None:
                raise ConfigError(f"output_dir: {problem}")
            outcome = _launch(cfg, run_dir, process, console)
    except KeyboardInterrupt:  # launch.simulate has stopped the run's processes by now
        if run_dir is None or not completed(run_dir, total_rounds):
            raise RunInterrupted(interrupted_message(run_dir, total_rounds, spelling), run_dir) from None
        # Ctrl-C while the run's processes were stopped after the ServerApp recorded it complete:
        # nothing was interrupted, and there is nothing for --resume to continue
        from fedsuite.launch.start import RunOutcome

        outcome = RunOutcome(run_dir, "finished:completed", "")
    return _ending(cfg, outcome, console, spelling)


def completed(run_dir: Path, rounds: int) -> bool:
    """Whether the run in ``run_dir`` has recorded itself completed after its ``rounds`` rounds."""
    from fedsuite.records import rundir

    return rundir.summary_status(run_dir) == ("finished:completed", "") and rundir.rounds_done(run_dir) >= rounds


def engine_asked(config: Path | None, overrides: Sequence[str], values: dict[str, Any]) -> str | None:
    """The ``engine`` the inputs name before the config is built, by the precedence
    :func:`resolve_config` gives them (``overrides`` < ``values`` < the file), or None where none
    names it (a resumed run's recorded engine is not read here). A file that cannot be read names
    none: building the config reports it."""
    for item in reversed(list(overrides)):
        key, _, value = item.partition("=")
        if key.strip() == "engine":
            return value.strip().strip("\"'")
    if values.get("engine") is not None:
        return str(values["engine"])
    if config is not None:
        try:
            engine = tomllib.loads(Path(config).read_text()).get("engine")
        except (OSError, ValueError):
            return None
        return engine if isinstance(engine, str) else None
    return None


def resolve_config(config: Path | None, overrides: Sequence[str], values: dict[str, Any],
                   resume: bool = False) -> BaseRunConfig:
    """The run's config, as :func:`run_simulation` takes its inputs: defaults < ``config`` <
    ``values`` < ``overrides`` (``config.build_config``), a section given as a dict setting only the
    keys it holds; with ``resume``, the recorded config of the run they name is the base, and only
    ``config.RESUME_MUTABLE`` may differ from it (``rundir.resume_config``). ``ConfigError`` if not
    valid, or if ``values`` or ``overrides`` set a method's or plug-in's setting that the run does not
    use (``config.check_settings_used``: ``fedprox.mu`` on a FedAvg run), which it would drop."""
    from fedsuite.records import rundir
    from fedsuite.config import build_config, check_settings_used, flat_config, setting_keys

    values = flat_config(values)  # {"fedprox": {"mu": 0.1}} -> {"fedprox.mu": 0.1}
    cfg = build_config(config, list(overrides), values)
    if resume:  # the run's record is the base; the caller may change only RESUME_MUTABLE
        cfg = rundir.resume_config(cfg, config, list(overrides), values)
    check_settings_used(cfg, setting_keys(list(overrides), values))
    return cfg


def _launch(cfg: BaseRunConfig, run_dir: Path, process: Any, console: Console | None) -> RunOutcome:
    """``launch.simulate`` with the data check while Ray starts and, on ``console``, what runs and its progress."""
    from rich.text import Text

    from fedsuite.launch import start as launch
    from fedsuite.launch.watch import LaunchError
    from fedsuite.engine import runtime
    from fedsuite.cli.support import RunProgress

    starting = "starting Flower" if cfg.engine == "flower" else "starting"
    progress = RunProgress(cfg.rounds, console, starting) if console is not None else None

    def begin() -> None:
        """Check the data (``launch.simulate``'s ``before_start``: while the simulation process starts
        Ray), then say what runs and show the progress bar."""
        runtime.check_data(cfg)
        if progress is None:  # no console
            return
        console.print(Text.assemble(("fedsuite", "bold"), f" {cfg.strategy} on {cfg.dataset} ({cfg.partitioner}), "
                                    f"{cfg.num_clients} clients, K={cfg.cohort_size}, {cfg.rounds} rounds "
                                    f"-> {run_dir}"))
        for risk in cfg.method.risks(cfg):
            console.print(Text.assemble(("warning:", "yellow"), f" {risk}"))
        progress.begin()

    try:
        return launch.simulate(cfg, run_dir, progress.show if progress is not None else None, before_start=begin,
                               process=process)
    except LaunchError as exc:  # the stall watchdog stopped it
        raise RunFailed(str(exc), run_dir) from None
    finally:
        if progress is not None:
            progress.stop()


def _ending(cfg: BaseRunConfig, outcome: RunOutcome, console: Console | None, spelling: Spelling) -> RunOutcome:
    """Say how the run ended: a line on ``console``, or :class:`RunFailed`."""
    from fedsuite.records import rundir

    run_dir = outcome.run_dir
    if not outcome.ran:
        if console is not None:
            console.print(f"{run_dir} is complete ({cfg.rounds} rounds): nothing was run or changed; "
                          f"pass a larger {spelling.option('rounds')} to continue it")
        return outcome
    summary = rundir.summary(run_dir)
    if not outcome.ok:
        # outcome.details: the failed replies' message, error.txt's last line, or the process's exit
        # code; a failure Flower logged is more telling than the last two
        detail = outcome.details if "failure" in summary else (rundir.flower_log_reason(run_dir) or outcome.details)
        # the in-process engine has no simulation process, hence no flower.log: its traceback is error.txt
        logs = run_dir / ("flower.log" if cfg.engine == "flower" else "error.txt")
        raise RunFailed(f"run {outcome.status}: {detail} (logs: {logs})", run_dir)
    if console is not None:
        acc = summary.get("final_accuracy")
        failed = summary.get("failed_replies", 0)
        note = f" ({failed} failed client replies in {summary.get('rounds_with_failures')} rounds)" if failed else ""
        console.print(f"done: final accuracy {100 * acc:.2f}%{note}" if acc is not None else f"done{note}",
                      f"-> {run_dir}")
    return outcome


def interrupted_message(run_dir: Path | None, rounds: int, spelling: Spelling) -> str:
    """What an interrupted run kept and what continues it (``--resume``, which needs only the run's
    folder: its recorded config is the base, see ``rundir.resume_config``)."""
    from fedsuite.records import rundir

    if run_dir is None or not (run_dir / "config.json").is_file():
        # before the ServerApp recorded the run: launch.simulate removed what it had created, or left
        # a start-up's debris, which the next start of the same run clears (hold.start_debris)
        return f"interrupted before the run started; nothing to continue: the same {spelling.invocation} starts it"
    return (f"interrupted after round {rundir.rounds_done(run_dir)} of {rounds}; continue the run with: "
            f"{spelling.resume(run_dir)}")
