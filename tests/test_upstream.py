"""Flower's and Ray's internals that fedsuite uses (``fedsuite.upstream.INTERNALS``), each imported
here by name from Flower or Ray, with what fedsuite relies on checked: its parameters, attributes,
the line it patches. A Flower or Ray upgrade that moves, renames or changes one fails here first,
naming it, instead of in a simulation's start.

Each check (:data:`CHECKS`) imports one internal as Flower or Ray spells it and returns it; the
test asserts it is the object ``fedsuite.upstream`` gives. Every call in the project to an internal
is bound to its signature (:func:`test_every_call_to_an_internal_fits_its_signature`), and
docs/DESIGN.md lists each one.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedsuite import upstream

ROOT = Path(__file__).resolve().parents[1]
#: the folders whose code may use an internal (through fedsuite.upstream)
CODE = ("fedsuite", "strategies", "clients", "benchmarks")

CHECKS: dict[str, Callable[[], Any]] = {}


def check(name: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    def register(fn: Callable[[], Any]) -> Callable[[], Any]:
        CHECKS[name] = fn
        return fn
    return register


def parameters(fn: Callable) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


# --- Flower -------------------------------------------------------------------------------------

@check("run_simulation_engine")
def _run_simulation_engine():
    from flwr.common import EventType
    from flwr.simulation.run_simulation import _run_simulation

    # its arguments are bound in test_every_call_to_an_internal_fits_its_signature
    assert hasattr(EventType, "FLWR_SIMULATION_RUN_LEAVE")  # the exit_event fedsuite.launch.simulation passes
    return _run_simulation


@check("get_fused_config_from_dir")
def _get_fused_config_from_dir():
    from flwr.common.config import get_fused_config_from_dir

    config = get_fused_config_from_dir(ROOT, {})  # this checkout is a Flower app too
    assert config["strategy"] == "fedavg", config
    return get_fused_config_from_dir


@check("get_project_config")
def _get_project_config():
    from flwr.common.config import get_project_config

    components = get_project_config(ROOT)["tool"]["flwr"]["app"]["components"]
    assert components == {"serverapp": "fedsuite.server_app:app", "clientapp": "fedsuite.client_app:app"}
    return get_project_config


@check("FlowerRun")
def _flower_run():
    from flwr.supercore.run import Run

    run = Run.create_empty(run_id=1)
    assert {"primary_task_id", "federation_id"} <= {f.name for f in dataclasses.fields(run)}
    return Run


@check("NOOP_FEDERATION_ID")
def _noop_federation_id():
    from flwr.supercore.constant import NOOP_FEDERATION_ID

    assert isinstance(NOOP_FEDERATION_ID, str)  # Run.federation_id's type
    return NOOP_FEDERATION_ID


@check("SUPERLINK_NODE_ID")
def _superlink_node_id():
    from flwr.common.constant import SUPERLINK_NODE_ID

    assert isinstance(SUPERLINK_NODE_ID, int)  # a Context's node_id
    return SUPERLINK_NODE_ID


@check("TaskIdentity")
def _task_identity():
    from flwr.supercore.task_identity import TaskIdentity

    for field in ("task_id", "run_id", "node_id"):  # set as class attributes by fedsuite.launch.simulation.run
        prop = inspect.getattr_static(type(TaskIdentity), field)
        assert isinstance(prop, property) and prop.fset is not None, field
    return TaskIdentity


@check("flower_ray_backend")
def _flower_ray_backend():
    from flwr.server.superlink.fleet.vce.backend import raybackend

    # RayBackend.build looks the actor class up in its module when it builds the pool, so
    # simulation.use_light_actor's replacement of the module's attribute is the actor it builds
    assert hasattr(raybackend, "ClientAppActor")
    assert "actor_type=ClientAppActor" in inspect.getsource(raybackend.RayBackend.build)
    return raybackend


def function_body(fn: Callable) -> str:
    """``fn``'s statements without its docstring, as an AST dump (comments and layout aside)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return "\n".join(ast.dump(stmt) for stmt in body)


@check("FlowerClientAppActor")
def _flower_client_app_actor():
    from flwr.simulation.ray_transport.ray_actor import ClientAppActor

    from fedsuite.launch.ray_actor import ClientAppActor as Ours

    flowers, ours = ClientAppActor.__ray_actor_class__, Ours.__ray_actor_class__
    assert parameters(ours.run) == parameters(flowers.run)
    assert parameters(ours.__init__) == parameters(flowers.__init__)
    assert function_body(ours.run) == function_body(flowers.run), (
        "Flower's ClientAppActor.run changed: fedsuite.launch.ray_actor.ClientAppActor.run is its copy, update it")
    return ClientAppActor


@check("ClientAppException")
def _client_app_exception():
    from flwr.clientapp.client_app import ClientAppException
    from flwr.simulation.ray_transport import ray_actor

    assert ray_actor.ClientAppException is ClientAppException  # what Flower's own actor raises
    return ClientAppException


@check("LoadClientAppError")
def _load_client_app_error():
    from flwr.clientapp.client_app import LoadClientAppError
    from flwr.simulation.ray_transport import ray_actor

    assert ray_actor.LoadClientAppError is LoadClientAppError
    return LoadClientAppError


