"""Every registered method runs end to end: a real Flower simulation (Flower's Simulation Engine,
Ray clients) of at least 2 rounds with its default knobs, for each name in ``fedsuite.registry.methods()``,
so a new method is covered the moment it registers (with ``E2E``, minimal settings). Each run must
complete (the ``simulate`` fixture also fails a run with any failed or dropped client reply) and write
one metrics.jsonl line per round plus round 0, with a finite test accuracy in every line, and a
checkpoint of the last round. The same run through the in-process engine (``engine="inprocess"``:
the ClientApp's handlers called in the test process, no Ray) must give the same ``metrics.jsonl``
(wall time aside), checkpoint (global model and server state) and per-client state, bit for bit:
the round engine is the same whatever carries its messages (``fedsuite.transport``). FedInit and
FedNLR carry the two plug-ins (relaxed initialisation, neuron-wise learning rates).

A method whose own test file already runs it with its default knobs for >= 2 rounds shares that
run: the same overrides (imported from that file where it defines them) in that file's xdist group,
whose worker's session cache then holds one run for both tests (``SHARED``; the method files run
on the in-process engine, tests/test_resume.py on Flower's). Sharing is an optimisation only: if a
file changes its config, the run here still happens, on its own."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from conftest import FAST, assert_same_arrays, assert_same_client_state, assert_same_state
from test_baselines_a import IID as BASELINES_A_IID
from test_baselines_b import SIM as BASELINES_B_SIM
from test_fedinit import RI3 as FEDINIT_RI3
from test_resume import FULL_DATA as RESUME_DATA

from fedsuite.registry import methods

E2E = {"num_clients": 6, "clients_per_round": 3, "rounds": 2}

#: method -> (overrides, xdist group of the test that runs the same simulation)
SHARED: dict[str, tuple[dict[str, Any], str]] = {
    "fedavg": (BASELINES_B_SIM, "test_baselines_b"),  # the FedAvg reference of every SIM test there
    "ccvr": (BASELINES_B_SIM, "test_baselines_b"),  # test_ccvr_trains_as_fedavg_and_evaluates_calibrated_head
    "clusamp": (BASELINES_B_SIM, "test_baselines_b"),  # test_clusamp_singleton_clusters_is_fedavg
    "fednova": (BASELINES_A_IID, "test_baselines_a"),  # test_fednova_with_equal_step_counts_is_fedavg_end_to_end
    "fedinit": (FEDINIT_RI3, "test_fedinit"),  # test_storage_modes_identical_and_fedinit_is_fedavg_plus_ri
    "fednlr": ({}, "test_fedinit"),  # test_fednlr.py's simulation tests run in test_fedinit's group
    "fedmr": ({}, "test_fedmr"),  # test_sim_fedmr_clients_train_the_model_built_for_them
    "fedmut": ({}, "test_fedmr"),  # test_sim_fedmut_clients_train_the_model_built_for_them
    "fedcm": ({}, "test_fedmr"),  # test_fedmrur.py's test_sim_mofedsam_rho0_equals_fedcm (in test_fedmr's group)
    "fedmrur": ({}, "test_fedmr"),  # test_fedmrur.py's test_sim_fedmrur_runs_and_logs (in test_fedmr's group)
    # tests/test_resume.py's uninterrupted reference runs (ROUNDS = 6, METHODS there); read-only here
    "scaffold": ({"rounds": 6, **RESUME_DATA}, "test_resume"),
    "feddyn": ({"rounds": 6, **RESUME_DATA}, "test_resume"),
}


def _case(name: str):
    if name in SHARED:
        overrides, group = SHARED[name]
        return pytest.param(name, dict(overrides), id=name, marks=pytest.mark.xdist_group(group))
    return pytest.param(name, dict(E2E), id=name)


def test_shared_runs_are_registered_methods_with_default_knobs():
    """A shared run must still be this test's run: a registered method, its own knobs untouched (a
    knob at its degenerate value, e.g. fedprox.mu = 0, would not run the method's own code path),
    at least 2 rounds (so state carried between rounds is exercised)."""
    assert set(SHARED) <= set(methods())
    for name, (overrides, group) in SHARED.items():
        assert "strategy" not in overrides and not any(k.startswith(f"{name}.") for k in overrides), name
        assert overrides.get("rounds", FAST["rounds"]) >= 2, name
        assert group.startswith("test_"), name


@pytest.mark.parametrize("name, overrides", [_case(n) for n in sorted(methods())])
def test_method_runs_end_to_end(simulate, name, overrides):
    run = simulate(strategy=name, **overrides)
    rounds = overrides.get("rounds", FAST["rounds"])
    assert rounds >= 2
    lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["round"] for r in rows] == list(range(rounds + 1))
    for r in rows:
        acc = r["test_accuracy"]
        assert acc is not None and math.isfinite(acc) and 0.0 <= acc <= 1.0, r
    assert run.summary.get("status", "completed") == "completed"
    assert run.checkpoint["round"] == rounds
    here = simulate(strategy=name, engine="inprocess", **overrides)
    assert here.metrics_without_time() == run.metrics_without_time()
    assert_same_arrays(here.arrays, run.arrays)
    assert_same_state(here.checkpoint["strategy"], run.checkpoint["strategy"])
    assert_same_client_state(here.run_dir, run.run_dir)
