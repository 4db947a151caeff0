"""The same ServerApp/ClientApp on Flower's Deployment Engine: a real ``flower-superlink`` and two real
``flower-supernode`` processes on 127.0.0.1, each given its partition through ``--node-config``.
One federation trains 6 rounds: they learn (round 1, both nodes, nothing injected yet), a SuperNode
is killed mid-run and restarted, and a client straggles past the round timeout. Every process is
stopped by PID. (The same apps across network namespaces, with TLS and SuperNode authentication:
tests/test_multihost.py.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psutil
import pytest

from fedsuite.launch import processes
from fedsuite.deploy import superlink
from fedsuite.engine.faults import FaultDraw
from fedsuite.records.rows import read_metrics
from tests.conftest import deployment_app


def run_to_completion(app_dir: Path, env: dict[str, str], connection, run_dir: Path, nodes: list[subprocess.Popen],
                      on_progress=None) -> None:
    """Submit the app, follow it to its end, stop every SuperNode in ``nodes`` by PID (also those
    ``on_progress`` appends), and assert the run completed."""
    try:
        run_id = superlink.submit(app_dir, env, connection)
        superlink.follow(run_id, env, connection, run_dir, on_progress=on_progress)
        status, details = superlink.final_status(run_id, env, connection, run_dir)
    finally:
        for node in nodes:
            processes.stop_tree(node)
    error = (run_dir / "error.txt").read_text() if (run_dir / "error.txt").exists() else details
    assert status == "finished:completed", error


def start_supernode(run_dir: Path, env: dict[str, str], address: str, pid: int, num: int) -> subprocess.Popen:
    """A real ``flower-supernode`` holding partition ``pid`` (its log appended to supernode<pid>.log)."""
    with (run_dir / f"supernode{pid}.log").open("ab") as log:
        return subprocess.Popen(
            [processes.bin_path("flower-supernode"), "--insecure", "--superlink", address,
             "--host", "127.0.0.1", "--port", str(superlink.free_port()),
             "--node-config", f"partition-id={pid} num-partitions={num} state-dir='{run_dir / f'node{pid}'}'"],
            env={**env, "FLWR_HOME": str(run_dir / f"node{pid}-home")}, stdout=log, stderr=subprocess.STDOUT,
            cwd=run_dir, start_new_session=True,
        )


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and all its descendants at once, as a crash would (no goodbye to the SuperLink)."""
    root = psutil.Process(proc.pid)
    procs = [root, *root.children(recursive=True)]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)
    proc.wait(timeout=10)


@pytest.mark.long
def test_dead_restarted_and_hung_clients_on_the_deployment_engine(tmp_path, data_root):
    """One federation of 2 SuperNodes, both sampled every round, ``round_timeout_s`` = 90:

    * SuperNode 1 is killed (SIGKILL, whole process tree) as soon as round 1 is written. The work of
      round 2 sent to it comes back as the SuperLink's "node unavailable" error once its heartbeat
      lapses (that reply's source is the SuperLink, not the node): partition 1 is dropped by id
      (before the fix: as partition -1);
    * it is started again, under a new node id, once round 2 is written: a later round maps the new
      node to partition 1 and it trains again (before the fix it never got work again);
    * in round 6 client 0 straggles for 600 s (``[faults]``, drawn from the seed: only that task):
      its node stays connected and never answers in time, so ``round_timeout_s`` ends the round,
      partition 0 dropped for that reason (before the fix Flower's default waited 3600 s).
    """
    cfg, run_dir, app_dir = deployment_app(tmp_path, data_root, rounds=6, seed=84, round_timeout_s=90.0,
                                           min_replies=1, max_failed_fraction=0.5,
                                           faults={"delay_s": 600.0, "delay_prob": 0.1})
    stragglers = [(pid, r) for pid in range(2) for r in range(1, 7)
                  if FaultDraw.for_task(cfg.faults, cfg.seed, pid, r).delay_s > 0]
    assert stragglers == [(0, 6)]  # the seed was chosen for this
    nodes: list[subprocess.Popen] = []
    events: dict[str, int] = {}
    with superlink.private_superlink(run_dir) as (env, connection):
        address = (run_dir / ".flwr" / "config.toml").read_text().split('address = "')[1].split('"')[0]
        nodes += [start_supernode(run_dir, env, address, pid, 2) for pid in range(2)]

        def on_progress(rows: list[dict]) -> None:
            if not rows:
                return
            last = rows[-1]["round"]
            if "killed_after" not in events and last >= 1:
                kill_tree(nodes[1])
                events["killed_after"] = last
            elif "killed_after" in events and "restarted_after" not in events and last > events["killed_after"]:
                nodes.append(start_supernode(run_dir, env, address, 1, 2))
                events["restarted_after"] = last

        run_to_completion(app_dir, env, connection, run_dir, nodes, on_progress=on_progress)
    rows = read_metrics(run_dir)
    assert [r["round"] for r in rows] == [0, 1, 2, 3, 4, 5, 6]
    assert events == {"killed_after": 1, "restarted_after": 2}, events
    train = {r["round"]: r for r in rows[1:]}
    assert all(sorted(r["cohort"]) == [0, 1] for r in train.values())
    assert all(-1 not in r["dropped"] for r in train.values()), rows
    # round 1, both nodes, nothing injected yet: the federation learns
    assert train[1]["dropped"] == [] and rows[1]["test_accuracy"] > rows[0]["test_accuracy"], rows[:2]
    # killed: the round in flight drops partition 1 (the SuperLink's error reply, or the timeout)
    assert train[2]["dropped"] == [1], train[2]
    # restarted under a new node id: mapped again, partition 1 trains again (and in round 6)
    assert "client 1 is now node" in (run_dir / "flower.log").read_text()
    assert any(1 not in train[r]["dropped"] for r in (3, 4, 5)), rows
    # the straggler: connected, never answers in time; the round timeout ends round 6
    assert train[6]["dropped"] == [0], train[6]
    assert train[6]["failure_reasons"]["0"] == "no reply within round_timeout_s (90 s)", train[6]
    assert all(0 not in train[r]["dropped"] for r in range(1, 6)), rows
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    for node in nodes:
        assert not psutil.pid_exists(node.pid) or psutil.Process(node.pid).status() == psutil.STATUS_ZOMBIE


def test_the_containers_submit_command_says_why_flwr_run_failed(tmp_path):
    """``docker/submit.sh`` is ``fedsuite submit`` (``python -m fedsuite.cli.main submit``): with no SuperLink behind its
    connection (written by ``... connection``, as ``docker/entrypoint.sh`` does), it exits 1 with one
    ``submit: error:`` line naming ``flwr run``'s complaint, and submits nothing."""
    import sys

    home, app_dir = tmp_path / ".flwr", tmp_path / "app"
    address = f"127.0.0.1:{superlink.free_port()}"  # nothing listens there
    subprocess.run([sys.executable, "-m", "fedsuite.cli.main", "connection", str(home), address], check=True)
    assert f'address = "{address}"\ninsecure = true\n' in (home / "config.toml").read_text()
    app_dir.mkdir()
    (app_dir / "pyproject.toml").write_text((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    out = subprocess.run([sys.executable, "-m", "fedsuite.cli.main", "submit", str(app_dir), "fedsuite",
                          "--run-config", "rounds=1"], env=processes.flower_env(home), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1, out
    assert out.stderr.startswith("submit: error: flwr run "), out.stderr
    assert "submitted" not in out.stdout
