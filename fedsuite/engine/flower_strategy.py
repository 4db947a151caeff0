"""A fedsuite method as a Flower ``Strategy``, for a Flower user's own ServerApp
(``fedsuite.engine.server_app.method_strategy``, ``docs/flower-app.md``).

:class:`MethodStrategy` has a method's server half (``fedsuite.method.strategy.FedSuiteStrategy``:
``method``) and runs its protocol inside Flower's own loop (``Strategy.start``): ``configure_train``
is the method's ``configure_round`` as Flower messages over the grid, ``aggregate_train`` its
``aggregate_round`` of the replies, and ``configure_evaluate``/``aggregate_evaluate`` the engine's
federated evaluation (``federated_eval``, ``fedsuite.engine.client_eval``). It keeps the run's node map
(``fedsuite.engine.nodes.NodeMap``, refreshed before every round as the round engine refreshes it) and
hands the method a ``fedsuite.engine.transport.Link`` over Flower's grid for each round, so the method
reaches its clients as it does under the round engine (CCVR's statistics round included).

Flower's loop counts rounds from 1, which is the global round of a fresh run; such a run keeps no
checkpoint and cannot be resumed.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedsuite.engine.client_eval import EvaluationRequest, collect_evaluation, request_evaluation
from fedsuite.engine.nodes import Exchange, NodeMap
from fedsuite.engine.transport import FlowerTransport, Link
from fedsuite.method.strategy import FedSuiteStrategy
from fedsuite.method.wire import to_ndarrays, to_record

log = logging.getLogger("fedsuite")

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


class MethodStrategy(Strategy):
    """A Flower ``Strategy`` over the fedsuite method ``method`` (see module)."""

    def __init__(self, method: FedSuiteStrategy) -> None:
        self.method = method
        self.cfg = method.cfg
        #: Flower node id <-> partition id (the method's ``ServerSetup.node_to_pid``, kept current)
        self.nodes = NodeMap(method.setup.node_to_pid)
        self.sent = Exchange(self.nodes)  # configure_train's messages, for aggregate_train
        #: the rounds of the run in flight: the config's, or what :meth:`start` was given
        self.num_rounds: int = self.cfg.rounds
        #: fedsuite's run records when the app's run config asks for them
        #: (``fedsuite.engine.flower_loop.LoopRecords``, set by ``method_strategy``); None: :meth:`start`
        #: writes no records
        self.loop_records: Any = None
        #: the federated evaluation in flight: (request, messages) of :meth:`configure_evaluate`
        self.evaluation: tuple[EvaluationRequest, Exchange] | None = None

    @property
    def round_log(self):
        """The method's record of the round in flight (``fedsuite.method.rounds.RoundLog``)."""
        return self.method.round_log

    def link(self, grid: Grid | None) -> Link:
        """The method's channel over ``grid`` (a ``Link`` of a ``FlowerTransport`` and the node map)."""
        return Link(FlowerTransport(grid), self.nodes, self.cfg.num_clients, self.cfg.round_timeout_s)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Flower's ``configure_train``: the node map refreshed, then the method's ``configure_round``
        (``config`` adds to each client's config) as messages over ``grid``; the method's channel for
        the round is ``grid``'s. ``server_round`` is taken as the global round."""
        link = self.link(grid)
        link.refresh()
        self.method.channel = link
        contents = self.method.configure_round(server_round, to_ndarrays(arrays), dict(config))
        self.sent = link.transport.messages(MessageType.TRAIN, contents, self.nodes)
        return self.sent.messages()

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's ``aggregate_train``: the method's ``aggregate_round`` of the replies to
        :meth:`configure_train`'s messages (each attributed to the partition of the message it answers)."""
        new_arrays, metrics = self.method.aggregate_round(server_round, FlowerTransport.replies(self.sent, replies))
        return to_record(new_arrays), MetricRecord(metrics)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int | None = None, timeout: float | None = None,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: EvaluateFn | None = None) -> Result:
        """Flower's own loop (``Strategy.start``) over the method, with fedsuite's defaults:
        ``num_rounds`` the config's ``rounds``, ``timeout`` (seconds a round waits for replies) its
        ``round_timeout_s``, and ``evaluate_fn`` (Flower's central evaluation, called with w^0 and
        after each round) :meth:`central_evaluation`. Flower's ``Result`` then holds the test
        accuracy of each evaluated round (``evaluate_metrics_serverapp``). With ``loop_records``
        (the app asked for them) fedsuite's run records are written around the loop: a
        ``metrics.jsonl`` line after each call of ``evaluate_fn`` (the last thing Flower's loop does in
        a round, after ``aggregate_train`` and the federated evaluation, whose
        ``aggregate_evaluate`` may add columns to the round's ``RoundLog``), ``summary.json``
        at the end (``fedsuite.engine.flower_loop``)."""
        self.num_rounds = self.cfg.rounds if num_rounds is None else int(num_rounds)
        evaluate_fn = self.central_evaluation if evaluate_fn is None else evaluate_fn
        timeout = self.cfg.round_timeout_s if timeout is None else timeout

        def loop(fn: EvaluateFn) -> Result:
            return Strategy.start(self, grid=grid, initial_arrays=initial_arrays, num_rounds=self.num_rounds,
                                  timeout=timeout, train_config=train_config, evaluate_config=evaluate_config,
                                  evaluate_fn=fn)

        return loop(evaluate_fn) if self.loop_records is None else self.loop_records.run(loop, evaluate_fn)

    def evaluates(self, server_round: int) -> bool:
        """``cfg.evaluates`` in Flower's loop: every ``eval_every`` rounds and the last of :attr:`num_rounds`."""
        return server_round % self.cfg.eval_every == 0 or server_round == self.num_rounds

    def central_evaluation(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Flower's ``evaluate_fn``: fedsuite's central evaluation (``ServerSetup.evaluate``, on the
        run's test set) of round ``server_round``'s global model ``arrays`` as the method evaluates
        it (``evaluation_arrays``; round 0: w^0 itself): ``{"accuracy", "loss"}``, in round 0
        and the rounds of :meth:`evaluates`; None in the others, and where the setup has no evaluator."""
        evaluate = self.method.setup.evaluate
        if evaluate is None or not (server_round == 0 or self.evaluates(server_round)):
            return None
        model = to_ndarrays(arrays)
        test = evaluate(model if server_round == 0 else self.method.evaluation_arrays(model))
        return MetricRecord({key: float(value) for key, value in test.items()})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Flower's ``configure_evaluate``: with ``federated_eval`` on, in the rounds of :meth:`evaluates`,
        ``fedsuite.engine.client_eval.request_evaluation`` of the method's ``evaluation_arrays``
        (``arrays``) as ``EVALUATE`` messages over ``grid`` (``config`` unused: fedsuite's own is sent); else none."""
        self.evaluation = None
        if self.cfg.federated_eval == "off" or not self.evaluates(server_round):
            return []
        request = request_evaluation(self.method, server_round, self.method.evaluation_arrays(to_ndarrays(arrays)))
        exchange = FlowerTransport(grid).messages(MessageType.EVALUATE, request.asked, self.nodes)
        self.evaluation = (request, exchange)
        return exchange.messages()

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Flower's ``aggregate_evaluate``: ``fedsuite.engine.client_eval.collect_evaluation`` of the replies
        (may raise ``RoundFailure``); its columns go into the round's ``RoundLog`` and, those
        not None, are returned (Flower's ClientApp-side metrics); None in a round without."""
        if self.evaluation is None:
            return None
        (request, exchange), self.evaluation = self.evaluation, None
        columns = collect_evaluation(self.method, request, FlowerTransport.replies(exchange, replies))
        self.method.round_log.add(columns)
        return MetricRecord({key: value for key, value in columns.items() if value is not None})

    def summary(self) -> None:
        """Flower's ``summary`` (logged as the loop starts): the method, its clients and cohort."""
        log.info("%s: %s, %d clients, %d a round", type(self.method).__name__, self.cfg.strategy,
                 self.cfg.num_clients, self.cfg.cohort_size)
