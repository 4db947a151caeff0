"""How a server rule reaches its clients: a :class:`Channel`, by partition id.

The strategy base (``fedsuite.method.strategy``) never sees how messages travel: the engine hands it
a channel for each round (``FedSuiteStrategy.train_round``; in Flower's own loop the engine's Flower
``Strategy`` adapter, ``fedsuite.engine.flower_strategy``, sets ``FedSuiteStrategy.channel`` in
``configure_train``). The engine's channel (``fedsuite.engine.transport.Link``) is a transport (Flower's
grid, or the ClientApp's handlers in this process) and the run's map of which node holds which
partition; a method knows neither.

A partition id is *known* when it is in the run's node map (``ServerSetup.node_to_pid``'s values;
the engine keeps that dict current), connected or not; it is *reachable* when its node is connected
now. The round's cohort is sampled among the known partitions and sent work only where reachable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flwr.app import RecordDict

    from fedsuite.method.replies import Reply


class Channel(ABC):
    """Sends a method's messages to its clients and returns their replies, by partition id."""

    @abstractmethod
    def reachable(self, pid: int) -> bool:
        """Whether partition ``pid``'s client can be sent a message now (its node is connected)."""

    @abstractmethod
    def exchange(self, message_type: str, contents: dict[int, RecordDict], timeout: float) -> dict[int, Reply]:
        """Send ``contents[pid]`` to each partition ``pid`` (each reachable) as a message of
        ``message_type`` (Flower's ``MessageType.TRAIN`` or ``EVALUATE``, or
        ``fedsuite.method.wire.STATISTICS_QUERY``) and wait up to ``timeout`` seconds; the replies by
        partition id (a partition that did not answer in time is absent)."""
