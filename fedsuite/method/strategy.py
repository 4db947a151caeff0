"""The server-rule base every fedsuite method subclasses: one round's protocol, from sampling the
cohort to the aggregated model and the round's log, apart from how the messages travel.

The round engine (``fedsuite.engine.round_engine``) owns the loop and calls :meth:`FedSuiteStrategy.train_round`
once a round with a :class:`~fedsuite.method.channel.Channel` (how the messages reach the clients:
Flower's grid, or the ClientApp's handlers in this process; the base knows neither). In a Flower
user's own ServerApp the engine's adapter (``fedsuite.engine.flower_strategy.MethodStrategy``, a Flower
``Strategy`` that has a method's server half) runs the same protocol, :meth:`configure_round` and
:meth:`aggregate_round`, inside Flower's own loop. What the protocol does, and why:

* the cohort is sampled by *partition id* with a generator seeded from (seed, round), so the same
  seed gives the same clients, in simulation and deployment alike;
* each sampled client gets its own message, built by :meth:`client_payload` (FedMR sends each a
  different model, SCAFFOLD adds the server control variate, ...), then by the plug-ins' server
  halves (``ServerHooks.payload``; each got the ``ServerSetup`` when built, and ``observe`` gets the
  round's :class:`RoundLog`);
* the cohort is drawn from every known partition (``ServerSetup.node_to_pid``, which the engine
  refreshes before every round: a SuperNode that reconnects with a new node id is asked its
  partition id and gets work again); a sampled client the channel cannot reach now
  (``Channel.reachable``: its node is not connected) is sent nothing. Replies come back by partition id, so
  an error reply (whose source may be the SuperLink, not the node) and a reply missing after
  ``round_timeout_s`` are recorded under that partition id in the round's :class:`RoundLog`
  (``dropped``, with the reason in ``drop_reasons``); fewer than ``min_replies`` accepted replies
  fail the run;
* replies that are errors, non-finite, or of the wrong keys/shapes are dropped and logged with the
  client's partition id, never averaged in (one validator, ``fedsuite.method.replies.check_reply``, for
  training replies and :meth:`query_statistics`' replies); the rest are taken in partition-id order;
* a round whose failed share of the cohort (error, rejected or missing replies) exceeds
  ``max_failed_fraction``, or that has no accepted reply at all, raises :class:`RoundFailure`: the
  run stops as failed and the last good round's checkpoint stays;
* :meth:`aggregate` is the server rule proper. The default is FedAvg's data-size-weighted mean

      w^{t+1} = Σ_{i∈S_t} n_i w_i / Σ_{i∈S_t} n_i

  accumulated in float64 and cast back to each array's dtype;
* the cohort's example-weighted mean of each activity measure of the run's components
  (``fedsuite.method.activity``: how much FedMRUR's regulariser, relaxed initialisation, neuron-wise
  learning rates acted) goes into the round's ``metrics.jsonl`` line under the measure's name;
* :meth:`state_dict` / :meth:`load_state_dict` hold all server state for checkpoints.

Rounds are global (1-based over the whole run, resumes included): the engine counts them.

:class:`ServerSetup`, :class:`RoundLog` and :class:`RoundFailure` are defined in ``fedsuite.method.rounds``
(the plug-ins' server halves use them too) and re-exported here.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MessageType, RecordDict

from fedsuite.method.arrays import weighted_mean
from fedsuite.method.channel import Channel
from fedsuite.method.plugins import ServerHooks, active_plugins
from fedsuite.method.rounds import DROP_NOT_CONNECTED, DROP_TIMEOUT, RoundFailure, RoundLog, ServerSetup
from fedsuite.method.seeding import COHORT_TAG, round_rng
from fedsuite.method.replies import Reply, check_reply, metric_means
from fedsuite.method.wire import (
    ARRAYS, CONFIG, LR, METRICS, NUM_EXAMPLES, NUM_STEPS, PARTITION_ID, RECEIVED_CHECKSUM, SERVER_ROUND, STATISTICS,
    STATISTICS_QUERY, TRAIN_LOSS, TRAIN_SECONDS, TRAINABLE_LAYOUT, ClientReply, NDArrays, Record, record_nbytes,
    reply_records, to_ndarrays, to_record,
)

#: ``ServerSetup``, ``RoundLog`` and ``RoundFailure`` live in ``fedsuite.method.rounds``; a method imports them from here
__all__ = ["DROP_NOT_CONNECTED", "DROP_TIMEOUT", "FedSuiteStrategy", "RoundFailure", "RoundLog", "ServerSetup", "log"]

log = logging.getLogger("fedsuite")

#: the clients' bookkeeping metrics, not averaged into the round's training metrics
BOOKKEEPING_METRICS = frozenset({NUM_EXAMPLES, PARTITION_ID, RECEIVED_CHECKSUM, TRAIN_SECONDS})


class FedSuiteStrategy:
    """A method's server half (see module): the round's protocol between the engine and the clients,
    which it reaches through the :class:`~fedsuite.method.channel.Channel` the engine hands it."""

    def __init__(self, setup: ServerSetup) -> None:
        cfg = setup.cfg
        self.setup = setup
        self.cfg = cfg
        self.params = cfg.method_params
        self.records = cfg.method.records  # what the method's halves exchange (its registration's)
        self.reply_records: tuple[Record, ...] = reply_records(self.records, cfg)  # checked on every training reply
        trainable_layout = any(r.layout == TRAINABLE_LAYOUT for r in self.reply_records)
        self.record_trainable = setup.trainable_keys() if trainable_layout else None  # that layout's names
        self.template = setup.initial
        self.global_arrays: NDArrays = dict(setup.initial)  # w^t as last sent
        #: how the round in flight reaches the clients, set by the engine (None in strategy-level tests
        #: that drive the rounds by hand: every known partition is reachable, and nothing is sent); a
        #: method's extra exchanges (CCVR's statistics round) use it too
        self.channel: Channel | None = None
        self.asked: list[int] = []  # the partitions sent training work this round
        self.round_log = RoundLog()  # the round in flight (configure_round starts a new one)
        self.server_hooks: list[ServerHooks] = [
            h for h in (p.server_hooks(setup) for p in active_plugins(cfg)) if h is not None
        ]
        #: the activity measures of the run's components (``fedsuite.method.activity``), logged each round
        self.activity_measures: tuple[str, ...] = tuple(c.measure for c in cfg.components)

    @property
    def partition_ids(self) -> list[int]:
        """Every known partition id, connected or not, in increasing order: the values of the run's
        node map (``ServerSetup.node_to_pid``, kept current by the engine)."""
        return sorted(set(self.setup.node_to_pid.values()))

    def reachable(self, pid: int) -> bool:
        """Whether partition ``pid`` can be sent a message now (``Channel.reachable``; every known
        partition when no channel is set)."""
        return self.channel is None or self.channel.reachable(pid)

    # --- sampling and payloads ------------------------------------------------------------------
    def sample_cohort(self, server_round: int) -> list[int]:
        """K distinct partition ids, uniformly without replacement, seeded by (seed, round)."""
        pids = np.array(self.partition_ids)
        k = min(self.cfg.cohort_size, len(pids))
        rng = round_rng(self.cfg.seed, server_round, COHORT_TAG)
        return sorted(int(p) for p in rng.choice(pids, size=k, replace=False))

    def local_lr(self, server_round: int) -> float:
        """η_l^t = η_l · decay^(t-1)."""
        return self.cfg.lr * self.cfg.lr_decay ** (server_round - 1)

    def train_config(self, server_round: int) -> dict[str, Any]:
        """Scalars every client receives this round."""
        return {SERVER_ROUND: server_round, LR: self.local_lr(server_round)}

    def prepare_round(self, server_round: int, cohort: list[int]) -> None:
        """Called once per round with the sampled cohort, before any payload is built."""

    def client_payload(self, server_round: int, pid: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        """The message content for client ``pid`` (default: the global model and the config)."""
        return RecordDict({ARRAYS: arrays, CONFIG: config})

    def record_drop(self, pid: int, reason: str) -> None:
        log.warning("round %s: dropped client %s: %s", self.round_log.round, pid, reason)
        self.round_log.drop(pid, reason)

    # --- one round, whatever the channel -------------------------------------------------------
    def train_round(self, server_round: int, arrays: NDArrays, channel: Channel) -> tuple[NDArrays, dict[str, float]]:
        """Round ``server_round`` (global, 1-based) from w^t = ``arrays``: the cohort's payloads go out
        through ``channel`` (kept as :attr:`channel` for the round), the replies come back and the
        server rule makes w^{t+1}. Returns (w^{t+1}, the cohort's mean training metrics); the
        round's record is ``round_log``."""
        self.channel = channel
        contents = self.configure_round(server_round, arrays)
        replies = channel.exchange(MessageType.TRAIN, contents, self.cfg.round_timeout_s)
        return self.aggregate_round(server_round, replies)

    def configure_round(self, server_round: int, arrays: NDArrays,
                        config: dict[str, Any] | None = None) -> dict[int, RecordDict]:
        """Sample the cohort and build each reachable client's message content (the method's
        :meth:`client_payload`, then the plug-ins' ``payload``); a sampled client that is not
        :meth:`reachable` is recorded as dropped. Returns {partition id: content}. ``config``: extra
        scalars for every client's ``"config"`` (the round's own, :meth:`train_config`, win)."""
        record = to_record(arrays)  # one conversion a round: every payload shares it
        # w^t as the clients receive it, decoded from that record as every reply is: a norm or sum
        # over it then reads the same memory layout on every path (numpy's SIMD sums depend on it)
        self.global_arrays = to_ndarrays(record)
        cohort = self.sample_cohort(server_round)
        self.round_log = RoundLog(round=server_round, cohort=cohort)
        self.prepare_round(server_round, cohort)
        conf = ConfigRecord({**(config or {}), **self.train_config(server_round)})
        contents: dict[int, RecordDict] = {}
        for pid in cohort:
            if not self.reachable(pid):
                continue
            content = self.client_payload(server_round, pid, record, conf)
            for hooks in self.server_hooks:
                hooks.payload(server_round, pid, content)
            self.round_log.count_bytes(pid, sent=record_nbytes(content))
            contents[pid] = content
        for pid in cohort:
            if pid not in contents:
                self.record_drop(pid, DROP_NOT_CONNECTED)
        self.asked = list(contents)
        return contents

    def query_statistics(self, server_round: int, pids: Iterable[int], arrays: ArrayRecord) -> dict[int, NDArrays]:
        """Ask the connected clients among ``pids`` for their rule's statistics of the model ``arrays``
        (message type ``STATISTICS_QUERY``: no training, no plug-in; ``ClientRule.statistics``).
        Returns {partition id: statistics}. A reply that fails, lacks the record, holds non-finite
        values or never comes is dropped and logged in this round's log like a failed training reply.
        Needs the round's :attr:`channel`."""
        conf = ConfigRecord({SERVER_ROUND: server_round})
        asked = {pid: RecordDict({ARRAYS: arrays, CONFIG: conf}) for pid in pids if self.reachable(pid)}
        for pid, content in asked.items():
            self.round_log.count_bytes(pid, sent=record_nbytes(content))
        replies = self.channel.exchange(STATISTICS_QUERY, asked, self.cfg.round_timeout_s)
        stats: dict[int, NDArrays] = {}
        for pid in sorted(asked):
            if pid not in replies:
                self.record_drop(pid, f"statistics query: {DROP_TIMEOUT} ({self.cfg.round_timeout_s:g} s)")
                continue
            problem, records = self.receive(replies[pid], STATISTICS, pid=pid, records=self.records.statistics)
            if problem:
                self.record_drop(pid, f"statistics query: {problem}")
            else:
                stats[pid] = records[STATISTICS]
        return stats

    # --- replies --------------------------------------------------------------------------------
    def receive(self, reply: Reply, arrays: str | None, metrics: str | None = None,
                template: NDArrays | None = None, *, pid: int, keys: Iterable[str] = (),
                records: Iterable[Record] = ()) -> tuple[str | None, dict[str, NDArrays]]:
        """Count client ``pid``'s reply's bytes into the round's log (unless an error) and validate it
        (``fedsuite.method.replies.check_reply``, given ``keys`` and declared ``records``): (problem, {}) or (None, records)."""
        if not reply.has_error():
            self.round_log.count_bytes(pid, received=record_nbytes(reply.content))
        return check_reply(reply, arrays, metrics, template, keys, records, self.record_trainable)

    def parse_replies(self, replies: dict[int, Reply]) -> list[ClientReply]:
        """Drop and log bad training replies (one lacking a declared record among them); return the good ones."""
        good: list[ClientReply] = []
        for pid in sorted(replies):
            problem, records = self.receive(replies[pid], ARRAYS, METRICS, self.template, pid=pid, records=self.reply_records)
            if problem:
                log.warning("round %s: dropped reply of client %s: %s", self.round_log.round, pid, problem)
                self.round_log.drop(pid, problem)
                continue
            metrics = {k: float(v) for k, v in replies[pid].content[METRICS].items() if not isinstance(v, list)}
            arrays = records.pop(ARRAYS)
            good.append(ClientReply(pid, arrays, int(metrics[NUM_EXAMPLES]), metrics, records))
            steps = int(metrics[NUM_STEPS]) if NUM_STEPS in metrics else None
            self.round_log.note(pid, num_examples=int(metrics[NUM_EXAMPLES]), num_steps=steps,
                                train_loss=metrics[TRAIN_LOSS], train_seconds=metrics.get(TRAIN_SECONDS))
        return good

    def aggregate_round(self, server_round: int, replies: dict[int, Reply]) -> tuple[NDArrays, dict[str, float]]:
        """The replies of round ``server_round`` (by partition id; an asked partition that is absent
        did not answer in time) -> (w^{t+1}, the cohort's mean training metrics): bad replies are
        dropped and logged, the plug-ins observe the good ones, failures are counted (and may fail
        the run: :class:`RoundFailure`), then the server rule :meth:`aggregate` runs."""
        good = self.parse_replies(replies)
        for pid in self.asked:
            if pid not in replies:  # the channel gave up at round_timeout_s
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
        self.round_log.train_loss = metrics[TRAIN_LOSS]
        # the cohort's example-weighted mean of each component's activity measure (fedsuite.method.activity)
        self.round_log.add({m: metrics[m] for m in self.activity_measures if m in metrics})
        self.after_aggregate(server_round)
        return new_arrays, metrics

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
        clients through :attr:`channel` (CCVR's statistics round: :meth:`query_statistics`)."""

    def aggregate_metrics(self, replies: list[ClientReply]) -> dict[str, float]:
        """Example-weighted mean of the clients' scalar metrics."""
        return metric_means(replies, lambda key: key not in BOOKKEEPING_METRICS)

    def evaluation_arrays(self, arrays: NDArrays) -> NDArrays:
        """The model the engine evaluates after a round, centrally and on the clients (default: the global model
        itself). A method whose evaluated model differs from the next round's start point
        (CCVR's calibrated head, FedExP's iterate average) overrides this."""
        return arrays

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
