"""The same ServerApp/ClientApp on Flower's Deployment Engine: a real ``flower-superlink`` and two real
``flower-supernode`` processes on 127.0.0.1, each given its partition through ``--node-config``.
The test trains 2 rounds and stops every process by PID."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psutil

from fedsuite import launch
from fedsuite.config import build_config
from fedsuite.results import read_metrics
from tests.conftest import FAST


def test_two_supernodes_train_two_rounds(tmp_path, data_root):
    cfg = build_config(values={**FAST, "data_root": str(data_root), "num_clients": 2, "clients_per_round": 2,
                               "rounds": 2})
    run_dir = (tmp_path / "run").resolve()
    run_dir.mkdir()
    app_dir = run_dir / "app"
    launch.write_app(app_dir, cfg, run_dir)
    nodes: list[subprocess.Popen] = []
    with launch.private_superlink(run_dir, simulation=False) as (env, connection):
        address = (run_dir / ".flwr" / "config.toml").read_text().split('address = "')[1].split('"')[0]
        for pid in range(2):
            log = (run_dir / f"supernode{pid}.log").open("wb")
            nodes.append(subprocess.Popen(
                [launch.bin_path("flower-supernode"), "--insecure", "--superlink", address,
                 "--host", "127.0.0.1", "--port", str(launch.free_port()),
                 "--node-config", f"partition-id={pid} num-partitions=2 state-dir='{run_dir / f'node{pid}'}'"],
                env={**env, "FLWR_HOME": str(run_dir / f"node{pid}-home")}, stdout=log, stderr=subprocess.STDOUT,
                cwd=run_dir, start_new_session=True,
            ))
        try:
            run_id = launch.submit(app_dir, env, connection, federation_config=None)
            launch.follow(run_id, env, connection, run_dir)
            status, details = launch.final_status(run_id, env, connection, run_dir)
        finally:
            for node in nodes:
                launch.stop_tree(node)
    error = (run_dir / "error.txt").read_text() if (run_dir / "error.txt").exists() else details
    assert status == "finished:completed", error
    rows = read_metrics(run_dir)
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all(sorted(r["cohort"]) == [0, 1] for r in rows[1:])
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    # every process we started is gone
    for node in nodes:
        assert not psutil.pid_exists(node.pid) or psutil.Process(node.pid).status() == psutil.STATUS_ZOMBIE
