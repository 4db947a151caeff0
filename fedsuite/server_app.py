"""fedsuite's Flower ServerApp (Message API). The same app runs in simulation and deployment.

1. read the config from the run config; send the handshake (``fedsuite.nodes.Handshake``: one
   QUERY to every node, which maps Flower node ids to partition ids; the strategy's
   ``fedsuite.nodes.NodeMap`` re-maps before every round, so a SuperNode that reconnects under a
   new node id gets work again);
2. while the clients start and answer, load the dataset (test split for central evaluation), build
   w^0 from the seed and the central evaluator; then collect the handshake's replies;
3. build the method's strategy (its ``ServerSetup.evaluate`` is this app's
   central evaluation, ``fedsuite.training.arrays_evaluator``); log the method's warnings for this
   config (``MethodSpec.risks``); resume from ``checkpoint.pt`` if present;
4. ``strategy.start`` runs the rounds; after each round the global model is evaluated centrally
   (``cfg.evaluates``: every ``eval_every`` rounds and at the last); the checkpoint is rewritten with that round's
   metrics row inside it, then the row is appended to ``metrics.jsonl``, so a crash loses at most
   the round in flight, and a resume rewinds ``metrics.jsonl`` to the checkpoint (no round twice);
   per-client state is versioned by round (``fedsuite.state``), so a killed round's state is unused;
5. ``accuracy.png`` (and ``diagnostics.png``), then ``summary.json`` are written at the end, also
   when a round fails (``summary.json`` last: the launcher takes it as the end of the run). A run
   stopped from outside (:data:`stop_requested`: its simulation process got SIGTERM, e.g. because
   the launcher was killed) writes no ``summary.json``: whatever the ServerApp raised then is the
   stop's side effect (a client's actor gone with the engine), not the run's failure, and the run
   stays partial, for ``--resume`` to continue from its last checkpoint.

What produced the run (``fedsuite.provenance``: code, packages, hardware) is collected once per
start, at step 1, and recorded as ``summary.json``'s ``provenance``: a list of the starts whose
rounds the run holds, oldest first, also saved in every checkpoint, so a resume keeps the earlier
starts' entries and adds its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.superlink.grid import InMemoryGrid

from fedsuite import provenance, runtime
from fedsuite.processes import available_cores
from fedsuite.models import initial_arrays, make_model
from fedsuite.nodes import Handshake
from fedsuite.recording import RunRecorder, tensorboard_installed
from fedsuite.results import write_json
from fedsuite.rounds import RoundFailure, ServerSetup
from fedsuite.state import prune_committed
from fedsuite.training import arrays_evaluator
from fedsuite.wire import to_ndarrays, to_record

log = logging.getLogger("fedsuite")
app = ServerApp()

#: seconds between the ServerApp's checks for replies in simulation. Flower's InMemoryGrid sleeps
#: 0.1 s between checks, so every send_and_receive idles 50 ms on average after its last reply (a
#: sixth of a 0.3 s round); a check reads in-memory state and costs microseconds.
SIMULATION_PULL_INTERVAL_S = 0.01

#: set by the simulation process when it is told to stop (SIGTERM: a stop, or the launcher's death
#: through PDEATHSIG), before the engine tears down: ``main`` then records no outcome
stop_requested = threading.Event()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg, run_dir = runtime.split_run_config(dict(context.run_config))
    tune_grid(grid)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "config.json", cfg.active_dump())
    recorder = RunRecorder(run_dir, cfg.active_dump(),
                           tensorboard=tensorboard_installed() if cfg.tensorboard is None else cfg.tensorboard,
                           components=cfg.components)
    torch.set_num_threads(max(1, cfg.num_cpus))
    status, extra = None, {"timing": {"serverapp_start": time.time(), "cores": available_cores()}}
    extra["provenance"] = starts = [this_start(cfg)]
    try:
        run(grid, cfg, run_dir, recorder, extra["timing"], starts)
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


def this_start(cfg) -> dict:
    """What runs this start of the run (``fedsuite.provenance.collect``: the code, packages and
    hardware), collected once; a failure to collect is recorded, never raised."""
    try:
        return provenance.collect(runtime.device_for(cfg))
    except Exception as exc:  # noqa: BLE001 - the run matters more than its record
        log.warning("provenance could not be collected: %s: %s", type(exc).__name__, exc)
        return {"rounds": [], "commit_note": f"provenance could not be collected: {type(exc).__name__}: {exc}"}


def run(grid: Grid, cfg, run_dir: Path, recorder: RunRecorder, timing: dict, starts: list[dict]) -> None:
    """The rounds. ``starts``: the run's provenance (``fedsuite.provenance``), this start's entry
    last; a resume puts the checkpoint's earlier starts before it, and every checkpoint keeps them
    all, this start's ``rounds`` up to date."""
    t0 = time.perf_counter()
    # the queries go out first: the clients start (Ray actors import torch and the ClientApp) while
    # this process loads the data and builds the model
    handshake = Handshake(grid, cfg.num_clients)
    bundle = runtime.load_bundle(cfg)
    device = runtime.device_for(cfg)
    initial = initial_arrays(cfg, bundle)
    evaluate_arrays = arrays_evaluator(make_model(cfg, bundle).to(device), bundle.x_test.to(device),
                                       bundle.y_test.to(device), bundle, cfg.eval_batch_size,
                                       num_threads=evaluation_threads(cfg))
    timing["data_s"] = time.perf_counter() - t0
    node_to_pid = handshake.partition_ids()
    timing["handshake_s"] = time.perf_counter() - t0 - timing["data_s"]  # the wait beyond data_s
    setup = ServerSetup(
        cfg=cfg, node_to_pid=node_to_pid, initial=initial, run_dir=run_dir,
        build_model=lambda: make_model(cfg, bundle), evaluate=evaluate_arrays,
        partition_size=lambda pid: len(runtime.client_indices(cfg, bundle, pid)),
    )
    for risk in cfg.method.risks(cfg):
        log.warning("%s", risk)
    strategy = cfg.method.strategy(setup)

    start_round, arrays = 0, to_record(initial)
    ckpt_path = run_dir / "checkpoint.pt"
    if ckpt_path.is_file():  # resume
        ckpt = torch.load(ckpt_path, weights_only=False)
        start_round, arrays = ckpt["round"], to_record(ckpt["arrays"])
        strategy.load_checkpoint_state(ckpt["strategy"])
        log.warning("resuming %s from round %d", run_dir, start_round)
        starts[:-1] = ckpt.get("provenance") or [provenance.unrecorded(start_round)]
        recorder.rewind(start_round, ckpt.get("metrics_row"))
    else:
        recorder.rewind(0, None)  # killed before round 1 was checkpointed: round 0 is written again

    clock = {"t": time.perf_counter()}
    this = starts[-1]

    def after_round(offset_round: int, global_arrays: ArrayRecord) -> MetricRecord | None:
        server_round = start_round + offset_round
        test = {}
        if (offset_round == 0 and start_round == 0) or (offset_round > 0 and cfg.evaluates(server_round)):
            test = evaluate_arrays(to_ndarrays(strategy.evaluation_arrays(global_arrays)))
        now = time.perf_counter()
        if offset_round == 0:
            if start_round == 0:
                recorder.append({"round": 0, "test_accuracy": test.get("accuracy"), "test_loss": test.get("loss")})
                this["rounds"] = [0, 0]
        else:
            info = strategy.round_log
            row = {
                "round": server_round,
                "test_accuracy": test.get("accuracy"),
                "test_loss": test.get("loss"),
                "train_loss": info.train_loss,
                "wall_seconds": now - clock["t"],
                **info.row(),
            }
            # one atomic step: the checkpoint carries its round's row; the row is appended after it,
            # and a resume rewrites metrics.jsonl to end with the checkpoint's row (RunRecorder.rewind)
            this["rounds"] = [this["rounds"][0] if this["rounds"] else server_round, server_round]
            save_checkpoint(ckpt_path, server_round, global_arrays, strategy, row, starts)
            recorder.append(row)
            # round t is committed: each of its clients needs only its newest state version <= t
            prune_committed(run_dir / "client-state", info.cohort, server_round)
        clock["t"] = time.perf_counter()
        return MetricRecord({k: float(v) for k, v in test.items()}) if test else None

    remaining = cfg.rounds - start_round
    if remaining <= 0:
        return
    strategy.round_offset = start_round
    timing["setup_s"] = time.perf_counter() - t0
    strategy.start(grid=grid, initial_arrays=arrays, num_rounds=remaining, evaluate_fn=after_round,
                   timeout=cfg.round_timeout_s,
                   train_config=ConfigRecord({}))


