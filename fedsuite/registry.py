"""One registry for everything that is looked up by name: methods, datasets, partitioners, models.

The CLI (`fedsuite list`), the config validation and the README all read these tables, so a name
exists everywhere or nowhere.

A *method* is a pair (server rule, client rule) plus a pydantic model of its hyperparameters.
Methods register themselves from their module in ``strategies/`` with :func:`register_method`;
:func:`methods` imports every module of that package once.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from fedsuite.plugins import PLUGINS


class NoParams(BaseModel):
    """Hyperparameters of a method that has none of its own."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class MethodSpec:
    """A registered federated method.

    ``strategy`` is a server-rule class (``fedsuite.strategy.FedSuiteStrategy`` subclass),
    ``client`` a client-rule class (``fedsuite.training.ClientRule`` subclass), ``params`` the pydantic
    model of the method's own hyperparameters (the TOML section ``[<name>]``).
    ``relaxed_init`` / ``neuron_lr`` say whether the plug-ins apply: ``True`` or a string saying
    why not.
    """

    name: str
    strategy: type
    client: type
    params: type[BaseModel]
    summary: str
    paper: str = ""
    relaxed_init: bool | str = True
    neuron_lr: bool | str = True


_METHODS: dict[str, MethodSpec] = {}
_LOADED = False


def register_method(
    name: str,
    *,
    strategy: type,
    client: type,
    summary: str,
    params: type[BaseModel] = NoParams,
    paper: str = "",
    relaxed_init: bool | str = True,
    neuron_lr: bool | str = True,
) -> MethodSpec:
    """Register a method under ``name`` (called at import time of ``strategies/<name>.py``)."""
    if name in _METHODS and _METHODS[name].strategy is not strategy:
        raise ValueError(f"method {name!r} is registered twice")
    spec = MethodSpec(name, strategy, client, params, summary, paper, relaxed_init, neuron_lr)
    _METHODS[name] = spec
    return spec


def methods() -> dict[str, MethodSpec]:
    """All registered methods, importing every module of the ``strategies`` package once."""
    global _LOADED
    if not _LOADED:
        import strategies

        for info in sorted(pkgutil.iter_modules(strategies.__path__), key=lambda m: m.name):
            if not info.name.startswith("_"):
                importlib.import_module(f"strategies.{info.name}")
        _LOADED = True
    return dict(sorted(_METHODS.items()))


def datasets() -> dict[str, Callable[..., Any]]:
    from fedsuite.data import DATASETS

    return dict(DATASETS)


def partitioners() -> dict[str, Callable[..., Any]]:
    from fedsuite.data import PARTITIONERS

    return dict(PARTITIONERS)


def models() -> dict[str, Callable[..., Any]]:
    from fedsuite.models import MODELS

    return dict(MODELS)


def plugins() -> dict[str, type[BaseModel]]:
    """Client-rule plug-ins that combine with any method: section name -> params model."""
    return {name: plugin.params for name, plugin in PLUGINS.items()}
