"""Running a simulation's virtual clients on an existing Ray cluster (``ray_address``).

The run's simulation process (``fedsuite.launch.simulation``) calls ``ray.init()``; with ``RAY_ADDRESS`` set
in that process's environment (``fedsuite.launch.processes.flower_env``), Ray connects to the cluster there
instead of starting a private one, and the ClientApp actors are placed on the cluster's nodes. The
ServerApp stays on the machine that runs ``fedsuite simulate``.

Before a run starts, :func:`check_cluster` connects once from the command line and turns Ray's and
Flower's late, long errors into one line each:

* no cluster at the address;
* a Ray or Python version that differs from this machine's (Ray refuses the connection);
* resources that cannot host one client: "this cluster has 0 GPUs" rather than Flower's
  "ActorPool is empty" after the run has started.

On a cluster each node loads its partitions itself from ``data_root`` (shared storage or a copy per
node; ``$VARS`` in it are expanded on each node). A node without the files fails its clients with
an error that names the node (``fedsuite.engine.client_app``), and the run stops with that line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class ClusterError(RuntimeError):
    """The Ray cluster cannot run this simulation (message: one line, ready to print)."""


@dataclass(frozen=True)
class NodeResources:
    node_id: str
    address: str
    cpus: float
    gpus: float


def actors_that_fit(nodes: list[NodeResources], num_cpus: float, num_gpus: float) -> int:
    """How many client actors (``num_cpus`` CPUs and ``num_gpus`` GPUs each) the nodes host, node
    by node, as Flower's actor pool counts them (a client cannot span two nodes)."""
    total = 0
    for node in nodes:
        fit = int(node.cpus // num_cpus) if num_cpus > 0 else 0
        if num_gpus > 0:
            fit = min(fit, int(node.gpus // num_gpus))
        total += fit
    return total


def resource_problem(address: str, nodes: list[NodeResources], num_cpus: float, num_gpus: float) -> str | None:
    """The one-line reason the cluster cannot host a client, or None."""
    if not nodes:
        return f"the Ray cluster at {address} has no live node with resources"
    cpus, gpus = sum(n.cpus for n in nodes), sum(n.gpus for n in nodes)
    if num_gpus > 0 and gpus == 0:
        return (f"this cluster has 0 GPUs ({len(nodes)} nodes, {cpus:g} CPUs), but --num-gpus {num_gpus:g} asks "
                f"for a GPU share per client; use --num-gpus 0 or add GPU nodes")
    if actors_that_fit(nodes, num_cpus, num_gpus) == 0:
        per_node = ", ".join(f"{n.address}: {n.cpus:g} CPUs/{n.gpus:g} GPUs" for n in nodes)
        return (f"no node of the Ray cluster at {address} can host one client with {num_cpus:g} CPUs and "
                f"{num_gpus:g} GPUs ({per_node}); lower --num-cpus/--num-gpus")
    return None


def translate_connect_error(address: str, exc: BaseException) -> str:
    """Ray's errors on ``ray.init(address=...)`` as one line."""
    text = str(exc)
    if "Version mismatch" in text:
        # Ray: "Version mismatch: The cluster was started with:\n    Ray: A\n    Python: B\n
        #       This process on node N was started with:\n    Ray: C\n    Python: D\n"
        versions = re.findall(r"Ray:\s*(\S+)\s*Python:\s*(\S+)", text)
        if len(versions) == 2:
            (cluster_ray, cluster_py), (our_ray, our_py) = versions
            return (f"the Ray cluster at {address} runs Ray {cluster_ray} on Python {cluster_py}, this machine "
                    f"Ray {our_ray} on Python {our_py}; install the same Ray and Python versions on both")
        return f"the Ray cluster at {address} runs other Ray/Python versions than this machine"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return f"cannot connect to the Ray cluster at {address}: {first}"


def check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Raise :class:`ClusterError` unless something accepts TCP connections at ``address``
    (``host:port`` or ``ray://host:port``; ``auto`` is left to Ray). Ray itself retries an
    unreachable GCS for minutes before it gives up."""
    import socket

    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if address == "auto" or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterError(f"cannot connect to the Ray cluster at {address}: {exc.strerror or exc}; "
                           f"is `ray start --head` running there?") from None


def cluster_nodes(address: str) -> list[NodeResources]:
    """Connect to the cluster at ``address``, read its live nodes, disconnect."""
    import os
    import warnings

    import ray

    check_reachable(address)
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # as in Flower's processes (processes.py)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            ray.init(address=address, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
    except Exception as exc:  # ConnectionError, RuntimeError (versions), ValueError (address)
        raise ClusterError(translate_connect_error(address, exc)) from None
    try:
        return [
            NodeResources(node_id=n["NodeID"], address=str(n.get("NodeManagerAddress", "?")),
                          cpus=float(n["Resources"].get("CPU", 0)), gpus=float(n["Resources"].get("GPU", 0)))
            for n in ray.nodes() if n.get("Alive") and n.get("Resources")
        ]
    finally:
        ray.shutdown()


def check_cluster(address: str, num_cpus: float, num_gpus: float) -> list[NodeResources]:
    """Raise :class:`ClusterError` (one line) unless the cluster at ``address`` can run clients."""
    nodes = cluster_nodes(address)
    problem = resource_problem(address, nodes, num_cpus, num_gpus)
    if problem:
        raise ClusterError(problem)
    return nodes


def node_label() -> str:
    """Where this process runs, for error messages: the host name, plus the Ray node id and IP when
    it is a Ray worker (on a one-machine cluster, several nodes share a host name)."""
    import socket
    import sys

    label = socket.gethostname()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ctx = ray.get_runtime_context()
        label += f" (Ray node {ctx.get_node_id()[:12]}, {ray.util.get_node_ip_address()})"
    return label
