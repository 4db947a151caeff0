"""The round engine: a run from its config to its records, whatever carries the messages.

:func:`execute` is one run. The transport (``fedsuite.engine.transport``) is the only part that differs
between ``--engine flower`` (the ServerApp, ``fedsuite.engine.server_app``, on Flower's Simulation or
Deployment Engine) and ``--engine inprocess`` (:func:`run_inprocess`: the ClientApp's handlers
called in this process, for tests, benchmarks, a debugger and quick runs). The same config and seed
give the same ``metrics.jsonl`` (wall time aside), checkpoint and client state through both.

1. record ``config.json`` (a folder not made yet is made with it in one step:
   ``hold.create_run_dir``); collect what runs this start (``fedsuite.records.provenance``);
2. ``connect()`` starts learning which node holds which partition (the ServerApp's handshake:
   ``fedsuite.engine.nodes.Handshake``, answered while this process loads the data); meanwhile load the
   dataset (test split for central evaluation), build w^0 from the seed and the central evaluator;
3. build the method's strategy (``ServerSetup.evaluate`` is the central evaluation,
   ``fedsuite.method.training.arrays_evaluator``); log the method's warnings for this config
   (``MethodSpec.risks``); resume from ``checkpoint.pt`` if present (refused if it is another run's:
   ``fedsuite.records.identity``; every checkpoint and ``summary.json`` record the run's identity);
4. the rounds: the node map refreshed (``fedsuite.engine.transport.Link.refresh``), then
   ``strategy.train_round`` (cohort, payloads, replies, server rule) through the run's ``Link``
   (the transport and the node map) once a round, the global round counted here; after each round the global model is evaluated centrally
   (``cfg.evaluates``: every ``eval_every`` rounds and at the last), and with ``federated_eval`` on
   the clients evaluate the same model on their own data (``fedsuite.engine.client_eval``); the checkpoint
   is rewritten with that round's metrics row and its clients' rows inside it, then the rows are
   appended to ``metrics.jsonl`` and ``clients.jsonl``, so a crash loses at most the round in
   flight, and a resume rewinds both files to the checkpoint (no round twice); per-client state is
   versioned by round (``fedsuite.method.state``), so a killed round's state is unused;
5. ``accuracy.png`` (and ``diagnostics.png``), then ``summary.json`` are written at the end, also
   when a round fails (``summary.json`` last: the launcher takes it as the end of the run). A run
   stopped from outside (:data:`stop_requested`: its simulation process got SIGTERM, e.g. because
   the launcher was killed) writes no ``summary.json``: whatever was raised then is the stop's side
   effect (a client's actor gone with the engine), not the run's failure, and the run stays partial,
   for ``--resume`` to continue from its last checkpoint.

What produced the run (``fedsuite.records.provenance``: code, packages, hardware) is recorded as
``summary.json``'s ``provenance``: a list of the starts whose rounds the run holds, oldest first,
also saved in every checkpoint, so a resume keeps the earlier starts' entries and adds its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch

from fedsuite.records import identity
from fedsuite.records import provenance
from fedsuite.records import hold
from fedsuite.engine import allocator, runtime
from fedsuite.engine.client_eval import evaluate_clients
from fedsuite.models import initial_arrays, make_model
from fedsuite.launch.processes import available_cores
from fedsuite.records.recording import RunRecorder, tensorboard_installed
from fedsuite.records.results import write_json
from fedsuite.method.rounds import RoundFailure, RoundLog, ServerSetup
from fedsuite.method.strategy import FedSuiteStrategy
from fedsuite.method.state import prune_committed
from fedsuite.method.training import arrays_evaluator
from fedsuite.engine.nodes import NodeMap
from fedsuite.engine.transport import InProcessTransport, Link, Transport
from fedsuite.method.wire import NDArrays

log = logging.getLogger("fedsuite")

#: set by the simulation process when it is told to stop (SIGTERM: a stop, or the launcher's death
#: through PDEATHSIG), before the engine tears down: :func:`execute` then records no outcome
stop_requested = threading.Event()

#: ``connect()`` starts learning the Flower node id -> partition id map and returns a function that
#: waits for it (the ServerApp's handshake); the in-process transport knows it at once
Connect = Callable[[], Callable[[], dict[int, int]]]


def execute(cfg, run_dir: Path, transport: Transport, connect: Connect,
            on_round: Callable[[], None] | None = None) -> None:
    """One run of ``cfg`` into ``run_dir`` through ``transport`` (see module); raises what failed
    the run after recording it (``summary.json`` status ``failed``, ``error.txt``). ``on_round`` is
    called after each line of ``metrics.jsonl`` (round 0's too)."""
    torch.set_num_threads(max(1, cfg.num_cpus))
    allocator.tune()
    with recorded(cfg, run_dir) as (recorder, extra):
        run_rounds(cfg, run_dir, transport, connect, recorder, extra["timing"], extra["provenance"],
                   on_round or (lambda: None), extra[identity.KEY])


@contextmanager
def recorded(cfg, run_dir: Path) -> Iterator[tuple[RunRecorder, dict]]:
    """A run's record around its rounds, whoever drives them (:func:`execute`, or Flower's own loop:
    ``fedsuite.engine.flower_loop``): ``config.json`` first (the folder made with it in one step:
    ``hold.create_run_dir``), then the :class:`RunRecorder` and the summary's extras (``timing``,
    ``provenance``: this start; the run's identity, ``fedsuite.records.identity``) for the rounds to fill; at
    the end ``summary.json`` with status ``completed``, or ``failed`` (``error.txt``, and a
    :class:`RoundFailure`'s record) when the block raised an ``Exception``, which propagates. A stop
    from outside (:data:`stop_requested`, or SystemExit/KeyboardInterrupt) records no outcome: the
    run stays partial."""
    if not hold.create_run_dir(run_dir, cfg.active_dump()):  # made with its config (a kill leaves no folder without)
        write_json(run_dir / "config.json", cfg.active_dump())
    recorder = RunRecorder(run_dir, cfg.active_dump(),
                           tensorboard=tensorboard_installed() if cfg.tensorboard is None else cfg.tensorboard,
                           components=cfg.components)
    status, extra = None, {"timing": {"serverapp_start": time.time(), "cores": available_cores()}}
    extra["provenance"] = [this_start(cfg)]
    log.info("%s on %s (%s), %d clients, K=%d, %d rounds -> %s", cfg.strategy, cfg.dataset, cfg.partitioner,
             cfg.num_clients, cfg.cohort_size, cfg.rounds, run_dir)
    extra[identity.KEY] = identity.checkpoint_identity(cfg)  # the resumed checkpoint's digests are added to it
    try:
        yield recorder, extra
        status = "completed"
    except BaseException as exc:
        if stop_requested.is_set() or not isinstance(exc, Exception):
            # stopped from outside (or SystemExit/KeyboardInterrupt here): no outcome is recorded,
            # the run stays partial and --resume continues it
            log.warning("run stopped from outside (%s: %s); %s stays partial, --resume continues it",
                        type(exc).__name__, exc, run_dir)
            raise
        status = "failed"
        if isinstance(exc, RoundFailure):  # too many failed client replies: say which, keep the last good checkpoint
            log.error("%s", exc)
            extra["failure"] = exc.record()
        (run_dir / "error.txt").write_text(traceback.format_exc())
        raise
    finally:
        if status is None:
            recorder.close()
        else:
            recorder.finish(status, extra)
            log.info("run %s: %s", status, run_dir)


def round_row(server_round: int, test: dict, info: RoundLog | None = None, wall_seconds: float | None = None) -> dict:
    """Round ``server_round``'s line of ``metrics.jsonl``: its central evaluation ``test``
    (``{"accuracy", "loss"}``, or {} in a round not evaluated) and, for a training round, its
    :class:`RoundLog` and wall time (round 0, w^0, has neither)."""
    row = {"round": server_round, "test_accuracy": test.get("accuracy"), "test_loss": test.get("loss")}
    if info is not None:
        row.update({"train_loss": info.train_loss, "wall_seconds": wall_seconds, **info.row()})
    return row


def run_inprocess(cfg, run_dir: Path, on_round: Callable[[], None] | None = None) -> None:
    """:func:`execute` with the in-process transport: every client of the run is a call into the
    ClientApp's handlers (``fedsuite.engine.client_app.HANDLERS``), in this process, a round's clients on
    :func:`inprocess_threads` threads. It changes this process's torch settings as a client's
    process has them (threads: ``num_cpus``; deterministic algorithms) and leaves them so."""
    from fedsuite.engine import client_app
    from fedsuite.config import to_run_config

    from threadpoolctl import threadpool_limits

    run_config = {**to_run_config(cfg), runtime.RUN_DIR_KEY: str(run_dir)}
    # the dataset and its partition made here, once: the clients' threads only read them (a cache
    # is no lock, and a partitioner's first import parses Python: ``fedsuite.method.wire.ndarray`` says why
    # client threads must not)
    runtime.client_indices(cfg, runtime.load_bundle(cfg), 0)
    transport = InProcessTransport(run_config, cfg.num_clients, client_app.HANDLERS, threads=inprocess_threads(cfg),
                                   cuda=runtime.device_for(cfg).type == "cuda")
    everyone = {pid: pid for pid in range(cfg.num_clients)}  # node id = partition id
    # numpy's BLAS on one thread, as in Flower's processes (processes.process_env): a threaded
    # dot product (a norm of the server's, e.g. FedMRUR's d_t) sums in another order, a last-bit
    # difference that a run then carries on
    with threadpool_limits(limits=1, user_api="blas"):
        execute(cfg, run_dir, transport, lambda: lambda: dict(everyone), on_round)


def inprocess_threads(cfg) -> int:
    """How many clients the in-process engine trains at once: ``cfg.inprocess_threads``, by default
    as many as Flower's engine runs actors here, the cores this process may use
    (``processes.available_cores``) divided by the ``num_cpus`` each client takes (at least one)."""
    return cfg.inprocess_threads or max(1, available_cores() // max(1, cfg.num_cpus))


def this_start(cfg) -> dict:
    """What runs this start of the run (``fedsuite.records.provenance.collect``: the code, packages and
    hardware), collected once; a failure to collect is recorded, never raised."""
    try:
        return provenance.collect(runtime.device_for(cfg))
    except Exception as exc:  # noqa: BLE001 - the run matters more than its record
        log.warning("provenance could not be collected: %s: %s", type(exc).__name__, exc)
        return {"rounds": [], "commit_note": f"provenance could not be collected: {type(exc).__name__}: {exc}"}


def run_rounds(cfg, run_dir: Path, transport: Transport, connect: Connect, recorder: RunRecorder,
               timing: dict, starts: list[dict], on_round: Callable[[], None], ident: dict | None = None) -> None:
    """The rounds. ``starts``: the run's provenance (``fedsuite.records.provenance``), this start's entry
    last; a resume puts the checkpoint's earlier starts before it, and every checkpoint keeps them
    all, this start's ``rounds`` up to date. ``ident``: the run's identity (``fedsuite.records.identity``),
    saved in every checkpoint; a checkpoint of another run is refused (``RuntimeError``), and a
    resume adds the checkpoint's digests to it."""
    ident = identity.checkpoint_identity(cfg) if ident is None else ident
    t0 = time.perf_counter()
    strategy, initial, evaluate_arrays = build_strategy(cfg, run_dir, connect(), timing)
    link = Link(transport, NodeMap(strategy.setup.node_to_pid), cfg.num_clients, cfg.round_timeout_s)
    done, arrays = 0, initial
    ckpt_path = run_dir / "checkpoint.pt"
    this = starts[-1]
    if ckpt_path.is_file():  # resume
        ckpt = torch.load(ckpt_path, weights_only=False)
        problem = identity.problem(ckpt.get(identity.KEY), cfg, str(ckpt_path))
        if problem is not None:  # --resume refuses it first (integrity.check_record): a ServerApp started otherwise
            raise RuntimeError(f"{problem}; the run cannot continue from another run's checkpoint")
        done, arrays = ckpt["round"], ckpt["arrays"]
        ident.update(identity.checkpoint_identity(cfg, ckpt.get(identity.KEY)))
        strategy.load_checkpoint_state(ckpt["strategy"])
        log.warning("resuming %s from round %d", run_dir, done)
        starts[:-1] = ckpt.get("provenance") or [provenance.unrecorded(done)]
        recorder.rewind(done, ckpt.get("metrics_row"), ckpt.get("client_rows"))
    else:
        recorder.rewind(0, None, [])  # killed before round 1 was checkpointed: round 0 is written again
        recorder.append(round_row(0, evaluate_arrays(arrays)))
        this["rounds"] = [0, 0]
        on_round()
    if done >= cfg.rounds:
        return
    timing["setup_s"] = time.perf_counter() - t0
    for server_round in range(done + 1, cfg.rounds + 1):
        started = time.perf_counter()
        log.info("round %d/%d", server_round, cfg.rounds)
        link.refresh()  # a SuperNode that reconnected under a new node id gets work again
        arrays, _ = strategy.train_round(server_round, arrays, link)
        info = strategy.round_log
        test = {}
        if cfg.evaluates(server_round):
            evaluated = strategy.evaluation_arrays(arrays)
            test = evaluate_arrays(evaluated)
            if cfg.federated_eval != "off":  # the same model, on the clients' own data (fedsuite.engine.client_eval)
                info.add(evaluate_clients(strategy, server_round, evaluated, link))
        row = round_row(server_round, test, info, time.perf_counter() - started)
        # one atomic step: the checkpoint carries its round's row; the row is appended after it,
        # and a resume rewrites metrics.jsonl to end with the checkpoint's row (RunRecorder.rewind)
        this["rounds"] = [this["rounds"][0] if this["rounds"] else server_round, server_round]
        clients = info.client_rows()
        save_checkpoint(ckpt_path, server_round, arrays, strategy, row, starts, clients, ident)
        recorder.append(row, clients)
        # round t is committed: each of its clients needs only its newest state version <= t
        prune_committed(run_dir / "client-state", info.cohort, server_round)
        on_round()


def build_strategy(cfg, run_dir: Path | None, partition_map: Callable[[], dict[int, int]],
                   timing: dict | None = None) -> tuple[FedSuiteStrategy, NDArrays, Callable[[NDArrays], dict]]:
    """The method's strategy for ``cfg``, w^0 and the central evaluator: the dataset is loaded (test
    split for central evaluation), w^0 built from the seed, then ``partition_map()`` waited for
    (the handshake's node id -> partition id map, answered meanwhile) and the method's warnings for
    this config logged (``MethodSpec.risks``). ``timing`` (if given) gets ``data_s`` and
    ``handshake_s`` (the wait beyond the data)."""
    t0 = time.perf_counter()
    timing = {} if timing is None else timing
    bundle = runtime.load_bundle(cfg)
    device = runtime.device_for(cfg)
    initial = initial_arrays(cfg, bundle)
    evaluate_arrays = arrays_evaluator(make_model(cfg, bundle).to(device), bundle.x_test.to(device),
                                       bundle.y_test.to(device), bundle, cfg.eval_batch_size,
                                       num_threads=evaluation_threads(cfg))
    timing["data_s"] = time.perf_counter() - t0
    node_to_pid = partition_map()
    timing["handshake_s"] = time.perf_counter() - t0 - timing["data_s"]
    setup = ServerSetup(
        cfg=cfg, node_to_pid=node_to_pid, initial=initial, run_dir=run_dir,
        build_model=lambda: make_model(cfg, bundle), evaluate=evaluate_arrays,
        partition_size=lambda pid: len(runtime.client_split(cfg, bundle, pid).train),
    )
    for risk in cfg.method.risks(cfg):
        log.warning("%s", risk)
    return cfg.method.strategy(setup), initial, evaluate_arrays


def evaluation_threads(cfg) -> int:
    """torch threads for central evaluation. A synchronous round's clients are idle while the server
    evaluates, so the server may use the cores they hold. A private Ray holds every core the run may
    use (its affinity: the machine, or its share of a queue's cores), and a deployment's server has
    its own, so this returns those cores (``processes.available_cores``). On a Ray cluster
    that other runs share (``ray_address``) their clients may be busy meanwhile, so this returns the
    run's ``num_cpus``. Oversubscribed OpenMP threads spin at every barrier. Training and the server's
    own training steps (FedGen, CCVR) keep ``num_cpus`` threads: the same arithmetic on any machine."""
    return max(1, cfg.num_cpus) if cfg.ray_address else available_cores()


def save_checkpoint(path: Path, server_round: int, arrays: NDArrays, strategy, row: dict | None = None,
                    starts: list[dict] | None = None, client_rows: list[dict] | None = None,
                    ident: dict | None = None) -> None:
    """Write the checkpoint of ``server_round`` atomically: the global arrays, the strategy's state,
    the round's ``metrics.jsonl`` row and ``clients.jsonl`` rows (``RunRecorder.rewind`` makes the
    files end with them on a resume), the run's provenance (``starts``) and its identity (``ident``:
    ``fedsuite.records.identity.checkpoint_identity``)."""
    tmp = path.with_suffix(".tmp")
    torch.save({"round": server_round, "arrays": arrays, "strategy": strategy.checkpoint_state(),
                "metrics_row": row, "provenance": starts, "client_rows": client_rows, identity.KEY: ident}, tmp)
    os.replace(tmp, path)
