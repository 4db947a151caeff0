"""Issue 31 item 3: every run writes TensorBoard event files beside its metrics.jsonl.

* A real simulation (FedMR with its pool diagnostics, failed replies injected and tolerated) is read
  back with TensorBoard's own reader: every number of every ``metrics.jsonl`` row is a scalar with
  the same step (the round) and value (TensorBoard stores float32), and the config is there as
  hparams.
* A real ``tensorboard`` server started on 127.0.0.1 serves those scalars over its HTTP API
  (stopped by PID).
* A resumed run's earlier attempt is purged from the step it continues from, so each step shows
  the values of the round that counted.
* ``tensorboard=false`` writes none; ``tensorboard=true`` without the package is a config error.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("tensorboard", reason="the tracking tests read event files with TensorBoard's reader")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from fedsuite.deploy import superlink# noqa: E402
from fedsuite.records.recording import RunRecorder, scalars  # noqa: E402
from fedsuite.records.rows import read_metrics  # noqa: E402

#: the records a run writes, not how messages travel: the in-process engine (``simulate``, tests/conftest.py)
pytestmark = pytest.mark.inprocess

TRACKED = {"strategy": "fedmr", "fedmr.diagnostics": True, "rounds": 3, "faults.client_error": 0.25,
           "max_failed_fraction": 0.75}


def board(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def test_every_metric_of_metrics_jsonl_is_a_tensorboard_scalar(simulate):
    run = simulate(**TRACKED)
    rows = read_metrics(run.run_dir)
    expected: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for key, value in scalars(row).items():
            expected.setdefault(key, []).append((row["round"], value))
    # the row's kinds of numbers are all there: test and train metrics, bytes, failures, the pool's
    assert {"test_accuracy", "test_loss", "train_loss", "bytes_sent", "failed", "wall_seconds"} <= set(expected)
    assert any(k.startswith("pool") or "dist" in k for k in expected), sorted(expected)
    assert any(v > 0 for _, v in expected["failed"]), "the injected failures should show"
    acc = board(run.run_dir)
    assert sorted(acc.Tags()["scalars"]) == sorted(expected)
    for key, points in expected.items():
        got = [(e.step, e.value) for e in acc.Scalars(key)]
        assert [s for s, _ in got] == [s for s, _ in points], key
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-30), key
    # the config as hparams: the HParams tab lists the run's settings
    content = acc.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in content
    assert b"fedmr" in content["_hparams_/session_start_info"] and b"diagnostics" in content["_hparams_/session_start_info"]


def test_a_tensorboard_server_serves_the_runs_scalars(simulate, tmp_path):
    run = simulate(**TRACKED)
    port = superlink.free_port()
    log = (tmp_path / "tensorboard.log").open("wb")
    server = subprocess.Popen([str(Path(sys.executable).parent / "tensorboard"), "--logdir", str(run.run_dir.parent),
                               "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "1"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        url = (f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?tag=test_accuracy"
               f"&run={urllib.request.quote(run.run_dir.name)}")
        deadline = time.monotonic() + 120  # a guard against a hang: TensorBoard loads the logdir in the background
        while True:
            assert server.poll() is None, (tmp_path / "tensorboard.log").read_text()
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    served = json.loads(resp.read())
                if len(served) == len([r for r in read_metrics(run.run_dir) if r.get("test_accuracy") is not None]):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "tensorboard.log").read_text()
            time.sleep(0.5)
        want = [(r["round"], r["test_accuracy"]) for r in read_metrics(run.run_dir) if r.get("test_accuracy") is not None]
        assert [step for _, step, _ in served] == [s for s, _ in want]
        assert [value for _, _, value in served] == pytest.approx([v for _, v in want], rel=1e-6)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    assert server.returncode is not None


def test_a_resume_purges_what_the_interrupted_attempt_logged_after_its_checkpoint(tmp_path):
    """An attempt logged rounds 0-4 but checkpointed round 2 only; the resume logs 2-4 again with
    other values: TensorBoard shows each step once, with the resumed values from round 2 on."""
    first = RunRecorder(tmp_path, {"strategy": "fedavg"}, tensorboard=True)
    for rnd in range(5):
        first.append({"round": rnd, "test_accuracy": 0.1 * rnd, "cohort": [1, 2]})
    first.board.close()
    time.sleep(1.1)  # TensorBoard orders event files by the second in their names
    resumed = RunRecorder(tmp_path, {"strategy": "fedavg"}, tensorboard=True)
    resumed.rewind(2, {"round": 2, "test_accuracy": 0.9})
    for rnd in (3, 4):
        resumed.append({"round": rnd, "test_accuracy": 0.5 + rnd / 10})
    resumed.board.close()
    got = [(e.step, round(e.value, 6)) for e in board(tmp_path).Scalars("test_accuracy")]
    assert got == [(0, 0.0), (1, 0.1), (2, 0.9), (3, 0.8), (4, 0.9)]
    assert [r["round"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3, 4]


def test_tensorboard_off_writes_no_event_file(simulate):
    run = simulate(strategy="fedavg", rounds=1, tensorboard=False)
    assert not list(run.run_dir.glob("events.out.tfevents.*"))
    run = simulate(strategy="fedavg", rounds=1)  # the default, with the package installed: on
    assert list(run.run_dir.glob("events.out.tfevents.*"))


def test_tensorboard_on_without_the_package_is_a_config_error(monkeypatch):
    import importlib.util

    from fedsuite.config import ConfigError, build_config

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match="tensorboard=true needs the tensorboard package"):
        build_config(overrides=["tensorboard=true"])
    assert build_config().tensorboard is None  # the default asks for nothing
