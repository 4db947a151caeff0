"""How the round engine reaches its clients: a :class:`Transport` sends one message per partition id
and returns the replies by partition id. Two transports, one protocol:

* :class:`FlowerTransport`: the ServerApp's Flower ``Grid``. Messages go to the SuperNode (or Ray-backed virtual client) that holds each partition
  (``fedsuite.engine.nodes.NodeMap``, refreshed before every round); a reply is attributed to the partition
  of the message it answers (``fedsuite.engine.nodes.Exchange``).
* :class:`InProcessTransport`: the ClientApp's handlers called in this process, a round's clients
  on parallel threads (as many as Flower's engine runs actors); no Ray, no subprocess, no network.
  A client's exception becomes an error reply, as Flower's engine turns it into one.

What a client computes depends only on the message, the config and its own state (its work is
reseeded from (seed, partition, round): ``fedsuite.method.seeding``), so both transports give the same
replies bit for bit on the CPU.

A ``fedsuite.method.replies.Reply`` is what came back: the content, or the informative part of an error's reason
(``fedsuite.method.replies.failure_reason``). A partition missing from :meth:`Transport.exchange`'s result
did not answer within the timeout.

A method sees neither a transport nor the node map: it gets a :class:`Link` (the method contract's
``fedsuite.method.channel.Channel``), a transport together with the run's ``NodeMap``.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from flwr.app import Context, Message, RecordDict

from fedsuite.engine.nodes import Exchange, NodeMap
from fedsuite.method.channel import Channel
from fedsuite.method.replies import Reply, failure_reason

if TYPE_CHECKING:
    from flwr.serverapp import Grid

log = logging.getLogger("fedsuite")


class Transport(ABC):
    """Sends the engine's messages and collects the replies, by partition id."""

    @abstractmethod
    def refresh(self, nodes: NodeMap, num_clients: int, timeout: float) -> None:
        """Learn which partitions are reachable before a round (``nodes.connected``)."""

    @abstractmethod
    def exchange(self, message_type: str, contents: dict[int, RecordDict], nodes: NodeMap,
                 timeout: float) -> dict[int, Reply]:
        """Send ``contents[pid]`` to each partition ``pid`` as a message of ``message_type``
        (Flower's ``MessageType.TRAIN`` or ``fedsuite.method.wire.STATISTICS_QUERY``) and wait up to
        ``timeout`` seconds; the replies, by partition id (a partition that did not answer is absent)."""


class FlowerTransport(Transport):
    """The ServerApp's ``Grid``: the Simulation Engine's virtual clients or real SuperNodes.

    :meth:`messages` and :meth:`replies` are the two halves of :meth:`exchange`, kept apart for a
    Flower ``Strategy``, whose ``configure_train`` returns the messages and whose
    ``aggregate_train`` gets the replies from Flower's own loop."""

    def __init__(self, grid: Grid | None, group_id: str | None = None) -> None:
        self.grid = grid
        #: the ``group_id`` of every message sent: in a batch of runs, the run's index in the batch
        #: (``fedsuite.engine.runtime.BATCH_KEY``), by which the ClientApp takes that run's config
        self.group_id = group_id

    def refresh(self, nodes: NodeMap, num_clients: int, timeout: float) -> None:
        nodes.refresh(self.grid, num_clients, timeout)

    def messages(self, message_type: str, contents: dict[int, RecordDict], nodes: NodeMap) -> Exchange:
        """One Flower ``Message`` per partition, to the node that holds it (partitions whose node is
        not connected get none: the caller leaves them out of ``contents``)."""
        sent = Exchange(nodes)
        for pid, content in contents.items():
            sent.add(pid, Message(content=content, dst_node_id=nodes.node_of(pid), message_type=message_type,
                                    group_id=self.group_id))
        return sent

    @staticmethod
    def replies(sent: Exchange, messages: Iterable[Message]) -> dict[int, Reply]:
        """Flower's reply messages as :class:`Reply` by partition id (the partition of the message
        each answers, else of its source node); a reply from an unknown node, or a second reply for
        one partition, is logged and ignored."""
        out: dict[int, Reply] = {}
        for msg in messages:
            pid = sent.pid_of(msg)
            if pid < 0 or pid in out:
                log.warning("ignored a reply from node %s (%s)", msg.metadata.src_node_id,
                            "a second reply for its partition" if pid >= 0 else "a node of no known partition")
                continue
            out[pid] = Reply(error=failure_reason(msg.error.reason)) if msg.has_error() else Reply(msg.content)
        return out

    def exchange(self, message_type: str, contents: dict[int, RecordDict], nodes: NodeMap,
                 timeout: float) -> dict[int, Reply]:
        sent = self.messages(message_type, contents, nodes)
        if not sent.sent:
            return {}
        return self.replies(sent, self.grid.send_and_receive(sent.messages(), timeout=timeout))


