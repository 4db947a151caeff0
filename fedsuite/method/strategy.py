"""The server-rule base every fedsuite method subclasses: one round's protocol, from sampling the
cohort to the aggregated model and the round's log, apart from how the messages travel.

The round engine (``fedsuite.engine.round_engine``) owns the loop and calls :meth:`FedSuiteStrategy.train_round`
once a round with a transport (``fedsuite.engine.transport``: Flower's grid, or the ClientApp's handlers in
this process). The class is also an honest Flower ``Strategy``: ``configure_train`` and
``aggregate_train`` run the same protocol inside Flower's own loop, and ``configure_evaluate`` and
``aggregate_evaluate`` the engine's federated evaluation (``federated_eval``, ``fedsuite.engine.client_eval``),
so a Flower user's ServerApp can ``start`` any fedsuite method. What the protocol does, and why:

* the cohort is sampled by *partition id* with a generator seeded from (seed, round), so the same
  seed gives the same clients, in simulation and deployment alike;
* each sampled client gets its own message, built by :meth:`client_payload` (FedMR sends each a
  different model, SCAFFOLD adds the server control variate, ...), then by the plug-ins' server
  halves (``ServerHooks.payload``; each got the ``ServerSetup`` when built, and ``observe`` gets the
  round's :class:`RoundLog`);
* the node map (``fedsuite.engine.nodes.NodeMap``) is refreshed by the transport before every round: a
  SuperNode that reconnects with a new node id is asked its partition id and gets work again; a
  sampled client whose node is not connected is sent nothing. Replies come back by partition id, so
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

Rounds are global (1-based over the whole run, resumes included): the engine counts them; Flower's
own loop counts from 1, which is the global round of a fresh run.

:class:`ServerSetup`, :class:`RoundLog` and :class:`RoundFailure` are defined in ``fedsuite.method.rounds``
(the plug-ins' server halves use them too) and re-exported here.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedsuite.method.arrays import weighted_mean
from fedsuite.engine.nodes import Exchange, NodeMap
from fedsuite.method.plugins import ServerHooks, active_plugins
from fedsuite.method.rounds import DROP_NOT_CONNECTED, DROP_TIMEOUT, RoundFailure, RoundLog, ServerSetup
from fedsuite.method.seeding import COHORT_TAG, round_rng
from fedsuite.method.replies import Reply, check_reply, metric_means
from fedsuite.engine.transport import FlowerTransport, Transport
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


class FedSuiteStrategy(Strategy):
    """A method's server half (see module): the round's protocol between the engine and a transport,
    and an honest Flower ``Strategy`` (``configure_train``/``aggregate_train`` over the same protocol,
    ``configure_evaluate``/``aggregate_evaluate`` over the same federated evaluation)."""

    def __init__(self, setup: ServerSetup) -> None:
        cfg = setup.cfg
        self.setup = setup
        self.cfg = cfg
        self.params = cfg.method_params
        self.records = cfg.method.records  # what the method's halves exchange (its registration's)
        self.reply_records: tuple[Record, ...] = reply_records(self.records, cfg)  # checked on every training reply
        trainable_layout = any(r.layout == TRAINABLE_LAYOUT for r in self.reply_records)
        self.record_trainable = setup.trainable_keys() if trainable_layout else None  # that layout's names
        self.nodes = NodeMap(setup.node_to_pid)  # Flower node id <-> partition id, refreshed every round
        self.template = setup.initial
        self.global_arrays: NDArrays = dict(setup.initial)  # w^t as last sent
        #: how the round in flight reaches the clients (None in strategy-level tests that drive the
        #: rounds by hand); a method's extra exchanges (CCVR's statistics round) use it too
        self.transport: Transport | None = None
        self.asked: list[int] = []  # the partitions sent training work this round
        self.flower_exchange = Exchange(self.nodes)  # configure_train's messages, for aggregate_train
        self.round_log = RoundLog()  # the round in flight (configure_round starts a new one)
        self.server_hooks: list[ServerHooks] = [
            h for h in (p.server_hooks(setup) for p in active_plugins(cfg)) if h is not None
        ]
        #: the activity measures of the run's components (``fedsuite.method.activity``), logged each round
        self.activity_measures: tuple[str, ...] = tuple(c.measure for c in cfg.components)
        #: the rounds of the run in flight: the config's, or what :meth:`start` was given
        self.num_rounds: int = cfg.rounds
        #: fedsuite's run records when this strategy runs in Flower's own loop (:meth:`start`) and the
        #: app's run config asks for them (``fedsuite.engine.flower_loop.LoopRecords``, set by
        #: ``fedsuite.engine.server_app.method_strategy``); None: :meth:`start` writes no records
        self.loop_records: Any = None
        #: the federated evaluation in flight in Flower's loop: (request, messages) of ``configure_evaluate``
        self.evaluation: tuple[Any, Exchange] | None = None

    @property
    def pid_to_node(self) -> dict[int, int]:
        """Partition id -> the Flower node id that last said it holds it (connected or not)."""
        return self.nodes.pid_to_node

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
        return {SERVER_ROUND: server_round, LR: self.local_lr(server_round)}

    def prepare_round(self, server_round: int, cohort: list[int]) -> None:
        """Called once per round with the sampled cohort, before any payload is built."""

    def client_payload(self, server_round: int, pid: int, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        """The message content for client ``pid`` (default: the global model and the config)."""
        return RecordDict({ARRAYS: arrays, CONFIG: config})

    def record_drop(self, pid: int, reason: str) -> None:
        log.warning("round %s: dropped client %s: %s", self.round_log.round, pid, reason)
        self.round_log.drop(pid, reason)

    # --- one round, whatever the transport -----------------------------------------------------
    def train_round(self, server_round: int, arrays: NDArrays, transport: Transport) -> tuple[NDArrays, dict[str, float]]:
        """Round ``server_round`` (global, 1-based) from w^t = ``arrays``: the cohort's payloads go out
        through ``transport``, the replies come back and the server rule makes w^{t+1}.
        Returns (w^{t+1}, the cohort's mean training metrics); the round's record is ``round_log``."""
        self.transport = transport
        transport.refresh(self.nodes, self.cfg.num_clients, self.cfg.round_timeout_s)
        contents = self.configure_round(server_round, arrays)
        replies = transport.exchange(MessageType.TRAIN, contents, self.nodes, self.cfg.round_timeout_s)
        return self.aggregate_round(server_round, replies)

    def configure_round(self, server_round: int, arrays: NDArrays,
                        config: dict[str, Any] | None = None) -> dict[int, RecordDict]:
        """Sample the cohort and build each reachable client's message content (the method's
        :meth:`client_payload`, then the plug-ins' ``payload``); a sampled client whose node is not
        connected is recorded as dropped. Returns {partition id: content}."""
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
            if self.nodes.node_of(pid) is None:
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

    # --- Flower's Strategy interface: the same round, driven by Flower's loop ------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Flower's ``configure_train``: :meth:`configure_round` as messages over ``grid``.
        ``server_round`` is taken as the global round (Flower's loop counts from 1: a fresh run)."""
        transport = FlowerTransport(grid)
        self.transport = transport
        transport.refresh(self.nodes, self.cfg.num_clients, self.cfg.round_timeout_s)
        contents = self.configure_round(server_round, to_ndarrays(arrays), dict(config))
        self.flower_exchange = transport.messages(MessageType.TRAIN, contents, self.nodes)
        return self.flower_exchange.messages()

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's ``aggregate_train``: :meth:`aggregate_round` of the replies to :meth:`configure_train`'s messages."""
        new_arrays, metrics = self.aggregate_round(server_round, FlowerTransport.replies(self.flower_exchange, replies))
        return to_record(new_arrays), MetricRecord(metrics)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int | None = None, timeout: float | None = None,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
        """Flower's own loop (``Strategy.start``) over this method, with fedsuite's defaults:
        ``num_rounds`` the config's ``rounds``, ``timeout`` (seconds a round waits for replies) its
        ``round_timeout_s``, and ``evaluate_fn`` (Flower's central evaluation, called with w^0 and
        after each round) :meth:`central_evaluation`. Flower's ``Result`` then holds the test
        accuracy of each evaluated round (``evaluate_metrics_serverapp``). With ``loop_records``
        (the app asked for them) fedsuite's run records are written around the loop: a
        ``metrics.jsonl`` line after each call of ``evaluate_fn`` (the last thing Flower's loop does in
        a round, after ``aggregate_train`` and the federated evaluation, whose
        ``aggregate_evaluate`` may add columns to the round's :class:`RoundLog`), ``summary.json``
        at the end (``fedsuite.engine.flower_loop``)."""
        self.num_rounds = self.cfg.rounds if num_rounds is None else int(num_rounds)
        evaluate_fn = self.central_evaluation if evaluate_fn is None else evaluate_fn
        timeout = self.cfg.round_timeout_s if timeout is None else timeout

        def loop(fn: Callable[[int, ArrayRecord], MetricRecord | None]) -> Result:
            return Strategy.start(self, grid=grid, initial_arrays=initial_arrays, num_rounds=self.num_rounds,
                                  timeout=timeout, train_config=train_config, evaluate_config=evaluate_config,
                                  evaluate_fn=fn)

        return loop(evaluate_fn) if self.loop_records is None else self.loop_records.run(loop, evaluate_fn)

    def evaluates(self, server_round: int) -> bool:
        """``cfg.evaluates`` in Flower's loop: every ``eval_every`` rounds and the last of :attr:`num_rounds`."""
        return server_round % self.cfg.eval_every == 0 or server_round == self.num_rounds

    def central_evaluation(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Flower's ``evaluate_fn``: fedsuite's central evaluation (``ServerSetup.evaluate``, on the
        run's test set) of round ``server_round``'s global model ``arrays`` as this method evaluates
        it (:meth:`evaluation_arrays`; round 0: w^0 itself): ``{"accuracy", "loss"}``, in round 0
        and the rounds of :meth:`evaluates`; None in the others, and where the setup has no evaluator."""
        if self.setup.evaluate is None or not (server_round == 0 or self.evaluates(server_round)):
            return None
        model = to_ndarrays(arrays)
        test = self.setup.evaluate(model if server_round == 0 else self.evaluation_arrays(model))
        return MetricRecord({key: float(value) for key, value in test.items()})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Flower's ``configure_evaluate``: with ``federated_eval`` on, in the rounds of :meth:`evaluates`,
        ``fedsuite.engine.client_eval.request_evaluation`` of :meth:`evaluation_arrays` (``arrays``) as
        ``EVALUATE`` messages over ``grid`` (``config`` unused: fedsuite's own is sent); else none."""
        from fedsuite.engine.client_eval import request_evaluation

        self.evaluation = None
        if self.cfg.federated_eval == "off" or not self.evaluates(server_round):
            return []
        request = request_evaluation(self, server_round, self.evaluation_arrays(to_ndarrays(arrays)))
        exchange = FlowerTransport(grid).messages(MessageType.EVALUATE, request.asked, self.nodes)
        self.evaluation = (request, exchange)
        return exchange.messages()

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Flower's ``aggregate_evaluate``: ``fedsuite.engine.client_eval.collect_evaluation`` of the replies
        (may raise ``RoundFailure``); its columns go into the round's :class:`RoundLog` and, those
        not None, are returned (Flower's ClientApp-side metrics); None in a round without."""
        from fedsuite.engine.client_eval import collect_evaluation

        if self.evaluation is None:
            return None
        (request, exchange), self.evaluation = self.evaluation, None
        columns = collect_evaluation(self, request, FlowerTransport.replies(exchange, replies))
        self.round_log.add(columns)
        return MetricRecord({key: value for key, value in columns.items() if value is not None})

    def summary(self) -> None:
        log.info("%s: %s, %d clients, %d a round", type(self).__name__, self.cfg.strategy, self.cfg.num_clients,
                 self.cfg.cohort_size)

    def query_statistics(self, server_round: int, pids: Iterable[int], arrays: ArrayRecord) -> dict[int, NDArrays]:
        """Ask the connected clients among ``pids`` for their rule's statistics of the model ``arrays``
        (message type ``STATISTICS_QUERY``: no training, no plug-in; ``ClientRule.statistics``).
        Returns {partition id: statistics}. A reply that fails, lacks the record, holds non-finite
        values or never comes is dropped and logged in this round's log like a failed training reply."""
        conf = ConfigRecord({SERVER_ROUND: server_round})
        asked = {pid: RecordDict({ARRAYS: arrays, CONFIG: conf}) for pid in pids if self.nodes.node_of(pid) is not None}
        for pid, content in asked.items():
            self.round_log.count_bytes(pid, sent=record_nbytes(content))
        replies = self.transport.exchange(STATISTICS_QUERY, asked, self.nodes, self.cfg.round_timeout_s)
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
            if pid not in replies:  # the transport gave up at round_timeout_s
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
        clients through ``self.transport`` (CCVR's statistics round: :meth:`query_statistics`)."""

    def aggregate_metrics(self, replies: list[ClientReply]) -> dict[str, float]:
        """Example-weighted mean of the clients' scalar metrics."""
        return metric_means(replies, lambda key: key not in BOOKKEEPING_METRICS)

    def evaluation_arrays(self, arrays: NDArrays) -> NDArrays:
        """The model the ServerApp evaluates centrally after a round (default: the global model
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
