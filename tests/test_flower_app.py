"""A Flower app of one's own (``examples/flower-app``: its own ServerApp runs a fedsuite method with
``method_strategy`` in Flower's loop, fedsuite's ClientApp) run with the real ``flwr`` CLI:

* on Flower's local simulation federation (``flwr run examples/flower-app``: the CLI starts its own
  SuperLink in simulation mode, here under a private ``FLWR_HOME`` and ports), with Flower's runtime
  dependency installation switched off as the README says;
* on a deployment federation: a real ``flower-superlink`` and two ``flower-supernode`` processes on
  127.0.0.1, as docs/deployment.md starts them.

Each run reports the test accuracy of every round through Flower's ``evaluate_fn`` and, asked with
``records=true``, writes fedsuite's run records. Fewer SuperNodes than ``num_clients`` is one line
(the simulation fails with it; a deployment says it while it waits); after ``flwr stop`` no process
of the run is left. Every process started here is stopped by PID."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from fedsuite.launch import processes
from fedsuite.deploy import superlink
from fedsuite.records.rows import read_clients, read_metrics
from tests.test_deployment import start_supernode

pytestmark = pytest.mark.long

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flower-app"
#: the connection a fresh FLWR_HOME's config.toml names: Flower's local SuperLink (simulation)
LOCAL = "local"


@pytest.fixture(scope="module")
def local_federation(tmp_path_factory):
    """The environment for ``flwr`` commands on Flower's local simulation federation: a private
    ``FLWR_HOME`` and free ports for the SuperLink the first ``flwr run`` starts, and the README's
    answer to the dependency question (``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``, which that
    SuperLink inherits). At the end every process carrying this ``FLWR_HOME`` (the SuperLink and
    what it started) is stopped by PID."""
    home = tmp_path_factory.mktemp("flwr-home")
    env = {**processes.process_env(), "FLWR_HOME": str(home),
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(superlink.free_port()),
           "FLWR_LOCAL_CONTROL_API_PORT": str(superlink.free_port())}
    yield env
    processes.terminate_all(processes.with_descendants(processes.marked("FLWR_HOME", str(home))), timeout=5.0)


def flwr_run(env: dict[str, str], run_config: str, cwd: Path) -> subprocess.CompletedProcess:
    """``flwr run examples/flower-app --run-config ... --stream`` on the local federation."""
    return subprocess.run([processes.bin_path("flwr"), "run", str(EXAMPLE), "--run-config", run_config, "--stream"],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=420)


def run_id_of(output: str) -> int:
    return int(re.search(r"Successfully started run (\d+)", output).group(1))


def assert_accuracy_every_round(run_dir: Path, log: str, rounds: int) -> None:
    """Flower's loop logged the central evaluation of w^0 and of every round, the example printed the
    best of Flower's ``Result``, and fedsuite's records hold the same accuracy row by row."""
    logged = [float(a) for a in re.findall(r"MetricRecord: \{'accuracy': ([0-9.e-]+), 'loss'", log)]
    initial = re.search(r"Initial global evaluation results: \{'accuracy': ([0-9.e-]+)", log)
    assert initial is not None and len(logged) == rounds, log[-3000:]
    rows = read_metrics(run_dir)
    assert [r["round"] for r in rows] == list(range(rounds + 1))
    assert [r["test_accuracy"] for r in rows] == [float(initial.group(1)), *logged]
    assert all(isinstance(r["test_loss"], float) for r in rows)
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"], rows  # it learns
    assert all(r["cohort"] == [0, 1] and r["dropped"] == [] for r in rows[1:]), rows
    best = max(logged)
    assert f"best test accuracy {best:.4f} after round {logged.index(best) + 1}" in log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == rounds
    assert (run_dir / "config.json").is_file() and (run_dir / "accuracy.png").is_file()


def test_the_example_app_runs_on_the_local_simulation_federation(local_federation, data_root, tmp_path):
    """``flwr run examples/flower-app`` (FedMR, 2 clients, 3 rounds) with ``federated_eval='cohort'``
    on Flower's own simulation federation completes with the test accuracy of every round in Flower's
    log and in its ``Result`` (before: "ServerApp-side Evaluate Metrics: {}"), the federated
    evaluation's columns of every round in Flower's log (``aggregate_evaluate``: "Aggregated
    ClientApp-side Evaluate Metrics") and in the records, and fedsuite's records in ``run_dir``."""
    run_dir = tmp_path / "records"
    out = flwr_run(local_federation, f"data_root='{data_root}' records=true run_dir='{run_dir}' "
                   "federated_eval='cohort'", tmp_path)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    status, details = superlink.wait_finished(run_id_of(log), local_federation, LOCAL, tmp_path)
    assert status == "finished:completed", (details, log[-3000:])
    assert "Exit Code: 608" not in log  # the runtime dependency installation is off
    assert_accuracy_every_round(run_dir, log, rounds=3)
    logged = [float(a) for a in re.findall(r"'client_accuracy_weighted': ([0-9.e-]+)", log.split("Final results")[0])]
    assert "Aggregated ClientApp-side Evaluate Metrics" in log
    rows = read_metrics(run_dir)[1:]
    assert logged == [r["client_accuracy_weighted"] for r in rows] and len(logged) == 3, log[-3000:]
    assert all(r["clients_evaluated"] == 2 and r["client_eval_failed"] == 0 for r in rows), rows
    clients = read_clients(run_dir)
    assert [(c["round"], c["partition_id"]) for c in clients] == [(r, p) for r in (1, 2, 3) for p in (0, 1)]
    assert all(0 <= c["eval_accuracy"] <= 1 and c["eval_examples"] > 0 for c in clients), clients


def test_fewer_simulated_supernodes_than_clients_fail_in_one_line(local_federation, data_root, tmp_path):
    """Flower's local federation has 2 SuperNodes by default; a run with ``num_clients=3`` used to
    wait silently in the handshake (600 s). Now the ServerApp says both numbers and what to set in
    one line and the run fails at once (the ``flwr run`` below would time out otherwise)."""
    out = flwr_run(local_federation, f"data_root='{data_root}' num_clients=3 clients_per_round=3", tmp_path)
    log = out.stdout + out.stderr
    line = ("the simulation has 2 SuperNodes and the run has num_clients=3: set the federation's num-supernodes=3 "
            "(flwr run ... --federation-config \"num-supernodes=3\") or the run's num_clients=2")
    assert line in log.splitlines(), log[-3000:]
    status, details = superlink.wait_finished(run_id_of(log), local_federation, LOCAL, tmp_path)
    assert status == "finished:failed" and line in details, (status, details)
    assert "ROUND 1" not in log


def run_processes(home: str) -> tuple[psutil.Process, dict[int, tuple[float, str]]]:
    """The run's ``flwr-simulation`` process under the local SuperLink of ``home``, and it with all its
    descendants (Ray's daemons, agents and ClientApp actors, fedsuite's watcher): PID -> (start time,
    command line)."""
    sims = [p for p in processes.with_descendants(processes.marked("FLWR_HOME", home))
            if "flwr-simulation" in " ".join(p.cmdline())]
    assert len(sims) == 1, sims
    sim = sims[0]
    snapshot = {}
    for p in [sim, *sim.children(recursive=True)]:
        try:
            snapshot[p.pid] = (p.create_time(), " ".join(p.cmdline()))
        except psutil.Error:  # a Ray worker that just ended
            continue
    return sim, snapshot


def still_running(snapshot: dict[int, tuple[float, str]]) -> list[str]:
    alive = []
    for pid, (started, cmdline) in snapshot.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} {cmdline[:80]}")
        except psutil.NoSuchProcess:
            continue
    return alive


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout:g} s"
        time.sleep(0.5)


