"""Simulations on an existing Ray cluster (``--ray-address``, issue 17).

A real two-node Ray cluster is started on this machine (``ray start --head`` plus a second
``ray start --address``, each one CPU, each a process of its own started and stopped by PID), and
``fedsuite simulate --ray-address`` runs against it. The two nodes see different data folders through
one environment variable in ``data_root`` (``$VAR`` is expanded on each node), so one test can give
a node no data at all, as a cluster node without the shared storage would be.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from fedsuite.launch.processes import stop_tree
from fedsuite.deploy.superlink import free_port
from fedsuite.launch.raycluster import NodeResources, actors_that_fit, resource_problem, translate_connect_error
from tests.conftest import fedsuite_run, ray_env, start_ray_node, wait_for_ray

def cluster_query(address: str, code: str) -> object:
    """Run ``code`` (which sets ``out``) in a fresh driver connected to the cluster; return ``out``."""
    script = (f"import json, ray\nray.init(address={address!r}, logging_level='ERROR', log_to_driver=False)\n"
              f"{code}\nprint('RESULT=' + json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=ray_env())
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT=")]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1][len("RESULT="):])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(address, data folder): a head and a worker node, one CPU each. Both nodes see
    ``$FEDSUITE_TEST_DATA`` as the data folder; ``$FEDSUITE_NODE_DATA`` is that folder on the head
    and a folder that does not exist on the worker."""
    base = tmp_path_factory.mktemp("raycluster")
    data = base / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 400)
    x = (rng.normal(size=(400, 8)) + y[:, None]).astype(np.float32)
    np.savez(data / "mine.npz", x_train=x[:300], y_train=y[:300], x_test=x[300:], y_test=y[300:])
    port = free_port()
    address = f"127.0.0.1:{port}"
    lo = 20000 + (port % 100) * 100  # 20000-29999: clear of conftest's worker clusters and Ray's fixed ports
    ray_tmp = tempfile.mkdtemp(prefix="fsray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    head = start_ray_node(base / "head.log", 1, (lo, lo + 49), head_port=port, temp_dir=ray_tmp,
                          env=ray_env(FEDSUITE_TEST_DATA=str(data), FEDSUITE_NODE_DATA=str(data)))
    procs = [head]
    try:
        wait_for_ray(address, head, base / "head.log")
        deadline = time.monotonic() + 120
        worker = start_ray_node(base / "worker.log", 1, (lo + 50, lo + 99), address=address,
                                env=ray_env(FEDSUITE_TEST_DATA=str(data), FEDSUITE_NODE_DATA=str(base / "not-on-this-node")))
        procs.append(worker)
        while cluster_query(address, "out = sum(1 for n in ray.nodes() if n['Alive'])") != 2:
            assert worker.poll() is None and time.monotonic() < deadline, (base / "worker.log").read_text()
            time.sleep(1)
        yield address, data
    finally:
        for proc in reversed(procs):
            stop_tree(proc)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_simulation_runs_its_clients_on_both_nodes(cluster, tmp_path):
    address, data = cluster
    proc = fedsuite_run(
        ["simulate", "--strategy", "fedavg", "--dataset", "npz", "--model", "logreg",
         "--num-clients", "4", "--clients-per-round", "4", "--partitioner", "iid", "--rounds", "3",
         "--output-dir", str(tmp_path), "--run-name", "r", "--ray-address", address,
         "--set", "data_root=$FEDSUITE_TEST_DATA", "--set", 'dataset_options={path="mine.npz"}'],
        timeout=600, env=ray_env(FEDSUITE_TEST_DATA=str(data)),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2, 3] and all(r["failed"] == 0 for r in rows[1:])
    # Ray's state (the GCS actor table; the dashboard's state API needs packages Flower does not
    # install): the ClientApp actors were placed on both nodes of the cluster
    placement = cluster_query(address, (
        "from ray._private import state\n"
        "out = [sorted(n['NodeID'] for n in ray.nodes() if n['Alive']), sorted({a['Address']['NodeID'] "
        "for a in state.actors().values() if a['ActorClassName'] == 'ClientAppActor'})]"))
    nodes, actor_nodes = placement
    assert len(nodes) == 2 and actor_nodes == nodes


def test_a_node_without_the_data_fails_the_run_with_one_line_naming_it(cluster, tmp_path):
    address, data = cluster
    proc = fedsuite_run(
        ["simulate", "--strategy", "fedavg", "--dataset", "npz", "--model", "logreg",
         "--num-clients", "4", "--clients-per-round", "4", "--partitioner", "iid", "--rounds", "2",
         "--output-dir", str(tmp_path), "--run-name", "r", "--ray-address", address,
         "--set", "data_root=$FEDSUITE_NODE_DATA", "--set", 'dataset_options={path="mine.npz"}'],
        timeout=600, env=ray_env(FEDSUITE_NODE_DATA=str(data)),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "not-on-this-node" in errors[0] and "Ray node" in errors[0], errors[0]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failure"]["round"] == 1


def test_gpus_the_cluster_lacks_are_refused_before_the_run(cluster, tmp_path):
    address, data = cluster
    proc = fedsuite_run(
        ["simulate", "--strategy", "fedavg", "--num-clients", "4",
         "--output-dir", str(tmp_path), "--ray-address", address, "--num-gpus", "0.5",
         "--set", f"data_root={data}"],
        timeout=300, env=ray_env(),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "this cluster has 0 GPUs" in proc.stderr and "Traceback" not in proc.stderr
    assert not tmp_path.joinpath("fedavg").exists() and list(tmp_path.iterdir()) == []


def test_unreachable_cluster_is_one_line(tmp_path):
    proc = fedsuite_run(
        ["simulate", "--strategy", "fedavg", "--output-dir", str(tmp_path),
         "--ray-address", f"127.0.0.1:{free_port()}", "--set", f"data_root={tmp_path / 'data'}"],
        timeout=300, env=ray_env(),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot connect to the Ray cluster" in proc.stderr and "Traceback" not in proc.stderr


def test_resource_rules_match_flowers_actor_pool():
    cpu2 = NodeResources("a", "10.0.0.1", cpus=2, gpus=0)
    gpu1 = NodeResources("b", "10.0.0.2", cpus=8, gpus=1)
    assert actors_that_fit([cpu2, gpu1], 1, 0) == 10
    assert actors_that_fit([cpu2, gpu1], 3, 0) == 2  # per node: a client cannot span two nodes
    assert actors_that_fit([cpu2, gpu1], 1, 0.25) == 4
    assert resource_problem("x", [cpu2, gpu1], 1, 0.25) is None
    assert "this cluster has 0 GPUs" in resource_problem("x", [cpu2], 1, 0.5)
    assert "no node of the Ray cluster at x can host one client with 4 CPUs" in resource_problem("x", [cpu2], 4, 0)


def test_version_mismatch_is_translated_to_one_line():
    # the text Ray raises (ray._private.utils.check_version_info)
    ray_error = RuntimeError(
        "Version mismatch: The cluster was started with:\n    Ray: 2.49.0\n    Python: 3.10.12\n"
        "This process on node 127.0.0.1:6379 was started with:\n    Ray: 2.55.1\n    Python: 3.11.7\n")
    line = translate_connect_error("head:6379", ray_error)
    assert "\n" not in line
    assert line == ("the Ray cluster at head:6379 runs Ray 2.49.0 on Python 3.10.12, this machine Ray 2.55.1 on "
                    "Python 3.11.7; install the same Ray and Python versions on both")
