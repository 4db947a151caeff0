"""Federated evaluation (``federated_eval``): clients evaluate the global model on their own test data.

Every ``eval_every`` rounds and at the last (``cfg.evaluates``, the rounds of central evaluation), after
the round's aggregation, the engine sends the model it evaluates centrally (the strategy's
``evaluation_arrays`` of w^{t+1}) to the round's cohort (``federated_eval = "cohort"``) or to every
client (``"all"``) as an evaluation message (Flower's ``MessageType.EVALUATE``, through either
transport). Each client (:func:`evaluate_locally`, in the ClientApp) evaluates it on its own test
data (``fedsuite.engine.runtime.client_split``: its own test split, or its seeded held-out share of
``local_test_fraction``) and, with ``finetune_steps`` = s > 0, evaluates its personalised model too:
the global model after s local SGD steps on its training data (:func:`finetune`; FL-bench's and
PFLlib's fine-tuned accuracy). The server (:func:`evaluate_clients`) validates every reply
(``fedsuite.method.replies.check_reply``: a reply without one of ``fedsuite.method.wire.evaluation_keys`` is a
failed reply, with its reason) and adds to the round's ``metrics.jsonl`` line, over the m clients
that answered, with n_i test samples and accuracy a_i each (:func:`accuracy_columns`):

    client_accuracy_weighted = Σ_i n_i a_i / Σ_i n_i
    client_accuracy_mean     = (1/m) Σ_i a_i
    client_accuracy_std      = sqrt( Σ_i (a_i − mean)² / (m − 1) )        (sample std, ddof = 1; None for m = 1)
    client_accuracy_worst10  = mean of the ⌈m/10⌉ lowest a_i             (the worst decile)
    client_loss_weighted     = Σ_i n_i loss_i / Σ_i n_i

and the same with ``personal_`` for the personalised models, ``clients_evaluated`` (m) and
``client_eval_failed``. Each client's own numbers go into its ``clients.jsonl`` row
(``fedsuite.method.rounds.CLIENT_FIELDS``). Failed evaluation replies count as failed training replies do:
more than ``max_failed_fraction`` of the clients asked, or none answering, fails the run
(``RoundFailure``) before the round is checkpointed.

The server's half is two halves, :func:`request_evaluation` (the messages' contents) and
:func:`collect_evaluation` (the replies' validation and the columns): the engine runs both around one
exchange (:func:`evaluate_clients`); in Flower's own loop (a ServerApp of one's own that calls ``start`` on a
method) the engine's Flower ``Strategy`` adapter's ``configure_evaluate`` and ``aggregate_evaluate``
(``fedsuite.engine.flower_strategy``) run them around Flower's.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ConfigRecord, MessageType, RecordDict

from fedsuite.method.client_records import STATISTICS
from fedsuite.models import draws_global_rng
from fedsuite.method.rounds import DROP_NOT_CONNECTED, DROP_TIMEOUT, RoundFailure
from fedsuite.method.seeding import global_seed, seed_for
from fedsuite.method.training import SGD, LocalData, clip_grad, evaluate
from fedsuite.method.wire import (
    ARRAYS, CONFIG, EVAL_ACCURACY, EVAL_LOSS, LR, METRICS, NUM_EXAMPLES, PERSONAL_ACCURACY, PERSONAL_LOSS,
    SERVER_ROUND, NDArrays, evaluation_keys, record_nbytes, to_record,
)

if TYPE_CHECKING:
    from fedsuite.method.channel import Channel
    from fedsuite.method.replies import Reply
    from fedsuite.method.rounds import RoundLog


class EvaluatedStrategy(Protocol):
    """What federated evaluation reads of the method's strategy (``fedsuite.method.strategy.FedSuiteStrategy``)."""

    cfg: Any
    round_log: RoundLog

    def local_lr(self, server_round: int) -> float: ...

    def reachable(self, pid: int) -> bool: ...

    def receive(self, *args: Any, **kwargs: Any) -> Any: ...

log = logging.getLogger("fedsuite")

#: the purpose tag of a personalised evaluation's draws (``fedsuite.method.seeding``): its batches' order
#: and torch's global generator are seeded by (seed, partition id, round, FINETUNE_TAG)
FINETUNE_TAG = 0xF17E


