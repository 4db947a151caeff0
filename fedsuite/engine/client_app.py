"""fedsuite's Flower ClientApp (Message API). The same app runs in simulation and on real SuperNodes;
its handlers without the Message around them (``train_content``, ``statistics_content``:
:data:`HANDLERS`) are what the in-process engine calls (``fedsuite.engine.transport.InProcessTransport``).

``query``: answers the ServerApp's handshake with this node's partition id.
``train``: rebuilds the model from the received arrays, runs the method's client rule through the
shared loop (``fedsuite.method.training``) and replies with the arrays to aggregate plus metrics.
``query.statistics``: replies with the rule's ``statistics`` of the received model (no training;
CCVR's feature moments), see ``fedsuite.method.wire``.

Node config keys (``flower-supernode --node-config``): ``partition-id`` (required),
``num-partitions``, ``state-dir`` (where per-client arrays are kept; default: the run directory in
simulation, ``~/.cache/fedsuite/client-state`` on a real node), ``data-path`` (an ``.npz`` with this
node's own ``x_train``/``y_train`` instead of a partition of the configured dataset).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsuite.records import identity
from fedsuite.engine import allocator, runtime
from fedsuite.engine.client_eval import evaluate_locally
from fedsuite.data import DatasetError
from fedsuite.engine.faults import FaultDraw
from fedsuite.models import draws_global_rng, make_model, model_with_state
from fedsuite.method.plugins import active_plugins
from fedsuite.launch.raycluster import node_label
from fedsuite.method.seeding import global_seed, seed_for
from fedsuite.method.state import ClientState
from fedsuite.method.training import LocalData, LocalTask, run_local_training
from fedsuite.method.wire import (
    ARRAYS, CHECKSUM_REQUEST, CONFIG, INFO, LR, METRICS, NUM_EXAMPLES, PARTITION_ID, RECEIVED_CHECKSUM,
    SERVER_ROUND, STATISTICS, STATISTICS_QUERY, TRAIN_MESSAGE, TRAIN_SECONDS, message_problem, record_checksum,
    to_record, to_tensors,
)

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    return Message(RecordDict({INFO: MetricRecord({PARTITION_ID: pid})}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return Message(train_content(msg.content, run_context(msg, context)), reply_to=msg)


def run_context(msg: Message, context: Context) -> Context:
    """The context a handler works in: ``context``, or in a batch of runs (``runtime.BATCH_KEY``:
    ``fedsuite.launch.start.simulate_batch``) the same node's context with the run config of the run that
    ``msg`` belongs to (its ``group_id``: the run's index in the batch)."""
    if runtime.BATCH_KEY not in context.run_config:
        return context
    run_config = runtime.app_runs(context.run_config)[int(msg.metadata.group_id)]
    return Context(run_id=context.run_id, node_id=context.node_id, node_config=context.node_config,
                   state=context.state, run_config=run_config)


def train_content(content: RecordDict, context: Context) -> RecordDict:
    """A training message's reply: the arrays to aggregate (and the rule's extra records) plus metrics."""
    cfg, run_dir = runtime.split_run_config(dict(context.run_config))
    pid = int(context.node_config["partition-id"])
    problem = message_problem(content, TRAIN_MESSAGE + cfg.method.records.message, cfg)
    if problem:  # the reply fails with the reason: the rule would otherwise read a fallback
        raise ValueError(f"{cfg.strategy}: {problem}")
    server_round = int(content[CONFIG][SERVER_ROUND])
    faults = FaultDraw.for_task(cfg.faults, cfg.seed, pid, server_round)
    faults.before_training(pid, server_round)
    device, data, model = _received_model(cfg, content, context, pid)
    received = {k: v.detach().clone() for k, v in model.state_dict().items()}
    extras = {
        name: {k: v.to(device) for k, v in to_tensors(rec).items()}
        for name, rec in content.array_records.items()
        if name != ARRAYS
    }
    seed = seed_for(cfg.seed, pid, server_round)
    generator = torch.Generator(device=device).manual_seed(seed)

    state_dir = context.node_config.get("state-dir") or str(run_dir / "client-state")
    task = LocalTask(
        model=model, received=received, extras=extras, config=dict(content[CONFIG]), cfg=cfg,
        data=data, state=ClientState(context, Path(state_dir).expanduser(), pid, server_round, identity.digest(cfg)),
        partition_id=pid,
        server_round=server_round, lr=float(content[CONFIG][LR]), device=device, generator=generator,
    )
    rule = cfg.method.client(plugins=active_plugins(cfg))
    started = time.perf_counter()
    # the global RNG from the same seed (dropout draws from it), one such client at a time
    # when other clients train beside it on this process's threads (fedsuite.method.seeding)
    with global_seed(seed, draws_global_rng(model)):
        result = run_local_training(rule, task)
    seconds = time.perf_counter() - started

    reply = RecordDict({ARRAYS: to_record(faults.corrupt(result.arrays))})
    for name, arrays in result.extras.items():
        reply[name] = to_record(arrays)
    metrics = {**result.metrics, PARTITION_ID: pid, TRAIN_SECONDS: seconds}
    if content[CONFIG].get(CHECKSUM_REQUEST):  # a server that sends per-client models verifies them
        metrics[RECEIVED_CHECKSUM] = record_checksum(content[ARRAYS])
    reply[METRICS] = MetricRecord(metrics)
    return reply


@app.query(STATISTICS_QUERY.split(".")[1])
def statistics(msg: Message, context: Context) -> Message:
    return Message(statistics_content(msg.content, run_context(msg, context)), reply_to=msg)


def statistics_content(content: RecordDict, context: Context) -> RecordDict:
    """A statistics query's reply: the rule's ``statistics`` of the received model on this client's data."""
    cfg, _ = runtime.split_run_config(dict(context.run_config))
    pid = int(context.node_config["partition-id"])
    _, data, model = _received_model(cfg, content, context, pid)
    stats = cfg.method.client().statistics(model, data, cfg)  # no plug-ins: it describes w itself
    metrics = MetricRecord({PARTITION_ID: pid, NUM_EXAMPLES: len(data)})
    return RecordDict({STATISTICS: to_record(stats), METRICS: metrics})


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return Message(evaluate_content(msg.content, run_context(msg, context)), reply_to=msg)


def evaluate_content(content: RecordDict, context: Context) -> RecordDict:
    """An evaluation message's reply (federated evaluation, ``fedsuite.engine.client_eval``): the received
    model's metrics on this client's own test data, and its personalised model's with
    ``finetune_steps``."""
    cfg, _ = runtime.split_run_config(dict(context.run_config))
    pid = int(context.node_config["partition-id"])
    device, data, model = _received_model(cfg, content, context, pid)
    test = local_test_data(cfg, runtime.load_bundle(cfg), pid, context, device)
    metrics = evaluate_locally(model, data, test, cfg, pid, int(content[CONFIG][SERVER_ROUND]),
                               float(content[CONFIG][LR]))
    return RecordDict({METRICS: MetricRecord({PARTITION_ID: pid, NUM_EXAMPLES: len(test), **metrics})})


#: the handlers without Flower's Message around them, by message type: what the in-process
#: transport calls (``fedsuite.engine.transport.InProcessTransport``)
HANDLERS = {MessageType.TRAIN: train_content, MessageType.EVALUATE: evaluate_content,
            STATISTICS_QUERY: statistics_content}


def _received_model(cfg, content: RecordDict, context: Context, pid: int) -> tuple[torch.device, LocalData, torch.nn.Module]:
    """The device, this client's data on it, and the model holding the message's ``arrays``."""
    torch.set_num_threads(cfg.num_cpus)
    allocator.tune()
    device = runtime.device_for(cfg)
    if device.type == "cuda" or cfg.num_cpus > 1:
        # cuDNN/cuBLAS and multi-threaded CPU kernels (an accumulating index_put) have faster
        # nondeterministic paths; a one-thread CPU client runs every kernel serially, and the switch
        # costs 1.3 CPU-seconds a process there (torch imports its compiler, torch._dynamo, to set it)
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        bundle = runtime.load_bundle(cfg)
        data = local_data(cfg, bundle, pid, context, device)
    except DatasetError as exc:  # say which machine lacks the files (a Ray cluster or real node)
        raise DatasetError(f"on {node_label()}: {exc}") from None
    model = model_with_state(lambda: make_model(cfg, bundle), to_tensors(content[ARRAYS]), device)
    return device, data, model


def local_data(cfg, bundle, pid: int, context: Context, device: torch.device) -> LocalData:
    """This client's training data: its partition of the run's dataset, or the node's own
    ``data-path``; under federated evaluation less its held-out share (``runtime.client_split``)."""
    path = context.node_config.get("data-path")
    if path:
        x, y = _node_split(str(path), cfg.federated_eval != "off", cfg.local_test_fraction, cfg.seed, pid)[0]
    else:
        # torch.tensor copies: the cached partition is read-only
        idx = torch.tensor(runtime.client_split(cfg, bundle, pid).train, dtype=torch.int64)
        x, y = bundle.x_train[idx], bundle.y_train[idx]
    augment = bundle.augment if cfg.augment is None else ("crop-flip" if cfg.augment else "none")
    return LocalData(x=x.to(device), y=y.to(device), bundle=bundle, augment=augment)


def local_test_data(cfg, bundle, pid: int, context: Context, device: torch.device) -> LocalData:
    """This client's own test data under federated evaluation (``runtime.client_split``; a node's
    ``data-path`` with ``x_test``/``y_test`` has its own, else its held-out share), never augmented."""
    path = context.node_config.get("data-path")
    if path:
        x, y = _node_split(str(path), True, cfg.local_test_fraction, cfg.seed, pid)[1]
    else:
        split = runtime.client_split(cfg, bundle, pid)
        idx = torch.tensor(split.test, dtype=torch.int64)
        x, y = (bundle.x_test[idx], bundle.y_test[idx]) if split.natural else (bundle.x_train[idx], bundle.y_train[idx])
    return LocalData(x=x.to(device), y=y.to(device), bundle=bundle, augment="none")


Pair = tuple[torch.Tensor, torch.Tensor]


@functools.cache
def _node_split(path: str, held_out: bool, fraction: float, seed: int, pid: int) -> tuple[Pair, Pair | None]:
    """A node's own ``.npz``: (its training data, its test data): all of ``x_train``/``y_train`` and
    no test data without federated evaluation; with it, ``x_test``/``y_test`` when the file has them,
    else ``runtime.holdout`` of the training data."""
    with np.load(Path(path).expanduser()) as f:
        x, y = torch.from_numpy(f["x_train"]), torch.from_numpy(f["y_train"]).long()
        own = (torch.from_numpy(f["x_test"]), torch.from_numpy(f["y_test"]).long()) if "x_test" in f.files else None
    if not held_out:
        return (x, y), None
    if own is not None:
        return (x, y), own
    train, test = (torch.from_numpy(i) for i in runtime.holdout(np.arange(len(y)), fraction, seed, pid))
    return (x[train], y[train]), (x[test], y[test])