@check("InMemoryGrid")
def _in_memory_grid():
    from flwr.serverapp import Grid
    from flwr.superlink.grid import InMemoryGrid

    assert issubclass(InMemoryGrid, Grid)
    # the attribute server_app.tune_grid sets is the one its polling sleeps on
    assert "time.sleep(self.pull_interval)" in inspect.getsource(InMemoryGrid.send_and_receive)
    return InMemoryGrid


@check("FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE")
def _max_array_chunk_size():
    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE

    assert isinstance(FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE, int) and FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE > 0
    return FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE


# --- Ray ----------------------------------------------------------------------------------------

@check("RayNode")
def _ray_node():
    from ray._private.node import Node

    from fedsuite.launch.simulation import skip_api_server, skip_daemon

    # the replacements take what the methods take (their first parameter is the node either way)
    assert parameters(Node.start_api_server)[1:] == parameters(skip_api_server)[1:]
    assert parameters(Node.start_monitor)[1:] == parameters(Node.start_log_monitor)[1:] == parameters(skip_daemon)[1:]
    source = inspect.getsource(Node)  # the node starts them through its own methods: replacing them works
    for method in ("start_api_server", "start_monitor", "start_log_monitor"):
        assert f"self.{method}(" in source, method
    return Node


@check("ray_services")
def _ray_services():
    from ray._private import services
    from ray._private.node import Node

    assert [name for name, _ in parameters(services.get_node)] == ["gcs_address", "node_id"]
    # the node looks it up in the module at each call: the wrapped one is what ray.init calls
    assert "ray._private.services.get_node(" in inspect.getsource(Node)
    return services


@check("GcsClient")
def _gcs_client():
    from ray._raylet import GcsClient, InnerGcsClient

    # a compiled class without a signature: an address of the wrong type is refused by its name,
    # before any connection is tried
    with pytest.raises(TypeError, match="'address'"):
        GcsClient(address=0)
    assert "timeout" in inspect.signature(InnerGcsClient.get_all_node_info).parameters  # GcsClient passes it on
    return GcsClient


# --- tests --------------------------------------------------------------------------------------

def test_every_internal_has_its_check():
    assert sorted(CHECKS) == sorted(upstream.INTERNALS)


@pytest.mark.parametrize("name", sorted(upstream.INTERNALS))
def test_each_internal_is_where_fedsuite_takes_it_from(name):
    assert CHECKS[name]() is getattr(upstream, name)


def test_importing_the_list_imports_neither_flower_nor_ray():
    import subprocess
    import sys

    code = "import sys, fedsuite.upstream; print(sorted(m for m in ('flwr', 'ray') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        upstream.Nothing  # noqa: B018
    with pytest.raises(ImportError):
        exec("from fedsuite.upstream import Nothing", {})


def calls_to_internals() -> list[tuple[str, str, ast.Call]]:
    """(where, callee, call) for each call in the project's code of a name taken from fedsuite.upstream,
    or of its attribute (``FlowerRun.create_empty(...)``)."""
    found = []
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            names = {alias.asname or alias.name: alias.name for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module == "fedsuite.upstream" for alias in node.names}
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                if isinstance(func, ast.Name) and func.id in names:
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno}", names[func.id], node))
                elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in names:
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno}", f"{names[func.value.id]}.{func.attr}", node))
    return found


#: internals called whose compiled signature Python cannot read; their checks above test the call
UNREADABLE_SIGNATURE = {"GcsClient"}


def test_every_call_to_an_internal_fits_its_signature():
    """Each call's positional count and keywords bind to the callee's signature as the installed
    Flower or Ray has it (``TaskIdentity.task_id = ...`` and the like are assignments, checked above)."""
    calls = calls_to_internals()
    assert {"run_simulation_engine", "FlowerRun.create_empty", "get_fused_config_from_dir", "get_project_config",
            "GcsClient"} <= {callee for _, callee, _ in calls}, calls
    for where, callee, call in calls:
        name, _, attribute = callee.partition(".")
        if name in UNREADABLE_SIGNATURE:
            continue
        target = getattr(upstream, name)
        target = getattr(target, attribute) if attribute else target
        assert not any(isinstance(a, ast.Starred) for a in call.args) and all(k.arg for k in call.keywords), where
        try:
            inspect.signature(target).bind(*[None] * len(call.args), **{k.arg: None for k in call.keywords})
        except TypeError as exc:
            pytest.fail(f"{where}: {callee}(...) no longer fits {upstream.INTERNALS[name].path}'s signature: {exc}")


def test_design_lists_every_internal_and_no_other():
    """docs/DESIGN.md's list ("Flower's and Ray's internals") names each internal by its dotted path,
    and each of its items begins with one of them (no item for an internal no longer used)."""
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    section = text.split("### Flower's and Ray's internals", 1)[1].split("\n#", 1)[0]
    paths = {internal.path for internal in upstream.INTERNALS.values()}
    named = set(re.findall(r"`([\w.]+)`", section))
    assert paths <= named, f"not in docs/DESIGN.md: {sorted(paths - named)}"
    items = re.findall(r"^- `([\w.]+)`", section, re.MULTILINE)
    assert items and set(items) <= paths, f"items for no internal: {sorted(set(items) - paths)}"
