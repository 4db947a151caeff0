"""The ``fedsuite`` command: the app, ``--version`` and ``simulate``; the other commands by group (below).

User errors (bad config, unknown names, missing data) print one ``error:`` line and exit with code 2
(``fedsuite.cli.support.fail``), and leave no run directory behind (the data check, ``runtime.check_data``,
runs while the simulation process starts, see ``launch.simulate``; a run it refuses is removed with
everything it started). Ctrl-C stops ``fedsuite simulate`` with the command that continues the run.
This module holds the app, ``--version`` and ``simulate``; the other commands are in modules of
``fedsuite.cli`` by what they do, each a ``commands`` group this module adds to the app (their
order is ``--help``'s): ``show`` (``list``, ``partition``, ``report``), ``deploy`` (``certs``,
``connection``, ``submit``, ``gateway``), ``queues`` (``sweep``, ``reproduce``); ``options``
holds the options and value lists they share, ``support`` what they share beyond options. A
command module holds the command's options and what it prints; the logic lives with the modules
that own it: ``runner`` (one ``simulate`` run, from its options to its outcome: the Python API's
``fedsuite.simulate`` runs the same code), ``launch`` (a run's processes), ``rundir`` (a run
directory, ``--resume``), ``runtime`` (the data and hardware checks), ``results`` (the report),
``certs``, ``sweep``, ``search``, ``reproduce``. Start-up imports are light: a command imports
what it runs (torch, Flower, Ray, the registry) inside its function.

Text is printed as written, never read as rich markup (``fedsuite.cli.support``: plain help, plain consoles).
Every option and argument has a help text; a parameter with a fixed set of values takes a
:class:`~fedsuite.cli.support.Names` type, whose set ``--help`` shows (tests/test_cli_text.py).

One spelling per idea across the commands: ``-h``/``--help`` on ``fedsuite`` and every command (set
once, on the app); ``--output-dir``, the folder a command writes its output in (simulate: the run's
folder; sweep: the sweep's; reproduce: a target's runs and reports; report: its files), and
``--out`` only for a single file (partition's figure); ``--data-root`` and ``--engine`` with one
help text wherever they are; ``--seeds`` read by one function (``fedsuite.cli.support.parse_seeds``:
``--seeds 0 1 2`` and ``--seeds 0,1,2`` alike); ``--last`` with one default (a run's reading, as
``report`` and ``sweep`` take it).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from fedsuite.cli import deploy, queues, show
from fedsuite.cli.options import (ALPHA_OPTION, CLASSES_PER_CLIENT_OPTION, CONFIG_OPTION, DATA_ROOT_OPTION,
                                  DATASET_OPTION, ENGINE_OPTION, NUM_CLIENTS_OPTION, PARTITIONER_OPTION, common_values,
                                  neuron_lr_presets, registry_names)
from fedsuite.cli.support import (CONFIG_KEYS, ConfigOptionsCommand, Names, OneLineUsageGroup, err_console, fail,
                                  plain_console)

# fedsuite.config and the registry (torch, pydantic, every method) are imported where a command
# needs them: `fedsuite simulate` first starts its simulation process, whose imports then run on
# the second core while this process does its own (fedsuite.launch.start.start_simulation_process).

#: ``-h`` and ``--help`` on ``fedsuite`` and, through click's context, on every command
HELP_OPTION_NAMES = ["-h", "--help"]

app = typer.Typer(cls=OneLineUsageGroup, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  context_settings={"help_option_names": HELP_OPTION_NAMES},
                  help="Federated-learning research suite on Flower.")
console = plain_console()


def _print_version(value: bool) -> None:
    """``--version``: fedsuite's version and the commit of the checkout it runs from, with a dirty
    flag (``fedsuite.records.provenance.code_version``; an installed package says it is not a checkout)."""
    if value:
        from fedsuite.records.provenance import code_version, version_line

        print(version_line(code_version()))
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", "-V", callback=_print_version, is_eager=True,
                                 help="print fedsuite's version and git commit, and exit"),
) -> None:
    """Federated-learning research suite on Flower."""


@app.command(cls=ConfigOptionsCommand)
def simulate(
    strategy: Optional[str] = typer.Option(None, "--strategy", "-s", click_type=Names(registry_names("methods")),
                                           help="method name (fedsuite list)"),
    config: Optional[Path] = CONFIG_OPTION,
    set_: list[str] = typer.Option([], "--set", help="override: key=value, e.g. fedprox.mu=0.01 (repeatable; a "
                                   "method's keys, types and defaults: fedsuite list strategies NAME)"),
    dataset: Optional[str] = DATASET_OPTION,
    partitioner: Optional[str] = PARTITIONER_OPTION,
    alpha: Optional[float] = ALPHA_OPTION,
    classes_per_client: Optional[int] = CLASSES_PER_CLIENT_OPTION,
    num_clients: Optional[int] = NUM_CLIENTS_OPTION,
    clients_per_round: Optional[int] = typer.Option(None, help="cohort size K (default: --fraction of the clients, "
                                                    "at least 1)"),
    fraction: Optional[float] = typer.Option(None, help="cohort fraction (if K unset)"),
    rounds: Optional[int] = typer.Option(None, help="federated rounds"),
    local_epochs: Optional[int] = typer.Option(None, help="local epochs"),
    batch_size: Optional[int] = typer.Option(None, help="local batch size"),
    lr: Optional[float] = typer.Option(None, help="local learning rate"),
    model: Optional[str] = typer.Option(None, click_type=Names(registry_names("models")), help="model name"),
    seed: Optional[int] = typer.Option(None, help="random seed"),
    output_dir: Optional[str] = typer.Option(None, "--output-dir", help="parent folder of the run's folder "
                                             "(OUTPUT_DIR/RUN_NAME)"),
    run_name: Optional[str] = typer.Option(None, "--run-name", help="the run's folder name (default: "
                                           "<strategy>-<dataset>-s<seed>-<date>-<time>)"),
    data_root: Optional[str] = DATA_ROOT_OPTION,
    num_cpus: Optional[int] = typer.Option(None, help="CPU cores per simulated client"),
    num_gpus: Optional[float] = typer.Option(None, help="GPU share per simulated client"),
    eval_every: Optional[int] = typer.Option(None, help="evaluate the global model every k rounds"),
    relaxed_init: Optional[float] = typer.Option(None, "--relaxed-init", help="FedInit's β: relaxed initialisation "
                                                 "on any method (default: off)"),
    neuron_lr: Optional[str] = typer.Option(None, "--neuron-lr", click_type=Names(neuron_lr_presets),
                                            help="FedNLR's neuron-wise lr preset on any method (default: off)"),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted run in the same run directory"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="run the clients on this Ray cluster "
                                              "(auto, host:port, ray://...; default: a private Ray for the run)"),
    engine: Optional[str] = ENGINE_OPTION,
) -> None:
    """Run one federated simulation on Flower's Simulation Engine (or, with --engine inprocess, in this process).

    An option left out takes its value from --config, else the default shown. Ctrl-C stops the run
    and prints the --resume command that continues it."""
    # light imports: the runner starts the simulation process before it imports torch and the registry
    from fedsuite.errors import ConfigError, DataError, RunDirError, RunFailed, RunInterrupted
    from fedsuite.launch.runner import CLI, run_simulation

    values = common_values(
        strategy=strategy, dataset=dataset, partitioner=partitioner, alpha=alpha,
        classes_per_client=classes_per_client, num_clients=num_clients, clients_per_round=clients_per_round,
        fraction=fraction, rounds=rounds, local_epochs=local_epochs, batch_size=batch_size, lr=lr, model=model,
        seed=seed, output_dir=output_dir, run_name=run_name, data_root=data_root, num_cpus=num_cpus,
        num_gpus=num_gpus, eval_every=eval_every, ray_address=ray_address, engine=engine,
    )
    for option, value in (("relaxed_init", relaxed_init), ("neuron_lr", neuron_lr)):
        if value is not None:
            values[CONFIG_KEYS[option]] = value
    # a SIGTERM (e.g. from `timeout` or a job scheduler) stops the run as Ctrl-C does: every process
    # we started is stopped, a run that had recorded itself completed ends "done" (exit 0), any other
    # says how to continue it, exit 143 (the handler is put back afterwards for a caller that invokes
    # the command in-process: tests)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        run_simulation(config, set_, values, resume=resume, console=console, spelling=CLI)
    except (ConfigError, DataError, RunDirError) as exc:  # bad input: nothing was written
        fail(str(exc))
    except RunFailed as exc:
        fail(str(exc), code=1)
    except RunInterrupted as exc:  # every process of the run has stopped: say how to continue it, exit 130 / 143
        err_console.print(str(exc), soft_wrap=True)
        raise typer.Exit(143 if isinstance(exc.__context__, Terminated) else 130) from None
    finally:
        if previous is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGTERM, previous)


class Terminated(KeyboardInterrupt):
    """SIGTERM during ``fedsuite simulate``: raised where Ctrl-C's KeyboardInterrupt would be, so that
    both stop a run by the same path (every process stopped; a completed run is no interruption)."""


def _terminated(signum, frame) -> None:
    raise Terminated()


# the command groups, each a module of fedsuite.cli whose commands follow simulate's in --help, in this order
app.add_typer(show.commands)
app.add_typer(deploy.commands)
app.add_typer(queues.commands)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