# --- the client's half ------------------------------------------------------------------------------
def evaluate_locally(model: torch.nn.Module, train: LocalData, test: LocalData, cfg: Any, pid: int,
                     server_round: int, lr: float) -> dict[str, float]:
    """The metrics of an evaluation reply: the received model's accuracy and loss on ``test``
    (``fedsuite.method.training.evaluate``), then, with ``cfg.finetune_steps`` > 0, the same after
    :func:`finetune` on ``train`` (``model`` is changed)."""
    out: dict[str, float] = {}
    glob = evaluate(model, test.x, test.y, test.bundle, cfg.eval_batch_size)
    out[EVAL_ACCURACY], out[EVAL_LOSS] = glob["accuracy"], glob["loss"]
    if cfg.finetune_steps > 0:
        seed = seed_for(cfg.seed, pid, server_round, FINETUNE_TAG)
        generator = torch.Generator(device=train.x.device).manual_seed(seed)
        with global_seed(seed, draws_global_rng(model)):
            finetune(model, train, cfg, generator, cfg.finetune_steps, lr)
        own = evaluate(model, test.x, test.y, test.bundle, cfg.eval_batch_size)
        out[PERSONAL_ACCURACY], out[PERSONAL_LOSS] = own["accuracy"], own["loss"]
    return out


def finetune(model: torch.nn.Module, data: LocalData, cfg: Any, generator: torch.Generator, steps: int,
             lr: float) -> None:
    """``steps`` local SGD steps on ``data`` from the model's weights, whatever the run's method:
    mini-batches of ``batch_size`` in the order :meth:`LocalData.batches` draws from ``generator``
    (a new epoch's order when one is used up), mean cross-entropy, ``grad_clip``, and
    ``fedsuite.method.training.SGD`` with ``lr``, the run's ``momentum`` and ``weight_decay``:

        w ← w − lr · (∇ℓ(w; b) + λ_wd · w)      [with momentum μ as local training has it]
    """
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    done = 0
    while done < steps:
        for x, y in data.batches(cfg.batch_size, generator):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            clip_grad(params, cfg.grad_clip)
            opt.step()
            done += 1
            if done == steps:
                return


# --- the server's half ------------------------------------------------------------------------------
def evaluation_content(strategy: EvaluatedStrategy, server_round: int, arrays: NDArrays) -> RecordDict:
    """An evaluation message's content: the model and the config (``server-round``, ``lr``: the
    round's local learning rate, which a personalised evaluation's steps use)."""
    conf = ConfigRecord({SERVER_ROUND: server_round, LR: strategy.local_lr(server_round)})
    return RecordDict({ARRAYS: to_record(arrays), CONFIG: conf})


@dataclass
class EvaluationRequest:
    """One round's federated evaluation as sent: the clients asked (``pids``), the content each
    connected one is sent (``asked``, by partition id) and the failures known before sending
    (``problems``: a client whose node is not connected)."""

    server_round: int
    pids: list[int]
    asked: dict[int, RecordDict] = field(default_factory=dict)
    problems: dict[int, str] = field(default_factory=dict)


def evaluate_clients(strategy: EvaluatedStrategy, server_round: int, arrays: NDArrays,
                     channel: Channel) -> dict[str, Any]:
    """Round ``server_round``'s federated evaluation of ``arrays`` (see module) through
    ``channel`` (the run's ``fedsuite.engine.transport.Link``): :func:`request_evaluation`, the
    exchange, :func:`collect_evaluation`."""
    request = request_evaluation(strategy, server_round, arrays)
    replies = channel.exchange(MessageType.EVALUATE, request.asked, strategy.cfg.round_timeout_s) if request.asked else {}
    return collect_evaluation(strategy, request, replies)


