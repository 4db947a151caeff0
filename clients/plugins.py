"""Client-rule plug-ins that combine with any method (FedInit's relaxed initialisation, FedNLR's
neuron-wise learning rates).

A plug-in is a :class:`ClientPlugin` subclass registered in :data:`PLUGINS` under its config
section name. Its ``params`` model is the TOML section ``[<name>]``; :meth:`ClientPlugin.enabled`
says whether a run's config switches it on. The server side of a plug-in (if any) is
``server_hooks`` (see ``strategies.base``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from pydantic import BaseModel

from fedsuite.training import LocalResult, LocalTask

PLUGINS: dict[str, type["ClientPlugin"]] = {}


def register_plugin(cls: type["ClientPlugin"]) -> type["ClientPlugin"]:
    PLUGINS[cls.name] = cls
    return cls


class ClientPlugin(ABC):
    name: ClassVar[str]
    params: ClassVar[type[BaseModel]]

    def __init__(self, params: BaseModel) -> None:
        self.p = params

    @classmethod
    @abstractmethod
    def enabled(cls, params: BaseModel) -> bool:
        """Whether a run's section ``[<name>]`` switches the plug-in on."""

    def before_start(self, task: LocalTask) -> None:
        """Before the rule's own ``start`` hook."""

    def after_start(self, task: LocalTask) -> None:
        """After the rule's ``start`` hook; may move the start point."""

    def wrap_optimizer(self, task: LocalTask, opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return opt

    def after_finish(self, task: LocalTask, result: LocalResult) -> LocalResult:
        return result

    def server_hooks(self, strategy: Any) -> Any:
        """The plug-in's server side for ``strategy`` (a ``strategies.base.ServerHooks``), or None.
        Called once by every ``FedSuiteStrategy`` whose run switches the plug-in on."""
        return None


def plugin_classes() -> dict[str, type[ClientPlugin]]:
    """All plug-ins (modules ``clients/plugin_*.py`` register themselves on import)."""
    _load()
    return dict(PLUGINS)


def active_plugins(cfg: Any) -> list[ClientPlugin]:
    """The plug-ins a run's config switches on, in registration order."""
    out = []
    for name, cls in plugin_classes().items():
        params = getattr(cfg, name)
        if cls.enabled(params):
            out.append(cls(params))
    return out


def _load() -> None:
    import importlib
    import pkgutil

    import clients

    for info in pkgutil.iter_modules(clients.__path__):
        if info.name.startswith("plugin_"):
            importlib.import_module(f"clients.{info.name}")
