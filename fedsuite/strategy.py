"""The server-rule base every fedsuite method subclasses (a Flower Message-API ``FedAvg``).

What it adds to Flower's ``FedAvg``, and why:

* the cohort is sampled by *partition id* with a generator seeded from (seed, round), so the same
  seed gives the same clients, in simulation and deployment alike;
* each sampled client gets its own message, built by :meth:`client_payload` (FedMR sends each a
  different model, SCAFFOLD adds the server control variate, ...);
* node ids are re-mapped before every round (:meth:`refresh_nodes`): a SuperNode that reconnects
  with a new node id is asked its partition id and gets work again; a sampled client whose node is
  not connected is sent nothing. Every message sent is remembered with its partition id, so an error
  reply (whose source may be the SuperLink, not the node) and a reply missing after
  ``round_timeout_s`` are recorded under that partition id in the round's :class:`RoundLog`
  (``dropped``, with the reason in ``drop_reasons``); fewer than ``min_replies`` accepted replies
  fail the run;
* replies that are errors, non-finite, or of the wrong keys/shapes are dropped and logged with the
  client's partition id, never averaged in; the rest are sorted by partition id before aggregation;
* a round whose failed share of the cohort (error, rejected or missing replies) exceeds
  ``max_failed_fraction``, or that has no accepted reply at all, raises :class:`RoundFailure`: the
  run stops as failed and the last good round's checkpoint stays;
* :meth:`aggregate` is the server rule proper. The default is FedAvg's data-size-weighted mean

      w^{t+1} = Σ_{i∈S_t} n_i w_i / Σ_{i∈S_t} n_i

  accumulated in float64 and cast back to each array's dtype;
* :meth:`state_dict` / :meth:`load_state_dict` hold all server state for checkpoints.

Flower's own server optimisers (``FedAdam``, ``FedAvgM``, ``FedYogi``) compose with this class
through Python's MRO: ``class FedAdam(flwr.FedAdam, FedSuiteStrategy)`` runs Flower's update on
top of our validated, sorted mean.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedsuite.arrays import trainable_keys, weighted_mean
from fedsuite.plugins import ServerHooks, active_plugins
from fedsuite.seeding import COHORT_TAG, round_rng
from fedsuite.wire import (
    ARRAYS, CONFIG, STATISTICS, STATISTICS_QUERY, ClientReply, NDArrays, decode_records, nonfinite_values,
    record_nbytes, to_ndarrays, to_record,
)

log = logging.getLogger("fedsuite")

#: ``RoundLog.drop_reasons`` for a sampled client whose SuperNode is not connected
DROP_NOT_CONNECTED = "node not connected"
#: ... and for one that was sent work but did not answer before the round timed out
DROP_TIMEOUT = "no reply within round_timeout_s"
#: how long a round waits for newly connected nodes to say which partition they hold
QUERY_TIMEOUT_S = 60.0

@dataclass
class ServerSetup:
    """What a server rule is built from."""

    cfg: Any  # fedsuite.config.BaseRunConfig
    node_to_pid: dict[int, int]  # Flower node id -> partition id (from the handshake)
    initial: NDArrays  # w^0, state_dict order
    run_dir: Path | None = None
    build_model: Callable[[], Any] | None = None  # a fresh torch model of the run's architecture
    # central evaluation of a model given as arrays on the run's test set: {"accuracy", "loss"}
    # (the ServerApp's, fedsuite.training.evaluate; None in hand-built setups)
    evaluate: Callable[[NDArrays], dict[str, float]] | None = None

    def trainable_keys(self) -> list[str]:
        """Names of the trainable parameters in w^0's order: from a fresh model when the setup can
        build one, else every floating-point array of w^0 (hand-built setups in tests)."""
        if self.build_model is not None:
            names = set(trainable_keys(self.build_model()))
            return [k for k in self.initial if k in names]
        return [k for k, v in self.initial.items() if np.issubdtype(v.dtype, np.floating)]


@dataclass
class RoundLog:
    """What one round did: the line the ServerApp writes into ``metrics.jsonl`` (besides the test
    metrics and the wall time). The base strategy fills the fixed fields; a method or plug-in adds
    its own columns with :meth:`add`. Columns merge: a writer adds its keys and never replaces
    another writer's (the method's columns and a plug-in's live side by side)."""

    round: int = 0
    cohort: list[int] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0
    dropped: list[int] = field(default_factory=list)
    drop_reasons: dict[int, str] = field(default_factory=dict)
    failed: int = 0
    num_replies: int = 0
    train_loss: float | None = None
    columns: dict[str, Any] = field(default_factory=dict)

    def add(self, columns: dict[str, Any]) -> None:
        """Add (or update) columns of this round's line (JSON-serialisable values)."""
        self.columns.update(columns)

    def drop(self, pid: int, reason: str) -> None:
        """Record a dropped client (the first reason given for it is kept)."""
        self.dropped.append(pid)
        self.drop_reasons.setdefault(pid, reason)

    def row(self) -> dict[str, Any]:
        """The round's fields after ``train_loss`` in ``metrics.jsonl`` order (the ServerApp adds the
        round, test metrics, ``train_loss`` and the wall time before them)."""
        return {
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "cohort": self.cohort,
            "dropped": self.dropped,
            "failed": self.failed,
            "failure_reasons": {str(k): v for k, v in self.drop_reasons.items()},
            **self.columns,
        }


