"""fedsuite's Flower ServerApp (Message API). The same app runs in simulation and deployment.

It is the round engine (``fedsuite.engine.round_engine.execute``: config, data, rounds, checkpoints, records)
with Flower's grid as its transport (``fedsuite.engine.transport.FlowerTransport``). Before the rounds it
sends the handshake (``fedsuite.engine.nodes.Handshake``: one QUERY to every node, which maps Flower node
ids to partition ids; the engine's ``fedsuite.engine.nodes.NodeMap`` re-maps before every round, so a
SuperNode that reconnects under a new node id gets work again); the engine loads the data while
the clients start and answer.

:func:`method_strategy` is for a Flower user's own ServerApp: the fedsuite method its run config
names, as a Flower ``Strategy`` to ``start`` in their own loop (``fedsuite.engine.flower_strategy``;
with fedsuite's ClientApp, ``fedsuite.client_app:app``, as the app's ClientApp).
"""

from __future__ import annotations

import sys
from pathlib import Path

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from fedsuite.engine import round_engine as engine
from fedsuite.launch import reaper
from fedsuite.engine import runtime
from fedsuite.engine.flower_loop import LoopRecords
from fedsuite.engine.flower_strategy import MethodStrategy
from fedsuite.engine.nodes import Handshake
from fedsuite.engine.transport import FlowerTransport
from fedsuite.upstream import InMemoryGrid
from fedsuite.method.wire import to_record

app = ServerApp()

#: seconds between the ServerApp's checks for replies in simulation. Flower's InMemoryGrid sleeps
#: 0.1 s between checks, so every send_and_receive idles 50 ms on average after its last reply (a
#: sixth of a 0.3 s round); a check reads in-memory state and costs microseconds.
SIMULATION_PULL_INTERVAL_S = 0.01


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The run the app's config names, or each run of a batch in turn (``runtime.BATCH_KEY``,
    ``fedsuite.launch.start.simulate_batch``): a batch's run that fails is recorded as failed (its
    ``summary.json`` and ``error.txt``) and the next one starts; once all have run, the app raises
    naming the failed ones. A stop (``engine.stop_requested``) ends the batch where it is."""
    tune_grid(grid)
    watch_flower_simulation()
    batch = runtime.BATCH_KEY in context.run_config
    failed = []
    for index, flat in enumerate(runtime.app_runs(context.run_config)):
        cfg, run_dir = runtime.split_run_config(flat)
        transport = FlowerTransport(grid, group_id=str(index) if batch else None)
        try:
            engine.execute(cfg, run_dir, transport, connect=lambda: Handshake(grid, cfg.num_clients).partition_ids)
        except Exception:
            if not batch or engine.stop_requested.is_set():
                raise
            failed.append(str(run_dir))
    if failed:
        raise RuntimeError(f"{len(failed)} run(s) of the batch failed (see each one's error.txt): {', '.join(failed)}")


def method_strategy(grid: Grid, context: Context) -> tuple[MethodStrategy, ArrayRecord]:
    """The method that ``context.run_config`` names (fedsuite's config keys, as in
    ``[tool.flwr.app.config]``), built for ``grid``'s nodes, as a Flower ``Strategy``
    (``fedsuite.engine.flower_strategy.MethodStrategy``; the method's server half is its ``method``),
    and w^0: for a ServerApp of one's own, e.g. ``strategy.start(grid=grid, initial_arrays=w0)``
    (``MethodStrategy.start``: Flower's loop, with fedsuite's central evaluation as its
    ``evaluate_fn``, ``central_evaluation``). The nodes
    must run fedsuite's ClientApp with the same run config; it waits until ``num_clients`` nodes
    have said which partition they hold, and says so in one line when there are fewer
    (``fedsuite.engine.nodes.Handshake``: a simulation with fewer SuperNodes fails at once).

    Two app keys that are not config fields: ``records`` (``runtime.RECORDS_KEY``) true writes
    fedsuite's run records (``fedsuite.engine.flower_loop``) into ``run_dir`` (``runtime.RUN_DIR_KEY``),
    else into ``output_dir``/``run_name`` (a folder that holds a run already is refused before
    the handshake). In Flower's own ``flwr-simulation`` process the run's processes are watched
    (:func:`watch_flower_simulation`)."""
    cfg, run_dir = runtime.split_run_config(dict(context.run_config))
    records = runtime.records_asked(context.run_config)
    if records:
        LoopRecords.check_folder(run_dir)
    tune_grid(grid)
    watch_flower_simulation()
    handshake = Handshake(grid, cfg.num_clients)
    method, initial, _ = engine.build_strategy(cfg, run_dir, handshake.partition_ids)
    strategy = MethodStrategy(method)
    if records:
        strategy.loop_records = LoopRecords(strategy, run_dir)
    return strategy, to_record(initial)


#: the watcher of this process's descendants, once started (:func:`watch_flower_simulation`)
_WATCHER: list = []


def watch_flower_simulation() -> None:
    """In Flower's own simulation process (``flwr-simulation``, under ``flwr run`` on a simulation
    federation), once per process: a watcher that stops what this process started (its Ray's daemons,
    agents and ClientApp actors) once it is gone (``fedsuite.launch.reaper.watch_descendants``). ``flwr
    stop`` ends that process at its next heartbeat to the SuperLink, without Ray's orderly shutdown.
    fedsuite's own simulation process (``fedsuite simulate``) has its own watcher."""
    if Path(sys.argv[0]).name == "flwr-simulation" and not _WATCHER:
        _WATCHER.append(reaper.watch_descendants())


def tune_grid(grid: Grid) -> None:
    """In simulation (an ``InMemoryGrid``), check for replies every ``SIMULATION_PULL_INTERVAL_S``.
    A deployment's grid (Flower's ``HttpGrid``) keeps its own pace."""
    if isinstance(grid, InMemoryGrid):
        grid.pull_interval = SIMULATION_PULL_INTERVAL_S
