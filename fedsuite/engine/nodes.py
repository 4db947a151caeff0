"""Which SuperNode holds which partition: the Flower node id <-> partition id map, the handshake that
fills it, its refresh before every round, and which partition a reply belongs to.

A node says its partition id in answer to a QUERY (:func:`partition_query`; the ClientApp replies
with the MetricRecord ``"info"`` holding ``"partition-id"``, ``fedsuite.method.wire``). The ServerApp asks
every node once at the start (:class:`Handshake`: a missing or failed answer, or two nodes claiming
one partition, fail the run; fewer nodes than clients are said in one line, :func:`shortfall`).
The engine then keeps a :class:`NodeMap` (in the run's ``fedsuite.engine.transport.Link``, or in
the Flower ``Strategy`` adapter, ``fedsuite.engine.flower_strategy``) and calls :meth:`NodeMap.refresh`
before every round:
a SuperNode that joined late or restarted under a new node id is asked the same question and gets
work again (a failed answer is logged, not fatal).
Sampling is by partition id; a partition whose node is gone stays in the map and is sent nothing.

Each exchange with the clients (a round's training messages, a statistics query) is an
:class:`Exchange`: every message sent is remembered with its partition id, so a reply is attributed
to the partition of the message it answers (an error reply made by the SuperLink has the SuperLink
as its source); a partition of the cohort with no reply is the strategy's to name
(``fedsuite.method.strategy``: "no reply").
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from flwr.app import Message, MessageType, RecordDict

from fedsuite.method.replies import failure_reason
from fedsuite.method.wire import INFO, PARTITION_ID

if TYPE_CHECKING:
    from flwr.serverapp import Grid

log = logging.getLogger("fedsuite")

#: how long the ServerApp waits for all nodes to connect and answer the handshake
HANDSHAKE_TIMEOUT_S = 600.0
#: seconds the ServerApp waits with fewer SuperNodes than clients before it says so (deployment)
SHORTFALL_NOTICE_S = 5.0
#: seconds a simulation's node count must hold before it is taken as the federation's size (its
#: virtual SuperNodes are registered in one loop, as the ServerApp starts)
SIMULATION_SETTLE_S = 1.0
#: how long a round waits for newly connected nodes to say which partition they hold
QUERY_TIMEOUT_S = 60.0


def partition_query(node: int) -> Message:
    """The QUERY that asks node ``node`` its partition id."""
    return Message(RecordDict({}), dst_node_id=node, message_type=MessageType.QUERY)


def claimed_partition(reply: Message) -> int:
    """The partition id a node's (non-error) answer to :func:`partition_query` claims."""
    return int(reply.content[INFO][PARTITION_ID])


class TooFewNodes(RuntimeError):
    """A simulation has fewer SuperNodes than the run's clients: the handshake can never complete."""


def shortfall(connected: int, expected: int, simulation: bool) -> str:
    """The one line that says a run has fewer nodes than clients: both numbers and what to set."""
    if simulation:
        return (f"the simulation has {connected} SuperNodes and the run has num_clients={expected}: set the "
                f"federation's num-supernodes={expected} (flwr run ... --federation-config "
                f"\"num-supernodes={expected}\") or the run's num_clients={connected}")
    return (f"{connected} SuperNodes are connected and the run has num_clients={expected}: waiting up to "
            f"{HANDSHAKE_TIMEOUT_S:g} s for {expected - connected} more (each with its own partition-id in "
            f"--node-config), or run with num_clients={connected}")


class Handshake:
    """One QUERY to every node, answered with its partition id: Flower node id -> partition id.

    Construction waits until ``expected`` nodes have connected and sends the queries;
    ``partition_ids()`` collects the replies. What the ServerApp does in between overlaps the
    clients' start.

    Fewer nodes than ``expected`` are said in one line (:func:`shortfall`), never waited for
    silently: a simulation's virtual SuperNodes are registered at once and never grow, so once their
    number has held for :data:`SIMULATION_SETTLE_S` the run fails (:class:`TooFewNodes`); real
    SuperNodes may still join, so after :data:`SHORTFALL_NOTICE_S` (and whenever the number changes)
    the line is logged as a warning while the wait goes on (``HANDSHAKE_TIMEOUT_S``)."""

    def __init__(self, grid: Grid, expected: int) -> None:
        self.grid, started = grid, time.monotonic()
        self.deadline = started + HANDSHAKE_TIMEOUT_S
        # imported here: Flower's grid modules load its SuperLink state (about 0.4 s), which the
        # in-process engine, importing this module without a grid, never needs
        from fedsuite.upstream import InMemoryGrid

        simulation = isinstance(grid, InMemoryGrid)
        count, since, told = -1, started, None
        while (connected := len(list(grid.get_node_ids()))) < expected:
            now = time.monotonic()
            if connected != count:
                count, since = connected, now
            if simulation and connected > 0 and now - since >= SIMULATION_SETTLE_S:
                log.error("%s", shortfall(connected, expected, simulation=True))
                raise TooFewNodes(shortfall(connected, expected, simulation=True))
            if not simulation and now - started >= SHORTFALL_NOTICE_S and told != connected:
                log.warning("%s", shortfall(connected, expected, simulation=False))
                told = connected
            if now > self.deadline:
                raise RuntimeError(f"only {connected} of {expected} nodes connected")
            time.sleep(0.5)
        self.pending = set(grid.push_messages([partition_query(n) for n in sorted(grid.get_node_ids())]))

    def partition_ids(self) -> dict[int, int]:
        """Wait for every reply (until ``HANDSHAKE_TIMEOUT_S`` after the start); raise on an error
        reply, a missing reply or two nodes that claim the same partition."""
        mapping = {}
        while self.pending:
            if time.monotonic() > self.deadline:
                raise RuntimeError(f"{len(self.pending)} nodes did not answer the handshake within "
                                   f"{HANDSHAKE_TIMEOUT_S:g} s")
            replies = list(self.grid.pull_messages(self.pending))
            for reply in replies:
                if reply.has_error():
                    raise RuntimeError(f"handshake failed on node {reply.metadata.src_node_id}: "
                                       f"{reply.error.reason}")
                mapping[reply.metadata.src_node_id] = claimed_partition(reply)
                self.pending.discard(reply.metadata.reply_to_message_id)
            if self.pending:  # the grid's own pace, as its send_and_receive (HttpGrid: every 3 s)
                time.sleep(getattr(self.grid, "pull_interval", 3.0))
        pids = sorted(mapping.values())
        if len(set(pids)) != len(pids):
            raise RuntimeError(f"two nodes claim the same partition id: {pids}")
        return mapping