class RoundFailure(RuntimeError):
    """Too many of a round's client replies failed or were rejected (see ``max_failed_fraction``).

    Carries what ``summary.json`` records under ``failure``: the round, the failed partition ids,
    the cohort size and the first error message."""

    def __init__(self, server_round: int, failed: list[int], cohort_size: int, first_error: str, limit: float) -> None:
        self.server_round, self.failed, self.cohort_size = server_round, failed, cohort_size
        self.first_error, self.limit = first_error, limit
        shown = ", ".join(map(str, failed[:20])) + (", ..." if len(failed) > 20 else "")
        super().__init__(
            f"round {server_round}: {len(failed)} of {cohort_size} client replies failed "
            f"(partitions {shown}; max_failed_fraction={limit:g}); first error: {first_error}"
        )

    def record(self) -> dict[str, Any]:
        return {"round": self.server_round, "partition_ids": self.failed, "cohort_size": self.cohort_size,
                "first_error": self.first_error, "max_failed_fraction": self.limit, "message": str(self)}


def failure_reason(reason: str) -> str:
    """The informative part of an error reply's reason. Flower wraps a ClientApp's exception as
    ``<class '...ClientAppException'>:<'...Exception ClientAppException occurred. Message: MSG'>``;
    this returns ``MSG`` (or the last non-empty line of any other reason)."""
    text = str(reason)
    marker = "occurred. Message: "
    if marker in text:
        text = text.split(marker, 1)[1]
        if text.endswith("'>"):
            text = text[:-2]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "unknown error"


