"""The plug-in contract: a modifier that combines with any method (FedInit's relaxed
initialisation, FedNLR's neuron-wise learning rates), with a client half and an optional server half.

A plug-in is a :class:`ClientPlugin` subclass listed in ``fedsuite.method.plugins.PLUGINS`` under its
config section name. Its ``params`` model is the TOML section ``[<name>]``;
:meth:`ClientPlugin.enabled` says whether a run's config switches it on. Its server half (if any)
is a :class:`ServerHooks` returned by :meth:`ClientPlugin.server_hooks`, run by every strategy. A
server half gets what it needs, not the strategy: the run's ``ServerSetup`` when it is built, the
round's ``RoundLog`` (to add its columns) with the replies it observes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from pydantic import BaseModel
from flwr.app import RecordDict

from fedsuite.method.activity import Component
from fedsuite.method.rounds import RoundLog, ServerSetup
from fedsuite.method.training import SGD, LocalResult, LocalTask
from fedsuite.method.wire import ClientReply


class ServerHooks:
    """The server half of a plug-in, run by every ``FedSuiteStrategy``: :meth:`payload` may add
    records to a client's message after the method's own ``client_payload``; :meth:`observe` sees
    (and may replace) the validated, sorted replies before the method's ``aggregate`` and may add
    columns to the round's log; its state is saved under ``checkpoint_state()["plugins"][name]``."""

    name: str = "plugin"

    def payload(self, server_round: int, pid: int, content: RecordDict) -> None:
        """Add to (or change) the message content for client ``pid``."""

    def observe(self, server_round: int, replies: list[ClientReply], round_log: RoundLog) -> list[ClientReply]:
        """See the round's accepted replies (return them, or replacements); ``round_log.add`` writes columns."""
        return replies

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class ClientPlugin(ABC):
    """The client half: hooks around the client rule's ``start``, optimizer and ``finish``. Like the
    rule it wraps, it is built for one message: what it works out in a round is its own attribute."""

    name: ClassVar[str]
    params: ClassVar[type[BaseModel]]
    #: what the plug-in changes, measured each round (``fedsuite.method.activity``): the client half puts
    #: the measure into ``task.metrics`` under ``component.measure``; None: no measure
    component: ClassVar[Component | None] = None

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

    def wrap_optimizer(self, task: LocalTask, opt: SGD) -> SGD:
        return opt

    def lr_scales(self) -> dict[str, torch.Tensor]:
        """The per-parameter learning-rate factors this plug-in applies this round (by parameter
        name); read through ``ClientRule.lr_scales``."""
        return {}

    def after_finish(self, task: LocalTask, result: LocalResult) -> LocalResult:
        return result

    def server_hooks(self, setup: ServerSetup) -> ServerHooks | None:
        """The plug-in's server half for the run ``setup`` describes, or None.
        Called once by every strategy whose run switches the plug-in on."""
        return None
