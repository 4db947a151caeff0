"""Every registered method runs end to end: a real Flower simulation (Flower's Simulation Engine,
Ray clients) of at least 2 rounds with its default knobs, for each name in ``fedsuite.method.registry.methods()``,
so a new method is covered the moment it registers. Each run must complete (any failed or dropped
client reply fails it) and write one metrics.jsonl line per round plus round 0, with a finite test
accuracy in every line, and a checkpoint of the last round. The same run through the in-process
engine (``engine="inprocess"``: the ClientApp's handlers called in the test process, no Ray) must
give the same ``metrics.jsonl`` (wall time aside), ``clients.jsonl`` (the clients' clocks aside),
checkpoint (global model and server state) and per-client state, bit for bit: the round engine is the same whatever carries its messages
(``fedsuite.engine.transport``). FedInit and FedNLR carry the two plug-ins (relaxed initialisation,
neuron-wise learning rates).

The Flower runs are one batch (``fedsuite.launch.start.simulate_batch``): one after another in one
simulation, one Ray node and one ClientApp actor for all, each with its own folder and records.
One run's start-up (the simulation process, its Ray, the actor: about 11 CPU-seconds on 2 cores)
would otherwise be paid once per method."""

from __future__ import annotations

import json
import math

import pytest
from conftest import FAST, assert_same_arrays, assert_same_client_state, assert_same_state

from fedsuite.method.registry import methods
from fedsuite.records.rows import read_clients

METHODS = sorted(methods())


@pytest.fixture(scope="module")
def flower_runs(request, simulate_batch):
    """The run on Flower's engine (FAST settings) of every method whose test was selected, by method."""
    selected = {item.name for item in request.session.items}
    chosen = [name for name in METHODS if f"test_method_runs_end_to_end[{name}]" in selected]
    return dict(zip(chosen, simulate_batch([{"strategy": name} for name in chosen])))


@pytest.mark.parametrize("name", METHODS)
def test_method_runs_end_to_end(flower_runs, simulate, name):
    run = flower_runs[name]
    rounds = FAST["rounds"]
    assert rounds >= 2  # state carried between rounds is exercised
    lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["round"] for r in rows] == list(range(rounds + 1))
    for r in rows:
        acc = r["test_accuracy"]
        assert acc is not None and math.isfinite(acc) and 0.0 <= acc <= 1.0, r
    assert run.summary.get("status", "completed") == "completed"
    assert json.loads((run.run_dir / "config.json").read_text())["strategy"] == name
    assert run.checkpoint["round"] == rounds
    here = simulate(strategy=name, engine="inprocess")
    assert here.metrics_without_time() == run.metrics_without_time()
    assert_same_arrays(here.arrays, run.arrays)
    assert_same_state(here.checkpoint["strategy"], run.checkpoint["strategy"])
    assert_same_client_state(here.run_dir, run.run_dir)
    # each client's record of each round (clients.jsonl), its own clock aside
    mine, theirs = read_clients(here.run_dir), read_clients(run.run_dir)
    assert [(c["round"], c["partition_id"]) for c in mine if c["sampled"]] == \
        [(r["round"], pid) for r in rows[1:] for pid in sorted(r["cohort"])]  # one row per sampled client
    assert [{k: v for k, v in r.items() if k != "train_seconds"} for r in mine] == \
        [{k: v for k, v in r.items() if k != "train_seconds"} for r in theirs]