def evaluation_threads(cfg) -> int:
    """torch threads for central evaluation. A synchronous round's clients are idle while the server
    evaluates, so the server may use the cores they hold. A private Ray holds every core the run may
    use (its affinity: the machine, or its share of a queue's cores), and a deployment's server has
    its own, so this returns those cores (``processes.available_cores``). On a Ray cluster
    that other runs share (``ray_address``) their clients may be busy meanwhile, so this returns the
    run's ``num_cpus``. Oversubscribed OpenMP threads spin at every barrier. Training and the server's
    own training steps (FedGen, CCVR) keep ``num_cpus`` threads: the same arithmetic on any machine."""
    return max(1, cfg.num_cpus) if cfg.ray_address else available_cores()


def save_checkpoint(path: Path, server_round: int, arrays: ArrayRecord, strategy, row: dict | None = None,
                    starts: list[dict] | None = None) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"round": server_round, "arrays": to_ndarrays(arrays), "strategy": strategy.checkpoint_state(),
                "metrics_row": row, "provenance": starts}, tmp)
    os.replace(tmp, path)


def tune_grid(grid: Grid) -> None:
    """In simulation (an ``InMemoryGrid``), check for replies every ``SIMULATION_PULL_INTERVAL_S``.
    A deployment's grid (Flower's ``HttpGrid``) keeps its own pace."""
    if isinstance(grid, InMemoryGrid):
        grid.pull_interval = SIMULATION_PULL_INTERVAL_S