def test_flwr_stop_leaves_no_process_of_the_run(local_federation, data_root, tmp_path):
    """``flwr stop`` on a running simulation: Flower ends its ``flwr-simulation`` process at its next
    heartbeat, without Ray's orderly shutdown, and Ray's agents (children of the raylet) used to
    outlive it by a minute or more. Once that process is gone (and fedsuite's watcher with it), no
    process it started is left: Ray's daemons, agents and ClientApp actors."""
    run_dir = tmp_path / "records"
    run_id = superlink.submit(EXAMPLE, local_federation, LOCAL,
                              run_config=f"data_root='{data_root}' records=true run_dir='{run_dir}' rounds=1000")
    wait_until(lambda: len(read_metrics(run_dir, tolerant=True)) >= 2, 300, "round 1 recorded")
    sim, snapshot = run_processes(local_federation["FLWR_HOME"])
    cmdlines = [cmdline for _, cmdline in snapshot.values()]
    assert any("raylet" in c for c in cmdlines) and any("ClientAppActor" in c for c in cmdlines), cmdlines
    watchers = {pid: seen for pid, seen in snapshot.items() if "fedsuite.launch.reaper" in seen[1]}
    out = subprocess.run([processes.bin_path("flwr"), "stop", str(run_id), LOCAL], env=local_federation,
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "stopped" in out.stdout, out
    wait_until(lambda: not sim.is_running() or sim.status() == psutil.STATUS_ZOMBIE, 120, "flwr-simulation ended")
    wait_until(lambda: not still_running(watchers), 60, "fedsuite's watcher done")
    assert still_running(snapshot) == []
    assert superlink.run_status(run_id, local_federation, LOCAL, tmp_path)[0] == "finished:stopped"
    assert not (run_dir / "summary.json").exists()  # stopped from outside: the run stays partial


def test_the_example_app_runs_on_a_superlink_with_supernodes(tmp_path, data_root):
    """``flwr run examples/flower-app`` to a real SuperLink (runtime dependency installation off, as
    docs/deployment.md starts it) with real SuperNodes. With one SuperNode of the run's two, the
    ServerApp says so in one line and waits; once the second starts, the run completes with the test
    accuracy of every round in Flower's log and fedsuite's records."""
    run_dir = (tmp_path / "federation").resolve()
    records = run_dir / "records"
    records.mkdir(parents=True)
    nodes: list[subprocess.Popen] = []
    with superlink.private_superlink(run_dir) as (env, connection):
        address = (run_dir / ".flwr" / "config.toml").read_text().split('address = "')[1].split('"')[0]
        nodes.append(start_supernode(run_dir, env, address, 0, 2))
        try:
            run_id = superlink.submit(EXAMPLE, env, connection,
                                      run_config=f"data_root='{data_root}' records=true run_dir='{records}'")
            follower = threading.Thread(target=superlink.follow, args=(run_id, env, connection, records), daemon=True)
            follower.start()
            line = ("1 SuperNodes are connected and the run has num_clients=2: waiting up to 600 s for 1 more (each "
                    "with its own partition-id in --node-config), or run with num_clients=1")
            log_path = records / "flower.log"
            wait_until(lambda: log_path.exists() and line in log_path.read_text(), 120, "the one line")
            assert not (records / "config.json").exists()  # still waiting in the handshake
            nodes.append(start_supernode(run_dir, env, address, 1, 2))
            follower.join(timeout=420)
            assert not follower.is_alive()
            status, details = superlink.wait_finished(run_id, env, connection, records, timeout=120)
            # the whole log: the example's last line comes after summary.json, where follow() stops
            log = subprocess.run([processes.bin_path("flwr"), "log", str(run_id), connection, "--show"], env=env,
                                 cwd=records, capture_output=True, text=True, timeout=120).stdout
        finally:
            for node in nodes:
                processes.stop_tree(node)
    assert status == "finished:completed", (details, log[-3000:])
    assert log.count(line) == 1
    assert_accuracy_every_round(records, log, rounds=3)
