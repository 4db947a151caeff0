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
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel

from fedsuite.method.activity import Component
from fedsuite.method.messages import Records
from fedsuite.method.params import Params


class NoParams(Params):
    """Hyperparameters of a method that has none of its own."""


@dataclass(frozen=True)
class MethodSpec:
    """A registered federated method.

    ``strategy`` is a server-rule class (``fedsuite.method.strategy.FedSuiteStrategy`` subclass),
    ``client`` a client-rule class (``fedsuite.method.training.ClientRule`` subclass), ``params`` the pydantic
    model of the method's own hyperparameters (the TOML section ``[<name>]``).

    Plug-ins (``fedsuite.method.plugins``): ``enables`` maps a plug-in the method switches on itself to a
    function ``cfg -> {field: value}`` giving the plug-in's settings when the run's own section
    leaves it off (a run that switches it on itself wins); ``refuses`` maps a plug-in the method
    cannot take to the reason. Config validation enforces both on every path (CLI, TOML files,
    ``flwr run``), see :func:`plugin_params`.

    ``components``: the method's own distinguishing components (``fedsuite.method.activity.Component``:
    FedMRUR's hyperbolic regulariser), whose activity measure its client rule reports every round.

    ``records``: the records the method's halves exchange beyond the engine's own
    (``fedsuite.method.wire.Records``, declared once in its client module): the server checks every reply
    against them, the ClientApp every message.
    """

    name: str
    strategy: type
    client: type
    params: type[BaseModel]
    summary: str
    paper: str = ""
    enables: dict[str, Callable[[Any], dict[str, Any]]] = field(default_factory=dict)
    refuses: dict[str, str] = field(default_factory=dict)
    #: ``cfg -> [warning, ...]``: settings under which the method is known to fail, each naming the
    #: risk and a setting that works; printed by ``fedsuite simulate`` and logged by the ServerApp
    warnings: Callable[[Any], list[str]] | None = None
    components: tuple[Component, ...] = ()
    records: Records = Records()

    def risks(self, cfg: Any) -> list[str]:
        """The method's warnings for this run's config (none if it declares no ``warnings``)."""
        return list(self.warnings(cfg)) if self.warnings is not None else []


_METHODS: dict[str, MethodSpec] = {}
_LOADED = False


def _plugins() -> dict[str, Any]:
    """``fedsuite.method.plugins.PLUGINS``, imported on first use: the plug-ins' client code imports torch
    and Flower, which reading a config or a run's records (``fedsuite.config``, ``fedsuite.records.results``,
    ``fedsuite report``) does not need."""
    from fedsuite.method.plugins import PLUGINS

    return PLUGINS


def register_method(
    name: str,
    *,
    strategy: type,
    client: type,
    summary: str,
    params: type[BaseModel] = NoParams,
    paper: str = "",
    enables: dict[str, Callable[[Any], dict[str, Any]]] | None = None,
    refuses: dict[str, str] | None = None,
    warnings: Callable[[Any], list[str]] | None = None,
    components: tuple[Component, ...] = (),
    records: Records = Records(),
) -> MethodSpec:
    """Register a method under ``name`` (called at import time of ``strategies/<name>.py``)."""
    if name in _METHODS and _METHODS[name].strategy is not strategy:
        raise ValueError(f"method {name!r} is registered twice")
    enables, refuses = dict(enables or {}), dict(refuses or {})
    unknown = sorted((set(enables) | set(refuses)) - set(_plugins()))
    if unknown:
        raise ValueError(f"method {name!r} names unknown plug-ins {unknown}; known: {sorted(_plugins())}")
    if set(enables) & set(refuses) or any(not str(why).strip() for why in refuses.values()):
        raise ValueError(f"method {name!r}: a plug-in is both enabled and refused, or refused without a reason")
    spec = MethodSpec(name, strategy, client, params, summary, paper, enables, refuses, warnings, tuple(components),
                      records)
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
    return {name: plugin.params for name, plugin in _plugins().items()}


def components() -> dict[str, Component]:
    """Every distinguishing component by name (``fedsuite.method.activity``): the plug-ins' and the
    registered methods' (a component two methods share is listed once)."""
    found = [plugin.component for plugin in _plugins().values() if plugin.component is not None]
    found += [c for spec in methods().values() for c in spec.components]
    return {c.name: c for c in sorted(found, key=lambda c: c.name)}


def run_components(cfg: Any) -> list[Component]:
    """The components a run uses, whose measures its clients report: its method's own, then those
    of the plug-ins it switches on (:func:`plugin_params`), in ``PLUGINS`` order."""
    found = list(methods()[cfg.strategy].components)
    known = _plugins()
    found += [known[name].component for name in plugin_params(cfg) if known[name].component is not None]
    return found


def plugin_params(cfg: Any) -> dict[str, BaseModel]:
    """The settings of every plug-in this run switches on, by name, in ``PLUGINS`` order: those
    its config sections switch on, and those its method ``enables`` (with the method's settings,
    unless the run's section switched the plug-in on itself). Raises ``ValueError`` for a plug-in
    the method ``refuses``, naming the method and the reason."""
    spec = methods()[cfg.strategy]
    out: dict[str, BaseModel] = {}
    for name, plugin in _plugins().items():
        params = getattr(cfg, name)
        if plugin.enabled(params):
            if name in spec.refuses:
                raise ValueError(f"{name} does not apply to {spec.name}: {spec.refuses[name]}")
        elif name in spec.enables:
            params = params.model_copy(update=spec.enables[name](cfg))
        if plugin.enabled(params):
            out[name] = params
    return out