class Link(Channel):
    """A run's clients as its method reaches them (``fedsuite.method.channel.Channel``): ``transport``
    and the run's node map ``nodes`` (made once a run from ``ServerSetup.node_to_pid``, which it
    keeps current). :meth:`refresh` (the engine's, before every round) asks the transport which
    nodes are connected now and which partition each new one holds; the run's ``num_clients`` and
    ``round_timeout_s`` bound it."""

    def __init__(self, transport: Transport, nodes: NodeMap, num_clients: int, timeout: float) -> None:
        self.transport, self.nodes = transport, nodes
        self.num_clients, self.timeout = num_clients, timeout

    def refresh(self) -> None:
        self.transport.refresh(self.nodes, self.num_clients, self.timeout)

    def reachable(self, pid: int) -> bool:
        return self.nodes.node_of(pid) is not None

    def exchange(self, message_type: str, contents: dict[int, RecordDict], timeout: float) -> dict[int, Reply]:
        return self.transport.exchange(message_type, contents, self.nodes, timeout)


#: a ClientApp handler without Flower's Message around it: (message content, the client's Context)
#: -> reply content (``fedsuite.engine.client_app.HANDLERS``)
Handler = Callable[[RecordDict, Context], RecordDict]


class InProcessTransport(Transport):
    """The ClientApp's handlers, called in this process on ``threads`` worker threads: a round's
    clients train at once, as Flower's engine runs one client per actor, each actor a process with
    ``num_cpus`` intra-op threads. Every call builds its own model replica, data and generators from
    the message and its partition's context (``fedsuite.engine.client_app``); torch's process-wide RNG is
    guarded (``fedsuite.method.seeding.global_seed``), and torch's intra-op threads are the process's, set
    to ``num_cpus`` by every call. The replies are returned by partition id, whatever order the
    clients finished in, so the numbers are the same for any number of threads, and the same as
    Flower's engine. On a GPU each worker thread runs on a CUDA stream of its own.

    A call cannot be interrupted; one that took longer than the round's timeout (from its own start)
    is treated as Flower's engine treats a client that has not answered by then: its reply is
    discarded. Each partition keeps one Flower ``Context`` for the whole run (its ``state`` holds the
    client's small per-client values, as a SuperNode's context does), with the node config of a
    simulated client (``partition-id``, ``num-partitions``)."""

    def __init__(self, run_config: dict[str, Any], num_clients: int, handlers: dict[str, Handler],
                 threads: int = 1, cuda: bool = False) -> None:
        self.run_config = dict(run_config)
        self.num_clients = num_clients
        self.handlers = handlers
        self.threads = max(1, int(threads))
        self.cuda = cuda
        self.contexts: dict[int, Context] = {}
        self._local = threading.local()

    def context(self, pid: int) -> Context:
        if pid not in self.contexts:
            self.contexts[pid] = Context(run_id=0, node_id=pid, state=RecordDict(), run_config=self.run_config,
                                         node_config={"partition-id": pid, "num-partitions": self.num_clients})
        return self.contexts[pid]

    def refresh(self, nodes: NodeMap, num_clients: int, timeout: float) -> None:
        """Every partition is always reachable."""

    def exchange(self, message_type: str, contents: dict[int, RecordDict], nodes: NodeMap,
                 timeout: float) -> dict[int, Reply]:
        handler = self.handlers[message_type]
        pids = sorted(contents)
        calls = [(pid, contents[pid], self.context(pid)) for pid in pids]  # contexts made here, not racing
        workers = min(self.threads, len(calls))
        if workers <= 1:
            answers = [self._call(handler, *call, timeout) for call in calls]
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fedsuite-client") as pool:
                answers = list(pool.map(lambda call: self._call(handler, *call, timeout), calls))
        return {pid: reply for pid, reply in zip(pids, answers) if reply is not None}

    def _call(self, handler: Handler, pid: int, content: RecordDict, context: Context,
              timeout: float) -> Reply | None:
        """One client's reply (None: it came after ``timeout``)."""
        started = time.monotonic()
        try:
            with self._stream():
                reply = Reply(handler(content, context))
        except Exception as exc:  # noqa: BLE001 - a client's failure is its reply, as in Flower's engine
            log.warning("client %s raised %s: %s", pid, type(exc).__name__, exc)
            reply = Reply(error=failure_reason(str(exc)))
        if time.monotonic() - started > timeout:
            log.warning("client %s answered after the round's timeout (%g s): reply discarded", pid, timeout)
            return None
        return reply

    @contextmanager
    def _stream(self) -> Iterator[None]:
        """On a GPU, this thread's own CUDA stream (made once per thread), synchronised before the
        reply is handed over; on a CPU nothing."""
        if not self.cuda:
            yield
            return
        import torch

        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            yield
        stream.synchronize()
