"""The options and value lists the ``fedsuite`` commands share, so that one idea has one spelling
and one help text wherever it appears (tests/test_cli_text.py): ``--engine``, ``--data-root``,
``--last``, the config file and the data and partition options of ``simulate`` and ``partition``;
and the names a :class:`~fedsuite.cli.support.Names` parameter shows in ``--help``, each read from
its owner when the help is shown (a registry, the reproduce tables, the searches), never at start-up.
Light imports only: ``fedsuite.cli.main`` imports this at start-up.
"""

from __future__ import annotations

from typing import Any, Callable

import typer

from fedsuite.cli.support import Names


def registry_names(kind: str) -> Callable[[], list[str]]:
    """The names of one registry (``methods``, ``datasets``, ``partitioners``, ``models``), for
    :class:`Names`: read when ``--help`` shows them."""

    def names() -> list[str]:
        from fedsuite.method import registry

        return sorted(getattr(registry, kind)())

    return names


def neuron_lr_presets() -> list[str]:
    from fedsuite.method.plugins.neuron_lr import PRESETS

    return list(PRESETS)


def search_kinds() -> list[str]:
    from fedsuite.queues.search import SEARCHES

    return list(SEARCHES)


def reproduce_scales() -> list[str]:
    from fedsuite.queues.reproduce.tables import SCALES

    return list(SCALES)


def reproduce_targets() -> list[str]:
    from fedsuite.queues.reproduce.tables import target_names

    return [*target_names(), "list"]


#: ``--engine`` of simulate, sweep and reproduce (config key ``engine``; it never changes a run's numbers)
ENGINE_OPTION = typer.Option(None, "--engine", click_type=Names(("flower", "inprocess")),
                             help="what runs the clients: flower (Flower's Simulation Engine, Ray; the default) or "
                             "inprocess (every client called in the run's own process: no Ray, for tests, debugging "
                             "and quick runs; the same numbers)")


#: ``--data-root`` of simulate, sweep and reproduce (config key ``data_root``; simulate shows the
#: config's default, sweep and reproduce pass it to every run, else each run's config says)
DATA_ROOT_OPTION = typer.Option(None, "--data-root", show_default="the runs' config's data_root",
                                help="where the datasets are (config key data_root)")

#: the options ``simulate`` and ``partition`` share: the config file and the data and partition it
#: describes (an option left out takes its value from the config file, else the config's default)
CONFIG_OPTION = typer.Option(None, "--config", "-c", help="TOML config file (default: none, the defaults shown here)")
DATASET_OPTION = typer.Option(None, click_type=Names(registry_names("datasets")), help="dataset name")
PARTITIONER_OPTION = typer.Option(None, click_type=Names(registry_names("partitioners")), help="partitioner name")
ALPHA_OPTION = typer.Option(None, help="Dirichlet concentration")
CLASSES_PER_CLIENT_OPTION = typer.Option(None, help="classes per client (pathological)")
NUM_CLIENTS_OPTION = typer.Option(None, help="number of clients")

#: ``--last`` of report and sweep: one reading of a run (``fedsuite.records.results.run_value``) for both
LAST_DEFAULT = 10
LAST_OPTION = typer.Option(LAST_DEFAULT, "--last", help="a run's reading: the mean of its last k evaluations "
                           "(all of them if it has fewer)")


def common_values(**options: Any) -> dict[str, Any]:
    """The options given (not None), as config values."""
    return {k: v for k, v in options.items() if v is not None}
