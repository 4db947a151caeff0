"""The server-rule base every fedsuite method subclasses (a Flower Message-API ``FedAvg``): the
round's protocol, from sampling the cohort to the aggregated model and the round's log.

What it adds to Flower's ``FedAvg``, and why:

* the cohort is sampled by *partition id* with a generator seeded from (seed, round), so the same
  seed gives the same clients, in simulation and deployment alike;
* each sampled client gets its own message, built by :meth:`client_payload` (FedMR sends each a
  different model, SCAFFOLD adds the server control variate, ...), then by the plug-ins' server
  halves (``ServerHooks.payload``; each got the ``ServerSetup`` when built, and ``observe`` gets the
  round's :class:`RoundLog`);
* the node map (``fedsuite.nodes.NodeMap``) is refreshed before every round: a SuperNode that
  reconnects with a new node id is asked its partition id and gets work again; a sampled client
  whose node is not connected is sent nothing. Every message sent is remembered with its partition
  id (``fedsuite.nodes.Exchange``), so an error reply (whose source may be the SuperLink, not the
  node) and a reply missing after ``round_timeout_s`` are recorded under that partition id in the
  round's :class:`RoundLog` (``dropped``, with the reason in ``drop_reasons``); fewer than
  ``min_replies`` accepted replies fail the run;
* replies that are errors, non-finite, or of the wrong keys/shapes are dropped and logged with the
  client's partition id, never averaged in (one validator, ``fedsuite.replies.check_reply``, for
  training replies and :meth:`query_statistics`' replies); the rest are sorted by partition id
  before aggregation;
* a round whose failed share of the cohort (error, rejected or missing replies) exceeds
  ``max_failed_fraction``, or that has no accepted reply at all, raises :class:`RoundFailure`: the
  run stops as failed and the last good round's checkpoint stays;
* :meth:`aggregate` is the server rule proper. The default is FedAvg's data-size-weighted mean

      w^{t+1} = Σ_{i∈S_t} n_i w_i / Σ_{i∈S_t} n_i

  accumulated in float64 and cast back to each array's dtype;
* the cohort's example-weighted mean of each activity measure of the run's components
  (``fedsuite.activity``: how much FedMRUR's regulariser, relaxed initialisation, neuron-wise
  learning rates acted) goes into the round's ``metrics.jsonl`` line under the measure's name;
* :meth:`state_dict` / :meth:`load_state_dict` hold all server state for checkpoints.

:class:`ServerSetup`, :class:`RoundLog` and :class:`RoundFailure` are defined in ``fedsuite.rounds``
(the plug-ins' server halves use them too) and re-exported here.

Flower's own server optimisers (``FedAdam``, ``FedAvgM``, ``FedYogi``) compose with this class
through Python's MRO (``strategies/_baselines.py``): Flower's update runs on top of our validated,
sorted mean.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedsuite.arrays import weighted_mean
from fedsuite.nodes import Exchange, NodeMap
from fedsuite.plugins import ServerHooks, active_plugins
from fedsuite.replies import check_reply, metric_means
from fedsuite.rounds import RoundFailure, RoundLog, ServerSetup
from fedsuite.seeding import COHORT_TAG, round_rng
from fedsuite.wire import (
    ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, PARTITION_ID, RECEIVED_CHECKSUM, SERVER_ROUND, STATISTICS,
    STATISTICS_QUERY, ClientReply, NDArrays, record_nbytes, to_ndarrays, to_record,
)

#: ``ServerSetup``, ``RoundLog`` and ``RoundFailure`` live in ``fedsuite.rounds``; a method imports them from here
__all__ = ["DROP_NOT_CONNECTED", "DROP_TIMEOUT", "FedSuiteStrategy", "RoundFailure", "RoundLog", "ServerSetup", "log"]

log = logging.getLogger("fedsuite")

#: ``RoundLog.drop_reasons`` for a sampled client whose SuperNode is not connected
DROP_NOT_CONNECTED = "node not connected"
#: ... and for one that was sent work but did not answer before the round timed out
DROP_TIMEOUT = "no reply within round_timeout_s"
#: the clients' bookkeeping metrics, not averaged into the round's training metrics
BOOKKEEPING_METRICS = frozenset({NUM_EXAMPLES, PARTITION_ID, RECEIVED_CHECKSUM})


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
        self.nodes = NodeMap(setup.node_to_pid)  # Flower node id <-> partition id, refreshed every round
        self.sent = Exchange(self.nodes)  # this round's training messages, by partition id
        self.template = setup.initial
        self.global_arrays: NDArrays = dict(setup.initial)  # w^t as last sent
        self.grid: Grid | None = None  # the Grid of the round in flight (None in strategy-level tests)
        self.round_log = RoundLog()  # the round in flight (configure_train starts a new one)
        self.server_hooks: list[ServerHooks] = [
            h for h in (p.server_hooks(setup) for p in active_plugins(cfg)) if h is not None
        ]
        #: the activity measures of the run's components (``fedsuite.activity``), logged each round
        self.activity_measures: tuple[str, ...] = tuple(c.measure for c in cfg.components)

    @property
    def pid_to_node(self) -> dict[int, int]:
        """Partition id -> the Flower node id that last said it holds it (connected or not)."""
        return self.nodes.pid_to_node

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
        return {SERVER_ROUND: server_round, "lr": self.local_lr(server_round)}

    def prepare_round(self, server_round: int, cohort: list[int]) -> None:
        """Called once per round with the sampled cohort, before any payload is built."""

    def client_payload(self, server_round: int, pid: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        """The message content for client ``pid`` (default: the global model and the config)."""
        return RecordDict({ARRAYS: arrays, CONFIG: config})

    def record_drop(self, pid: int, reason: str) -> None:
        log.warning("round %s: dropped client %s: %s", self.round_log.round, pid, reason)
        self.round_log.drop(pid, reason)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        server_round = self.global_round(server_round)
        self.grid = grid
        self.nodes.refresh(grid, self.cfg.num_clients, self.cfg.round_timeout_s)
        self.global_arrays = to_ndarrays(arrays)
        cohort = self.sample_cohort(server_round)
        self.round_log = RoundLog(round=server_round, cohort=cohort)
        self.prepare_round(server_round, cohort)
        conf = ConfigRecord({**dict(config), **self.train_config(server_round)})
        absent = []
        self.sent = Exchange(self.nodes)
        for pid in cohort:
            node = self.nodes.node_of(pid)
            if node is None:
                absent.append(pid)
                continue
            content = self.client_payload(server_round, pid, arrays, conf)
            for hooks in self.server_hooks:
                hooks.payload(server_round, pid, content)
            self.round_log.bytes_sent += record_nbytes(content)
            self.sent.add(pid, Message(content=content, dst_node_id=node, message_type=MessageType.TRAIN))
        for pid in absent:
            self.record_drop(pid, DROP_NOT_CONNECTED)
        return self.sent.messages()

    def query_statistics(self, server_round: int, pids: Iterable[int], arrays: ArrayRecord) -> dict[int, NDArrays]:
        """Ask the connected clients among ``pids`` for their rule's statistics of the model ``arrays``
        (message type ``STATISTICS_QUERY``: no training, no plug-in; ``ClientRule.statistics``).
        Returns {partition id: statistics}. A reply that fails, lacks the record, holds non-finite
        values or never comes is dropped and logged in this round's log like a failed training reply."""
        conf = ConfigRecord({SERVER_ROUND: server_round})
        asked = Exchange(self.nodes)
        for pid in pids:
            if (node := self.nodes.node_of(pid)) is not None:
                asked.add(pid, Message(RecordDict({ARRAYS: arrays, CONFIG: conf}), dst_node_id=node,
                                       message_type=STATISTICS_QUERY))
        self.round_log.bytes_sent += sum(record_nbytes(m.content) for m in asked.messages())
        replies = list(self.grid.send_and_receive(asked.messages(), timeout=self.cfg.round_timeout_s))
        stats: dict[int, NDArrays] = {}
        for msg in replies:
            pid = asked.pid_of(msg)
            problem, records = self.receive(msg, STATISTICS)
            if problem:
                self.record_drop(pid, f"statistics query: {problem}")
            else:
                stats[pid] = records[STATISTICS]
        for pid in asked.unanswered(replies):
            self.record_drop(pid, f"statistics query: {DROP_TIMEOUT} ({self.cfg.round_timeout_s:g} s)")
        return dict(sorted(stats.items()))

    # --- replies --------------------------------------------------------------------------------
    def receive(self, msg: Message, arrays: str, metrics: str | None = None,
                template: NDArrays | None = None) -> tuple[str | None, dict[str, NDArrays]]:
        """Count a reply's bytes into the round's log (unless it is an error) and validate it
        (``fedsuite.replies.check_reply``): (problem, {}) or (None, its decoded ArrayRecords)."""
        if not msg.has_error():
            self.round_log.bytes_received += record_nbytes(msg.content)
        return check_reply(msg, arrays, metrics, template)

    def parse_replies(self, replies: Iterable[Message]) -> list[ClientReply]:
        """Drop and log bad training replies; return the good ones sorted by partition id."""
        good: list[ClientReply] = []
        for msg in replies:
            pid = self.sent.pid_of(msg)
            problem, records = self.receive(msg, ARRAYS, METRICS, self.template)
            if problem:
                log.warning("round %s: dropped reply of client %s: %s", self.round_log.round, pid, problem)
                self.round_log.drop(pid, problem)
                continue
            metrics = {k: float(v) for k, v in msg.content[METRICS].items() if not isinstance(v, list)}
            arrays = records.pop(ARRAYS)
            good.append(ClientReply(pid, arrays, int(metrics[NUM_EXAMPLES]), metrics, records))
        return sorted(good, key=lambda r: r.partition_id)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        server_round = self.global_round(server_round)
        replies = list(replies)
        good = self.parse_replies(replies)
        for pid in self.sent.unanswered(replies):  # send_and_receive gave up at round_timeout_s
            self.record_drop(pid, f"{DROP_TIMEOUT} ({self.cfg.round_timeout_s:g} s)")
        for hooks in self.server_hooks:
            good = hooks.observe(server_round, good, self.round_log)
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
        # the cohort's example-weighted mean of each component's activity measure (fedsuite.activity)
        self.round_log.add({m: metrics[m] for m in self.activity_measures if m in metrics})
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
        return metric_means(replies, lambda key: key not in BOOKKEEPING_METRICS)

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
