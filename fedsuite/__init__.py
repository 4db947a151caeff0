"""fedsuite: a federated-learning research suite on Flower.

From a shell: the ``fedsuite`` command (``fedsuite.cli.main``). From Python (docs/python-api.md)::

    import fedsuite

    run = fedsuite.simulate(strategy="fedprox", dataset="fmnist", model="cnn", rounds=50, fedprox={"mu": 0.1})
    run.metrics                                # a pandas DataFrame, one row per round
    sweep = fedsuite.load_runs("runs/sweeps/lr")
    sweep.metrics.groupby([*sweep.keys, "round"]).test_accuracy.mean()

``import fedsuite`` stays cheap (the CLI's start-up depends on it): the exceptions come from
``fedsuite.errors``, which imports nothing, and the API's names (:data:`API`) are looked up in
``fedsuite.launch.api`` on first use (a module ``__getattr__``), which imports torch, Flower and pandas
only inside its functions. tests/test_api.py checks that the import pulls in none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedsuite.errors import (
    ConfigError,
    DataError,
    FedsuiteError,
    RecordError,
    ResultsError,
    RunDirError,
    RunFailed,
    RunInterrupted,
)

if TYPE_CHECKING:
    from fedsuite.launch.api import Run, Runs, load_run, load_runs, simulate

#: the names ``fedsuite.launch.api`` provides, imported on first use
API = ("simulate", "load_run", "load_runs", "Run", "Runs")

__all__ = [*API, "ConfigError", "DataError", "FedsuiteError", "RecordError", "ResultsError", "RunDirError",
           "RunFailed", "RunInterrupted"]


def __getattr__(name: str) -> Any:
    if name in API:
        from fedsuite.launch import api

        value = getattr(api, name)
        globals()[name] = value  # found here from now on, without this function
        return value
    raise AttributeError(f"module 'fedsuite' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *API})
