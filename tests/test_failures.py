"""Loud failures and fault injection (issue 10): a run in which clients fail says so.

The faults are injected inside the real ClientApp (``[faults]``), seeded from (seed, partition,
round), so each test predicts exactly which client fails in which round and why, and checks that
the run's status, exit code, metrics and summary say the same."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsuite.config import FaultsConfig, build_config
from fedsuite.engine.faults import FaultDraw, InjectedFault
from fedsuite.method.strategy import FedSuiteStrategy, ServerSetup
from tests.conftest import FAST, assert_same_arrays, assert_same_client_state, assert_same_state, fedsuite_run

MIXED = {"client_error": 0.2, "nan": 0.1, "wrong_shape": 0.1}


def predicted_failures(seed: int, rounds: int, faults: dict) -> dict[int, dict[int, str]]:
    """{round: {partition id: expected reason fragment}} from the same draws the ClientApp makes,
    and the same cohorts the server samples."""
    cfg = build_config(values={**FAST, "seed": seed})
    strategy = FedSuiteStrategy(ServerSetup(cfg=cfg, node_to_pid={p: p for p in range(cfg.num_clients)}, initial={}))
    out: dict[int, dict[int, str]] = {}
    for r in range(1, rounds + 1):
        out[r] = {}
        for pid in strategy.sample_cohort(r):
            d = FaultDraw.for_task(FaultsConfig(**faults), seed, pid, r)
            # the ClientApp raises before training; the server checks shapes before finiteness
            reason = "injected fault" if d.raise_error else "has shape" if d.wrong_shape else "non-finite" if d.nan else None
            if reason:
                out[r][pid] = reason
    return out


# ------------------------------------------------------------------------------------------------
# the fault draws themselves
# ------------------------------------------------------------------------------------------------


def test_fault_draws_are_seeded_per_client_and_round():
    f = FaultsConfig(client_error=0.5, nan=0.5, wrong_shape=0.5, delay_s=1.0, delay_prob=0.5)
    draws = [FaultDraw.for_task(f, 3, pid, r) for pid in range(20) for r in range(1, 6)]
    assert draws == [FaultDraw.for_task(f, 3, pid, r) for pid in range(20) for r in range(1, 6)]
    assert draws != [FaultDraw.for_task(f, 4, pid, r) for pid in range(20) for r in range(1, 6)]
    for field in ("raise_error", "nan", "wrong_shape"):
        share = np.mean([getattr(d, field) for d in draws])
        assert 0.3 < share < 0.7, field  # about the asked probability, neither never nor always
    assert {d.delay_s for d in draws} == {0.0, 1.0}
    assert FaultDraw.for_task(FaultsConfig(), 3, 0, 1) == FaultDraw()
    everything = FaultDraw.for_task(FaultsConfig(client_error=1, nan=1, wrong_shape=1, delay_s=2.0), 3, 0, 1)
    assert everything == FaultDraw(raise_error=True, nan=True, wrong_shape=True, delay_s=2.0)


def test_fault_actions_raise_sleep_and_corrupt(monkeypatch):
    slept = []
    monkeypatch.setattr("fedsuite.engine.faults.time.sleep", slept.append)
    with pytest.raises(InjectedFault, match="client 4, round 2"):
        FaultDraw(raise_error=True, delay_s=0.5).before_training(4, 2)
    assert slept == [0.5]
    arrays = {"w": torch.ones(2, 3), "b": torch.ones(3), "n": torch.tensor(5)}
    nan = FaultDraw(nan=True).corrupt(arrays)
    assert torch.isnan(nan["w"]).all() and torch.equal(nan["b"], arrays["b"])
    bad = FaultDraw(wrong_shape=True).corrupt(arrays)
    assert bad["w"].shape == (3, 3) and torch.equal(arrays["w"], torch.ones(2, 3))  # inputs untouched


# ------------------------------------------------------------------------------------------------
# real simulations
# ------------------------------------------------------------------------------------------------


def test_all_clients_failing_exits_nonzero_with_one_line(tmp_path, data_root):
    """`fedsuite simulate --set faults.client_error=1.0` exits non-zero and names the failure in one
    line; the run directory records status failed, the round, the clients and the first error."""
    proc = fedsuite_run(
        ["simulate", "--strategy", "fedavg", "--rounds", "2", "--num-clients", "6", "--clients-per-round", "3",
         "--output-dir", str(tmp_path), "--run-name", "r", "--set", f"data_root={data_root}",
         "--set", "faults.client_error=1.0"], timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "round 1: 3 of 3 client replies failed" in errors[0] and "injected fault" in errors[0]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failure"]["round"] == 1
    assert len(summary["failure"]["partition_ids"]) == 3 and summary["failed_replies"] == 3
    assert not (tmp_path / "r" / "checkpoint.pt").exists()  # no round was good
    assert (tmp_path / "r" / "ray-logs" / "raylet.out").is_file()  # the failed run keeps its Ray logs


#: the two Flower runs of this file's bound tests, one batch (``launch.simulate_batch``): the run past
#: the bound fails first, and the next one must run as if alone
PAST_BOUND = {"strategy": "fedavg", "seed": 1, "rounds": 3, **{f"faults.{k}": v for k, v in MIXED.items()}}
BELOW_BOUND = {"strategy": "fedavg", "seed": 23, "rounds": 3, "max_failed_fraction": 0.5,
               **{f"faults.{k}": v for k, v in MIXED.items()}}


@pytest.fixture(scope="module")
def bound_runs(simulate_batch):
    return simulate_batch([{**PAST_BOUND, "expect_failure": True}, BELOW_BOUND])


def test_failure_past_the_bound_stops_the_run_and_keeps_the_last_good_round(bound_runs):
    """Default bound in simulation: 0. Seed 1's first failing round is 2: the run stops there as
    failed, names round 2's failing clients, and the checkpoint and metrics end at round 1."""
    expected = predicted_failures(1, 3, MIXED)
    assert not expected[1] and expected[2], "the seed no longer fits the test"
    res = bound_runs[0]
    failure = res.summary["failure"]
    assert res.summary["status"] == "failed" and failure["round"] == 2
    assert failure["partition_ids"] == sorted(expected[2]) and failure["max_failed_fraction"] == 0
    assert expected[2][failure["partition_ids"][0]] in failure["first_error"]
    assert res.checkpoint["round"] == 1 and [r["round"] for r in res.rows] == [0, 1]