def request_evaluation(strategy: EvaluatedStrategy, server_round: int, arrays: NDArrays) -> EvaluationRequest:
    """The first half of a federated evaluation: the clients to ask (the round's cohort, or every
    client, per ``federated_eval``), each connected one's content (:func:`evaluation_content`, its
    bytes counted into the round's log); a client the strategy cannot reach now (its node is not
    connected: ``FedSuiteStrategy.reachable``) is a failure."""

    cfg, round_log = strategy.cfg, strategy.round_log
    pids = sorted(round_log.cohort) if cfg.federated_eval == "cohort" else list(range(cfg.num_clients))
    content = evaluation_content(strategy, server_round, arrays)
    request = EvaluationRequest(server_round, pids)
    for pid in pids:
        if not strategy.reachable(pid):
            request.problems[pid] = DROP_NOT_CONNECTED
            continue
        round_log.count_bytes(pid, sent=record_nbytes(content))
        request.asked[pid] = content
    return request


def collect_evaluation(strategy: EvaluatedStrategy, request: EvaluationRequest,
                       replies: dict[int, Reply]) -> dict[str, Any]:
    """The second half: the replies to ``request`` by partition id (an asked client that is absent
    did not answer in time). Each reply is validated (``check_reply`` with
    ``fedsuite.method.wire.evaluation_keys``); each client's numbers or failure go into its row of the
    round's log (``RoundLog.note``), and the round's columns are returned. Raises
    :class:`RoundFailure` past ``max_failed_fraction`` of the clients asked, or when none answered."""

    cfg, round_log, server_round = strategy.cfg, strategy.round_log, request.server_round
    problems = dict(request.problems)
    keys = evaluation_keys(cfg.finetune_steps)
    answers: dict[int, dict[str, float]] = {}
    for pid in sorted(request.asked):
        if pid not in replies:
            problems[pid] = f"{DROP_TIMEOUT} ({cfg.round_timeout_s:g} s)"
            continue
        problem, _ = strategy.receive(replies[pid], None, METRICS, pid=pid, keys=keys)
        if problem:
            problems[pid] = problem
            continue
        metrics = replies[pid].content[METRICS]
        answers[pid] = {key: float(metrics[key]) for key in (NUM_EXAMPLES, *keys)}
        round_log.note(pid, eval_examples=int(metrics[NUM_EXAMPLES]), eval_accuracy=answers[pid][EVAL_ACCURACY],
                       eval_loss=answers[pid][EVAL_LOSS], personal_accuracy=answers[pid].get(PERSONAL_ACCURACY),
                       personal_loss=answers[pid].get(PERSONAL_LOSS))
    for pid in sorted(problems):
        log.warning("round %s: federated evaluation of client %s failed: %s", server_round, pid, problems[pid])
        round_log.note(pid, eval_failure=problems[pid])
    failed = sorted(problems)
    limit = cfg.resolved_max_failed_fraction
    if not answers or len(failed) > limit * len(request.pids) + 1e-9:
        first = problems[failed[0]] if failed else "no client to evaluate"
        raise RoundFailure(server_round, failed, len(request.pids), f"federated evaluation: {first}", limit)
    columns: dict[str, Any] = {"clients_evaluated": len(answers), "client_eval_failed": len(failed)}
    sizes = [answers[pid][NUM_EXAMPLES] for pid in sorted(answers)]
    columns.update(accuracy_columns("client", sizes, [answers[p][EVAL_ACCURACY] for p in sorted(answers)],
                                    [answers[p][EVAL_LOSS] for p in sorted(answers)]))
    if cfg.finetune_steps > 0:
        columns.update(accuracy_columns("personal", sizes, [answers[p][PERSONAL_ACCURACY] for p in sorted(answers)],
                                        [answers[p][PERSONAL_LOSS] for p in sorted(answers)]))
    return columns


def accuracy_columns(prefix: str, sizes: list[float], accuracies: list[float], losses: list[float]) -> dict[str, Any]:
    """The round's columns of the clients' accuracies (see module), in partition-id order: weighted
    by test samples, client mean, sample std (ddof = 1; None for one client), the worst decile's mean,
    and the weighted loss."""
    total = sum(sizes)
    m = len(accuracies)
    worst = sorted(accuracies)[: max(1, math.ceil(m / 10))]
    values = (sum(n * a for n, a in zip(sizes, accuracies)) / total, sum(accuracies) / m,
              float(np.std(accuracies, ddof=1)) if m > 1 else None, sum(worst) / len(worst),
              sum(n * v for n, v in zip(sizes, losses)) / total)
    return {f"{prefix}_{stat}": value for stat, value in zip(STATISTICS, values)}