class FedSuiteStrategy(FedAvg):
    """FedAvg with deterministic cohorts, per-client payloads and validated replies (see module)."""

    #: rounds already done before this ``start`` (set by the ServerApp when resuming a run)
    round_offset: int = 0
    #: a class whose ``configure_train``/``aggregate_train`` are Flower's own (the server optimisers
    #: of ``strategies/_baselines.py``) may override them; they call ``super()``, so the round is
    #: still converted here, once
    flower_round_api: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Flower numbers the rounds of each ``start`` from 1; this class turns that into the global
        round once, in ``configure_train``/``aggregate_train``. A method overrides the hooks that
        receive the global round (:meth:`prepare_round`, :meth:`client_payload`, :meth:`aggregate`,
        :meth:`after_aggregate`), never those two, so no method can forget the resume offset."""
        super().__init_subclass__(**kwargs)
        if not cls.flower_round_api:
            for name in ("configure_train", "aggregate_train"):
                if name in cls.__dict__:
                    raise TypeError(
                        f"{cls.__name__} overrides {name}, which receives Flower's round of this start, not "
                        f"the global round; override prepare_round / aggregate / after_aggregate instead")

    def __init__(self, setup: ServerSetup, **flower_kwargs: Any) -> None:
        cfg = setup.cfg
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=1, **flower_kwargs)
        self.setup = setup
        self.cfg = cfg
        self.params = cfg.method_params
        self.pid_to_node = {pid: node for node, pid in setup.node_to_pid.items()}
        self.connected: set[int] = set(setup.node_to_pid)  # node ids online at the last check
        self.retired: set[int] = set()  # node ids replaced by a newer one, or that never answered a query
        self._messages_out: list[tuple[int, int, Any]] = []  # this round's messages: (pid, node id, metadata)
        self.template = setup.initial
        self.global_arrays: NDArrays = dict(setup.initial)  # w^t as last sent
        self.grid: Grid | None = None  # the Grid of the round in flight (None in strategy-level tests)
        self.round_log = RoundLog()  # the round in flight (configure_train starts a new one)
        self.server_hooks: list[ServerHooks] = [
            h for h in (p.server_hooks(self) for p in active_plugins(cfg)) if h is not None
        ]

    def global_round(self, flower_round: int) -> int:
        """The global round (1-based over the whole run, resumes included) of Flower's ``flower_round``."""
        return flower_round + self.round_offset

    # --- sampling and payloads ------------------------------------------------------------------
    def sample_cohort(self, server_round: int) -> list[int]:
        """K distinct partition ids, uniformly without replacement, seeded by (seed, round)."""
        pids = np.array(sorted(self.pid_to_node))
        k = min(self.cfg.cohort_size, len(pids))
        rng = round_rng(self.cfg.seed, server_round, COHORT_TAG)
        return sorted(int(p) for p in rng.choice(pids, size=k, replace=False))

    def local_lr(self, server_round: int) -> float:
        """η_l^t = η_l · decay^(t-1)."""
        return self.cfg.lr * self.cfg.lr_decay ** (server_round - 1)

    def train_config(self, server_round: int) -> dict[str, Any]:
        """Scalars every client receives this round."""
        return {"server-round": server_round, "lr": self.local_lr(server_round)}

    def prepare_round(self, server_round: int, cohort: list[int]) -> None:
        """Called once per round with the sampled cohort, before any payload is built."""

    def client_payload(self, server_round: int, pid: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        """The message content for client ``pid`` (default: the global model and the config)."""
        return RecordDict({"arrays": arrays, "config": config})

    # --- nodes: Flower node id <-> partition id, refreshed every round ---------------------------
    def refresh_nodes(self, grid: Grid | None) -> None:
        """Compare the SuperLink's connected nodes with the known map; ask each new node (a SuperNode
        that joined late or restarted under a new node id) its partition id with a QUERY, as the
        handshake does, and point that partition at it. Partitions whose node is gone stay in the
        map (sampling is by partition id, whoever is online) and are sent nothing while gone."""
        if grid is None:  # strategy-level tests drive configure_train without a Grid
            return
        current = {int(n) for n in grid.get_node_ids()}
        # a dead node stays listed until its heartbeat lapses: a retired id is not asked again
        new = sorted(current - set(self.setup.node_to_pid) - self.retired)
        if new:
            queries = [Message(RecordDict({}), dst_node_id=n, message_type=MessageType.QUERY) for n in new]
            self.retired.update(new)  # until it answers
            for reply in grid.send_and_receive(queries, timeout=min(QUERY_TIMEOUT_S, self.cfg.round_timeout_s)):
                node = int(reply.metadata.src_node_id)
                if reply.has_error() or node not in new:
                    log.warning("node query failed (node %s): %s", node,
                                failure_reason(reply.error.reason) if reply.has_error() else "unexpected reply")
                    continue
                self.retired.discard(node)
                pid = int(reply.content["info"]["partition-id"])
                if not 0 <= pid < self.cfg.num_clients:
                    log.warning("node %s claims partition %s, outside 0..%s; ignored", node, pid, self.cfg.num_clients - 1)
                    self.retired.add(node)
                    continue
                old = self.pid_to_node.get(pid)
                if old is not None and old != node:
                    self.setup.node_to_pid.pop(old, None)
                    self.retired.add(old)
                    log.warning("client %s is now node %s (was node %s)", pid, node, old)
                self.setup.node_to_pid[node] = pid
                self.pid_to_node[pid] = node
        self.connected = current

    def reply_pid(self, msg: Message) -> int:
        """The partition id a reply belongs to: that of the message it answers (an error reply made
        by the SuperLink has the SuperLink as its source), else that of its source node; -1 if unknown."""
        reply_to = msg.metadata.reply_to_message_id
        if reply_to:
            for pid, _, meta in self._messages_out:
                if meta.message_id == reply_to:
                    return pid
        return self.setup.node_to_pid.get(msg.metadata.src_node_id, -1)

    def record_drop(self, pid: int, reason: str) -> None:
        log.warning("round %s: dropped client %s: %s", self.round_log.round, pid, reason)
        self.round_log.drop(pid, reason)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        server_round = self.global_round(server_round)
        self.grid = grid
        self.refresh_nodes(grid)
        self.global_arrays = to_ndarrays(arrays)
        cohort = self.sample_cohort(server_round)
        self.round_log = RoundLog(round=server_round, cohort=cohort)
        self.prepare_round(server_round, cohort)
        conf = ConfigRecord({**dict(config), **self.train_config(server_round)})
        messages, absent = [], []
        self._messages_out = []
        for pid in cohort:
            node = self.pid_to_node.get(pid)
            if node is None or node not in self.connected:
                absent.append(pid)
                continue
            content = self.client_payload(server_round, pid, arrays, conf)
            for hooks in self.server_hooks:
                hooks.payload(server_round, pid, content)
            self.round_log.bytes_sent += record_nbytes(content)
            msg = Message(content=content, dst_node_id=node, message_type=MessageType.TRAIN)
            messages.append(msg)
            self._messages_out.append((pid, node, msg.metadata))  # the Grid sets metadata.message_id when it pushes
        for pid in absent:
            self.record_drop(pid, DROP_NOT_CONNECTED)
        return messages

    def query_statistics(self, server_round: int, pids: Iterable[int], arrays: ArrayRecord) -> dict[int, NDArrays]:
        """Ask the connected clients among ``pids`` for their rule's statistics of the model ``arrays``
        (message type ``STATISTICS_QUERY``: no training, no plug-in; ``ClientRule.statistics``).
        Returns {partition id: statistics}. A reply that fails, lacks the record, holds non-finite
        values or never comes is dropped and logged in this round's log like a failed training reply."""
        conf = ConfigRecord({"server-round": server_round})
        out = [(pid, Message(RecordDict({ARRAYS: arrays, CONFIG: conf}), dst_node_id=self.pid_to_node[pid],
                             message_type=STATISTICS_QUERY))
               for pid in pids if self.pid_to_node.get(pid) in self.connected]
        self.round_log.bytes_sent += sum(record_nbytes(m.content) for _, m in out)
        replies = list(self.grid.send_and_receive([m for _, m in out], timeout=self.cfg.round_timeout_s))
        asked = {m.metadata.message_id: pid for pid, m in out}  # ids are set when the Grid pushes
        stats: dict[int, NDArrays] = {}
        answered = set()
        for msg in replies:
            pid = asked.get(msg.metadata.reply_to_message_id, self.setup.node_to_pid.get(msg.metadata.src_node_id, -1))
            answered.add(pid)
            if msg.has_error():
                problem = f"client error: {failure_reason(msg.error.reason)}"
            elif STATISTICS not in msg.content.array_records:
                problem = f"reply lacks {STATISTICS!r}"
            else:
                self.round_log.bytes_received += record_nbytes(msg.content)
                records = decode_records(msg.content)
                problem = nonfinite_values(records)
            if problem:
                self.record_drop(pid, f"statistics query: {problem}")
            else:
                stats[pid] = records[STATISTICS]
        for pid in sorted(set(asked.values()) - answered):
            self.record_drop(pid, f"statistics query: {DROP_TIMEOUT} ({self.cfg.round_timeout_s:g} s)")
        return dict(sorted(stats.items()))

    # --- replies --------------------------------------------------------------------------------
    def parse_replies(self, replies: Iterable[Message]) -> list[ClientReply]:
        """Drop and log bad replies; return the good ones sorted by partition id."""
        good: list[ClientReply] = []
        for msg in replies:
            pid = self.reply_pid(msg)
            records: dict[str, NDArrays] = {}
            if msg.has_error():
                problem = f"client error: {failure_reason(msg.error.reason)}"
            else:
                self.round_log.bytes_received += record_nbytes(msg.content)
                problem = self._check_reply_layout(msg.content)
                if problem is None:
                    records = decode_records(msg.content)
                    problem = nonfinite_values(records)
            if problem:
                log.warning("round %s: dropped reply of client %s: %s", self.round_log.round, pid, problem)
                self.round_log.drop(pid, problem)
                continue
            metrics = {k: float(v) for k, v in msg.content["metrics"].items() if not isinstance(v, list)}
            arrays = records.pop("arrays")
            good.append(ClientReply(pid, arrays, int(metrics["num-examples"]), metrics, records))
        return sorted(good, key=lambda r: r.partition_id)

    def _check_reply_layout(self, content: RecordDict) -> str | None:
        """What is wrong with a reply's records, names and shapes (read before any array is decoded)."""
        if "arrays" not in content.array_records or "metrics" not in content.metric_records:
            return "reply lacks 'arrays' or 'metrics'"
        if "num-examples" not in content["metrics"]:
            return "metrics lack 'num-examples'"
        arrays = content["arrays"]
        if set(arrays.keys()) != set(self.template):
            return "array names differ from the model's"
        for key, arr in arrays.items():
            if tuple(arr.shape) != tuple(self.template[key].shape):
                return f"array {key!r} has shape {tuple(arr.shape)}, expected {tuple(self.template[key].shape)}"
        return None

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        server_round = self.global_round(server_round)
        replies = list(replies)
        answered = {self.reply_pid(m) for m in replies}
        good = self.parse_replies(replies)
        for pid, _, _ in self._messages_out:  # sent, never answered: send_and_receive gave up at round_timeout_s
            if pid not in answered:
                self.record_drop(pid, f"{DROP_TIMEOUT} ({self.cfg.round_timeout_s:g} s)")
        for hooks in self.server_hooks:
            good = hooks.observe(server_round, good)
        self.round_log.num_replies = len(good)
        self.check_failures(server_round, good)
        if len(good) < self.cfg.min_replies:
            failed = sorted(set(self.round_log.cohort) - {r.partition_id for r in good})
            raise RoundFailure(server_round, failed, len(self.round_log.cohort),
                               f"{len(good)} accepted replies, fewer than min_replies={self.cfg.min_replies}",
                               self.cfg.resolved_max_failed_fraction)
        new_arrays = self.aggregate(server_round, good)
        self.global_arrays = new_arrays
        metrics = self.aggregate_metrics(good)
        self.round_log.train_loss = metrics.get("train-loss")
        self.after_aggregate(server_round)
        return to_record(new_arrays), MetricRecord(metrics)

    def check_failures(self, server_round: int, good: list[ClientReply]) -> None:
        """Count the cohort's failed replies (error, rejected or missing) into the round's log;
        raise :class:`RoundFailure` past ``max_failed_fraction`` or when no reply was accepted."""
        cohort = list(self.round_log.cohort)
        accepted = {r.partition_id for r in good}
        failed = sorted(set(cohort) - accepted)
        reasons = self.round_log.drop_reasons
        for pid in failed:
            reasons.setdefault(pid, "no reply")
        self.round_log.failed = len(failed)
        limit = self.cfg.resolved_max_failed_fraction
        if not good or len(failed) > limit * len(cohort) + 1e-9:
            first = reasons[failed[0]] if failed else "no client in the cohort"
            raise RoundFailure(server_round, failed, len(cohort), first, limit)

    def aggregate(self, server_round: int, replies: list[ClientReply]) -> NDArrays:
        """The server rule. Default: data-size-weighted mean of the client models (FedAvg)."""
        return weighted_mean([r.arrays for r in replies], [r.num_examples for r in replies], self.template)

    def after_aggregate(self, server_round: int) -> None:
        """Called after the round's aggregation (``self.global_arrays`` is w^{t+1}); may talk to the
        clients through ``self.grid`` (CCVR's statistics round)."""

    def aggregate_metrics(self, replies: list[ClientReply]) -> dict[str, float]:
        """Example-weighted mean of the clients' scalar metrics."""
        total = sum(r.num_examples for r in replies)
        keys = set.intersection(*(set(r.metrics) for r in replies)) - {"num-examples", "partition-id", "received-checksum"}
        return {k: sum(r.metrics[k] * r.num_examples for r in replies) / total for k in sorted(keys)}

    def evaluation_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """The model the ServerApp evaluates centrally after a round (default: the global model
        itself). A method whose evaluated model differs from the next round's start point
        (CCVR's calibrated head, FedExP's iterate average) overrides this."""
        return arrays

    # --- no federated evaluation: fedsuite evaluates the global model centrally ----------------
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return []

    # --- checkpointing --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The method's own server state beyond the global model (subclasses override)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything a checkpoint needs: the method's state and each plug-in's server state.
        Kept apart so a method's ``state_dict`` never has to remember to include the plug-ins'."""
        return {"method": self.state_dict(), "plugins": {h.name: h.state_dict() for h in self.server_hooks}}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["method"])
        for hooks in self.server_hooks:
            if hooks.name in state["plugins"]:
                hooks.load_state_dict(state["plugins"][hooks.name])