def test_failures_below_the_bound_are_counted_and_never_averaged(bound_runs):
    """20% raising clients plus NaN and wrong-shape replies, bound 0.5: the run completes; every
    round lists exactly the predicted failed clients with the right reason, the summary totals them,
    and the global model is finite."""
    rounds, seed = 3, 23
    expected = predicted_failures(seed, rounds, MIXED)
    kinds = {reason for per_round in expected.values() for reason in per_round.values()}
    assert kinds == {"injected fault", "has shape", "non-finite"}, "the seed no longer fits the test"
    res = bound_runs[1]
    for row in res.rows[1:]:
        want = expected[row["round"]]
        assert sorted(row["dropped"]) == sorted(want) and row["failed"] == len(want)
        for pid, fragment in want.items():
            assert fragment in row["failure_reasons"][str(pid)]
        assert math.isfinite(row["train_loss"])
    total = sum(len(v) for v in expected.values())
    assert res.summary["status"] == "completed" and res.summary["failed_replies"] == total
    assert res.summary["rounds_with_failures"] == sum(1 for v in expected.values() if v)
    assert all(np.isfinite(a).all() for a in res.arrays.values() if np.issubdtype(a.dtype, np.floating))


def test_a_batch_records_its_failed_run_and_runs_the_next_as_if_alone(bound_runs, simulate):
    """In a batch (one Flower simulation, one ClientApp actor), the run that failed has its own
    failed record; the run after it gives the numbers, model, server and client state of the same
    run made alone (the in-process engine, which gives Flower's numbers bit for bit), and its log
    names the batch's."""
    failed, after = bound_runs
    assert (failed.run_dir / "error.txt").is_file() and failed.summary["status"] == "failed"
    assert after.summary["status"] == "completed" and not (after.run_dir / "error.txt").exists()
    alone = simulate(**BELOW_BOUND, engine="inprocess")
    assert alone.metrics_without_time() == after.metrics_without_time()
    assert_same_arrays(alone.arrays, after.arrays)
    assert_same_state(alone.checkpoint["strategy"], after.checkpoint["strategy"])
    assert_same_client_state(alone.run_dir, after.run_dir)
    assert (f"this start ran in a batch of 2 runs, whose Flower log is {failed.run_dir / 'flower.log'}"
            in (after.run_dir / "flower.log").read_text())


def test_a_batch_of_runs_that_need_different_simulations_is_refused_before_anything_is_written(tmp_path, data_root):
    from fedsuite.launch.start import simulate_batch
    from fedsuite.launch.watch import LaunchError

    one, other = (build_config(values={**FAST, "data_root": str(data_root), **values})
                  for values in ({}, {"num_clients": 6, "clients_per_round": 3}))
    with pytest.raises(LaunchError, match=f"{tmp_path / 'b'} differs from {tmp_path / 'a'} in num_clients"):
        simulate_batch([(one, tmp_path / "a"), (other, tmp_path / "b")])
    with pytest.raises(LaunchError, match="a batch runs on Flower's engine"):
        simulate_batch([(build_config(values={**FAST, "engine": "inprocess"}), tmp_path / "a")])
    assert list(tmp_path.iterdir()) == []


