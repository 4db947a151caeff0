"""Every name fedsuite takes from Flower or Ray outside their public APIs, in one place.

Flower's public API is ``flwr.app``, ``flwr.serverapp`` (with ``flwr.serverapp.strategy``),
``flwr.clientapp`` and ``flwr.common``'s top-level names; Ray's is ``ray``, ``ray.actor``,
``ray.util`` and ``ray.tune``. What fedsuite needs beyond them is listed in :data:`INTERNALS`, each
with the modules that use it and why the public API does not do: every other module takes these
names from here (``from fedsuite.upstream import InMemoryGrid``), never from Flower or Ray
(``tests/test_architecture.py`` checks it), and ``tests/test_upstream.py`` imports each one by name
from Flower or Ray and checks what fedsuite relies on (its parameters, attributes, the source line
it patches), so that an upgrade of either fails there first, naming the internal. ``docs/DESIGN.md``
lists them all ("Flower's and Ray's internals").

A name is imported when it is first asked for (a module ``__getattr__``), not when this module is:
importing this module imports neither Flower nor Ray, and a module that imports a name at its top
loads Flower's or Ray's module then, as a direct import would (``flwr.superlink.grid`` alone is
about 2 s; the CLI's start-up and a Ray worker's imports stay as they were).
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple


class Internal(NamedTuple):
    """One non-public name: where it lives, who uses it, why."""

    module: str
    #: the attribute of ``module`` (None: the module itself, whose attributes fedsuite replaces)
    attribute: str | None
    #: the fedsuite functions or modules that use it
    used_by: str
    #: what fedsuite does with it, and why the public API does not suffice
    reason: str

    @property
    def path(self) -> str:
        """Its dotted name in Flower or Ray."""
        return f"{self.module}.{self.attribute}" if self.attribute else self.module


INTERNALS: dict[str, Internal] = {
    # --- Flower: running the Simulation Engine without a SuperLink (fedsuite.launch.simulation) ---------
    "run_simulation_engine": Internal(
        "flwr.simulation.run_simulation", "_run_simulation", "simulation.run, simulation.import_apps",
        "Flower's Simulation Engine, called as flwr-simulation calls it (the apps by name, the run config in "
        "the ServerApp's context, the Run): the public run_simulation takes app objects and no run config, "
        "and flwr run needs a SuperLink, SuperExec and flwr log (five processes, seconds of every start)"),
    "get_fused_config_from_dir": Internal(
        "flwr.common.config", "get_fused_config_from_dir", "simulation.run",
        "the app folder's run config ([tool.flwr.app.config]) as flwr-simulation reads it, typed as Flower "
        "types it; no public reader"),
    "get_project_config": Internal(
        "flwr.common.config", "get_project_config", "simulation.app_components",
        "the app's pyproject.toml as Flower reads and validates it ([tool.flwr.app.components]); no public "
        "reader"),
    "FlowerRun": Internal(
        "flwr.supercore.run", "Run", "simulation.run",
        "the Run the engine takes (Run.create_empty, then primary_task_id and federation_id set as "
        "flwr-simulation sets them); the SuperLink makes it otherwise"),
    "NOOP_FEDERATION_ID": Internal(
        "flwr.supercore.constant", "NOOP_FEDERATION_ID", "simulation.run",
        "the federation of a run no SuperLink registered, as flwr-simulation's run has"),
    "SUPERLINK_NODE_ID": Internal(
        "flwr.common.constant", "SUPERLINK_NODE_ID", "simulation.run",
        "the node the ServerApp's messages and context belong to, as in flwr-simulation"),
    "TaskIdentity": Internal(
        "flwr.supercore.task_identity", "TaskIdentity", "simulation.run",
        "the process's task, run and node ids, under which the ServerApp's messages are sent; "
        "flwr-simulation sets them, nothing public does"),
    # --- Flower: the Ray backend's actor (fedsuite.launch.simulation.use_light_actor, fedsuite.launch.ray_actor) -
    "flower_ray_backend": Internal(
        "flwr.server.superlink.fleet.vce.backend.raybackend", None, "simulation.use_light_actor",
        "its ClientAppActor, the actor class RayBackend.build creates, is replaced by "
        "fedsuite.launch.ray_actor.ClientAppActor: Flower's is defined in flwr.simulation, whose import loads "
        "the SuperLink's state (SQLAlchemy, Alembic), about 1 CPU-s in every actor's worker; no public switch"),
    "FlowerClientAppActor": Internal(
        "flwr.simulation.ray_transport.ray_actor", "ClientAppActor", "fedsuite.launch.ray_actor (a copy; no module imports it)",
        "fedsuite.launch.ray_actor.ClientAppActor is its copy (its run line for line); tests compare the two"),
    "ClientAppException": Internal(
        "flwr.clientapp.client_app", "ClientAppException", "ray_actor.ClientAppActor",
        "what the Ray backend expects an actor to raise for a ClientApp's error; not re-exported by "
        "flwr.clientapp"),
    "LoadClientAppError": Internal(
        "flwr.clientapp.client_app", "LoadClientAppError", "ray_actor.ClientAppActor",
        "the error an actor lets through (the engine tells a failed load from a failed app); not "
        "re-exported by flwr.clientapp"),
    # --- Flower: the ServerApp in simulation (fedsuite.engine.server_app, fedsuite.engine.nodes) -----------------
    "InMemoryGrid": Internal(
        "flwr.superlink.grid", "InMemoryGrid", "server_app.tune_grid, nodes.Handshake",
        "the simulation's grid: tells a simulation from a deployment (a handshake with too few nodes fails "
        "at once there) and its pull_interval is set from 0.1 s to 0.01 s; the public Grid says neither"),
    # --- Flower: the gateway (fedsuite.deploy.gateway) -------------------------------------------------------
    "FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE": Internal(
        "flwr.common.constant", "FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE", "gateway.default_max_body",
        "the largest array chunk a SuperNode sends (5 MiB unless its variable is set): the gateway's body "
        "limit; Flower does not publish it"),
    # --- Ray: a private Ray without the daemons a simulation never uses (simulation.lean_private_ray) -
    "RayNode": Internal(
        "ray._private.node", "Node", "simulation.lean_private_ray (and search_tune.run_tune through it)",
        "its start_api_server, start_monitor and start_log_monitor are replaced by no-ops: ray.init has no "
        "switch for these daemons (about 1.4 CPU-s and up to 1.4 s of every start)"),
    "ray_services": Internal(
        "ray._private.services", None, "simulation.lean_private_ray",
        "its get_node, which ray.init calls and which sleeps a whole second while the raylet is not yet "
        "registered, is wrapped to poll every 20 ms first"),
    "GcsClient": Internal(
        "ray._raylet", "GcsClient", "simulation.get_node_once_registered",
        "lists the GCS's nodes (get_all_node_info) while ray.init is still starting: the public ray.nodes() "
        "needs the driver connected, which is what it waits for"),
}

__all__ = ["INTERNALS", "Internal", *INTERNALS]


def load(name: str) -> Any:
    """The object :data:`INTERNALS` names ``name``, imported now."""
    internal = INTERNALS[name]
    value = importlib.import_module(internal.module)
    return getattr(value, internal.attribute) if internal.attribute else value


def __getattr__(name: str) -> Any:
    if name not in INTERNALS:
        raise AttributeError(f"module 'fedsuite.upstream' has no attribute {name!r}")
    value = load(name)
    globals()[name] = value  # found here from now on, without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *INTERNALS})