class NodeMap:
    """Flower node id <-> partition id, and which nodes are online.

    ``node_to_pid`` is the handshake's map (``ServerSetup.node_to_pid``), updated in place."""

    def __init__(self, node_to_pid: dict[int, int]) -> None:
        self.node_to_pid = node_to_pid
        self.pid_to_node = {pid: node for node, pid in node_to_pid.items()}
        self.connected: set[int] = set(node_to_pid)  # node ids online at the last check
        self.retired: set[int] = set()  # node ids replaced by a newer one, or that never answered a query

    def node_of(self, pid: int) -> int | None:
        """The node holding partition ``pid`` if it is connected, else None."""
        node = self.pid_to_node.get(pid)
        return node if node is not None and node in self.connected else None

    def pid_of(self, node: int) -> int:
        """The partition node ``node`` holds; -1 if unknown."""
        return self.node_to_pid.get(node, -1)

    def refresh(self, grid: Grid | None, num_clients: int, round_timeout_s: float) -> None:
        """Compare the SuperLink's connected nodes with the map; ask each new node (a SuperNode
        that joined late or restarted under a new node id) its partition id with a QUERY, as the
        handshake does, and point that partition at it. Partitions whose node is gone stay in the
        map (sampling is by partition id, whoever is online) and are sent nothing while gone."""
        if grid is None:  # strategy-level tests drive configure_train without a Grid
            return
        current = {int(n) for n in grid.get_node_ids()}
        # a dead node stays listed until its heartbeat lapses: a retired id is not asked again
        new = sorted(current - set(self.node_to_pid) - self.retired)
        if new:
            self.retired.update(new)  # until it answers
            queries = [partition_query(n) for n in new]
            for reply in grid.send_and_receive(queries, timeout=min(QUERY_TIMEOUT_S, round_timeout_s)):
                node = int(reply.metadata.src_node_id)
                if reply.has_error() or node not in new:
                    log.warning("node query failed (node %s): %s", node,
                                failure_reason(reply.error.reason) if reply.has_error() else "unexpected reply")
                    continue
                self.retired.discard(node)
                self.assign(node, claimed_partition(reply), num_clients)
        self.connected = current

    def assign(self, node: int, pid: int, num_clients: int) -> None:
        """Point partition ``pid`` at ``node`` (a node claiming a partition outside the run is retired)."""
        if not 0 <= pid < num_clients:
            log.warning("node %s claims partition %s, outside 0..%s; ignored", node, pid, num_clients - 1)
            self.retired.add(node)
            return
        old = self.pid_to_node.get(pid)
        if old is not None and old != node:
            self.node_to_pid.pop(old, None)
            self.retired.add(old)
            log.warning("client %s is now node %s (was node %s)", pid, node, old)
        self.node_to_pid[node] = pid
        self.pid_to_node[pid] = node


class Exchange:
    """The messages of one exchange with the clients, each with its partition id."""

    def __init__(self, nodes: NodeMap) -> None:
        self.nodes = nodes
        self.sent: list[tuple[int, Message]] = []

    def add(self, pid: int, msg: Message) -> None:
        self.sent.append((pid, msg))  # the Grid sets msg.metadata.message_id when it pushes

    def messages(self) -> list[Message]:
        return [msg for _, msg in self.sent]

    def pid_of(self, reply: Message) -> int:
        """The partition id a reply belongs to: that of the message it answers (an error reply made
        by the SuperLink has the SuperLink as its source), else that of its source node; -1 if unknown."""
        reply_to = reply.metadata.reply_to_message_id
        if reply_to:
            for pid, msg in self.sent:
                if msg.metadata.message_id == reply_to:
                    return pid
        return self.nodes.pid_of(reply.metadata.src_node_id)