def test_a_simulation_process_that_dies_before_the_serverapp_records_anything_fails_the_run(tmp_path, monkeypatch):
    """The run's outcome does not depend on the ServerApp getting to write ``summary.json``: a
    simulation process that ends early (here its app's config is made invalid after the launcher
    wrote it, so the process raises once Ray has started, before the ServerApp runs) is a failed
    run naming the exit code."""
    from fedsuite.launch import start as launch

    cfg = build_config(values={**FAST, "data_root": str(tmp_path / "data")})
    run_dir = (tmp_path / "run").resolve()
    write_app = launch.write_app

    def write_broken_app(app_dir, cfg, run_dir):
        write_app(app_dir, cfg, run_dir)
        toml = app_dir / "pyproject.toml"
        toml.write_text(toml.read_text().replace('strategy = "fedavg"', 'strategy = "no-such-method"'))

    monkeypatch.setattr(launch, "write_app", write_broken_app)
    outcome = launch.simulate(cfg, run_dir)
    assert not outcome.ok and outcome.status == "finished:failed"
    assert "exited with code 1 before the ServerApp recorded an outcome" in outcome.details
    assert "no-such-method" in (run_dir / "flower.log").read_text()  # the reason, in the run's log
    assert not (run_dir / "summary.json").exists()


def test_a_data_check_that_fails_while_ray_starts_leaves_nothing_behind(tmp_path):
    """``launch.simulate``'s ``before_start`` (the CLI's data check) runs while the simulation
    process starts its private Ray, and the run waits for it: here the check sees Ray's raylet
    running and the ServerApp not yet begun, then fails. The failure reaches the caller, and every
    process of the run, the folders the call created and Ray's temporary directory are gone."""
    import contextlib
    import time

    import psutil

    from fedsuite.launch import start as launch
    from fedsuite.launch import processes

    cfg = build_config(values={**FAST, "data_root": str(tmp_path / "data")})
    run_dir = (tmp_path / "runs" / "r").resolve()
    marker = str(run_dir / ".flwr")
    seen: dict[str, object] = {}

    def marked(name: str) -> list[psutil.Process]:  # the run's processes whose command names ``name``
        found = []
        for p in processes.marked("FLWR_HOME", marker):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                if name in " ".join(p.cmdline()):
                    found.append(p)
        return found

    def failing_check() -> None:
        deadline = time.monotonic() + 120
        while not marked("raylet") and time.monotonic() < deadline:
            time.sleep(0.2)
        raylets = marked("raylet")
        seen["ray_tmpdir"] = raylets[0].environ().get("RAY_TMPDIR") if raylets else None
        # the ServerApp's first record (config.json is the launcher's: the folder is made with it)
        seen["serverapp_began"] = (run_dir / "metrics.jsonl").exists()
        raise ValueError("the data is not there")

    with pytest.raises(ValueError, match="the data is not there"):
        launch.simulate(cfg, run_dir, before_start=failing_check)
    assert seen["ray_tmpdir"], "Ray did not start while the data was being checked"
    assert seen["serverapp_began"] is False
    assert not (tmp_path / "runs").exists()
    assert not marked(""), "processes of the called-off run are still alive"
    assert not Path(str(seen["ray_tmpdir"])).exists()


def test_a_simulation_process_never_told_to_start_runs_nothing(tmp_path):
    """A simulation process started before its run is named (``launch.start_simulation_process``):
    once named, it moves its output to the run's log and starts Ray; with no ``start`` line (stdin
    at its end: the launcher called the run off) it ends with code 3, the ServerApp never begun.
    One that is never named at all ends at once, also with code 3."""
    import json
    import shutil
    import tempfile

    from fedsuite.launch import start as launch
    from fedsuite.launch import processes
    from fedsuite.launch import reaper

    cfg = build_config(values={**FAST, "data_root": str(tmp_path / "data")})
    run_dir = (tmp_path / "run").resolve()
    launch.write_app(run_dir / "app", cfg, run_dir)
    ray_tmpdir = Path(tempfile.mkdtemp(prefix="fsray-"))  # short: Ray's socket paths must fit 107 bytes
    try:
        proc = launch.start_simulation_process()
        launch.tell(proc, json.dumps({"app": str(run_dir / "app"), "log": str(run_dir / "flower.log"),
                                      "env": processes.run_env(run_dir / ".flwr", None, ray_tmpdir)}))
        proc.stdin.close()
        code = proc.wait(timeout=240)
        ray_started = (ray_tmpdir / "ray" / "session_latest").exists()
    finally:
        reaper.sweep("FLWR_HOME", str(run_dir / ".flwr"), settle=0.5)
        shutil.rmtree(ray_tmpdir, ignore_errors=True)
    assert code == 3, (run_dir / "flower.log").read_text()
    assert ray_started
    assert sorted(p.name for p in run_dir.iterdir()) == ["app", "flower.log"]  # no config.json, metrics, summary

    with launch.simulation_process() as unnamed:
        unnamed.stdin.close()
        assert unnamed.wait(timeout=120) == 3


def test_the_simulation_process_refuses_a_missing_app_folder(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedsuite.launch.simulation", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "usage: python -m fedsuite.launch.simulation APP_DIR" in proc.stderr
