"""The import graph of fedsuite/, strategies/ and clients/ (docs/DESIGN.md, "Packages and the direction of imports").

Every import statement counts, wherever it stands (module level, inside a function, under
``if TYPE_CHECKING:``): a cycle hidden in a function body is still a cycle.

* the engine (``fedsuite``) imports neither ``strategies`` nor ``clients``; the one exception is
  the registry's discovery, which imports the ``strategies`` package to list its modules;
* client rules never import server rules;
* ``strategies/`` and ``clients/`` import only the method contract, the package ``fedsuite.method``
  (:data:`CONTRACT`);
* fedsuite's layer packages import only layers below their own (:data:`LAYERS`), apart from the
  listed :data:`EXCEPTIONS`, each with its reason; the method contract has none;
* there is no import cycle among the modules of the three packages;
* only ``fedsuite.upstream`` takes names from Flower or Ray outside their public APIs (:data:`PUBLIC`);
* a method's ``__init__`` passes its base no ``**kwargs`` (the bases take none).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedsuite", "strategies", "clients")
#: (importer, imported) pairs allowed to point from the engine into the method packages
DISCOVERY = {("fedsuite.method.registry", "strategies")}
#: what a method may import of fedsuite: the package ``fedsuite.method`` and its modules (the strategy
#: and client-rule bases, rounds, the declared records and the wire format, array maths, server
#: optimiser steps, seeding, params, activity measures, the channel to the clients, the registry,
#: the plug-ins). Never the engine, the apps, the launcher or the runtime: a method that needs
#: something of the run gets it through ServerSetup or LocalTask.
CONTRACT = "fedsuite.method"

#: fedsuite's layer packages (and top-level modules), lowest first: a module may import its own
#: layer and those before it. ``errors`` and ``upstream`` import no layer; the public entry shims
#: (``fedsuite``, ``fedsuite.server_app``, ``fedsuite.client_app``) sit on top.
LAYERS = (
    ("errors", "upstream"),
    ("data",),
    ("models",),
    ("method",),
    ("config",),
    ("records",),
    ("engine",),
    ("launch",),
    ("deploy",),
    ("queues",),
    ("cli",),
    ("", "server_app", "client_app"),
)
#: the imports that run against :data:`LAYERS`, each with its reason (every one still in the code:
#: a fixed one is taken off the list)
EXCEPTIONS = {
    ("fedsuite.models.run", "fedsuite.method.seeding"):
        "the process-wide lock on torch's global generator, held while a model initialises "
        "(seeding imports no fedsuite module)",
    ("fedsuite.config.schema", "fedsuite.records.paths"):
        "the one check of the paths and names fedsuite is given (paths imports fedsuite.errors alone)",
    ("fedsuite.config.build", "fedsuite.records.paths"):
        "the one check of the paths and names fedsuite is given (paths imports fedsuite.errors alone)",
    ("fedsuite.records.hold", "fedsuite.launch.processes"):
        "a run directory's holder is found by the process mark (processes imports no fedsuite module)",
    ("fedsuite.records.provenance", "fedsuite.launch.processes"):
        "the cores this process may use, recorded with the run (processes imports no fedsuite module)",
    ("fedsuite.engine.round_engine", "fedsuite.launch.processes"):
        "the cores this process may use, for the evaluation and in-process threads "
        "(processes imports no fedsuite module)",
    ("fedsuite.engine.runtime", "fedsuite.launch.raycluster"):
        "a cluster run's check of its Ray cluster (raycluster imports no fedsuite module)",
    ("fedsuite.engine.client_app", "fedsuite.launch.raycluster"):
        "the Ray node a client runs on, for its records (raycluster imports no fedsuite module)",
    ("fedsuite.engine.server_app", "fedsuite.launch.reaper"):
        "in Flower's own simulation process the ServerApp starts the watcher of that process's "
        "descendants (reaper imports processes and records.rundir)",
    ("fedsuite.launch.runner", "fedsuite.cli.support"):
        "a run started from a terminal shows the console's progress display",
    ("fedsuite.launch.api", "fedsuite.cli.support"):
        "the Python API's runs print on the console's plain style",
    ("fedsuite.queues.reproduce.queue", "fedsuite.cli.support"):
        "the reproduce queue prints on the console's plain style",
}


#: Flower's and Ray's public modules: every other module of theirs, and any name of theirs that begins
#: with "_", is an internal, which only fedsuite.upstream takes (docs/DESIGN.md, "Flower's and Ray's
#: internals")
PUBLIC = {"flwr", "flwr.app", "flwr.serverapp", "flwr.serverapp.strategy", "flwr.clientapp", "flwr.common",
          "ray", "ray.actor", "ray.util", "ray.tune", "ray.tune.schedulers", "ray.tune.search"}
#: the folders whose code must take internals from fedsuite.upstream
UPSTREAM_USERS = (*PACKAGES, "benchmarks", "examples")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (``from a.b import c`` counts a.b.c if that is a module,
    else a.b). A submodule's implicit import of its parent package is not counted."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def test_engine_imports_no_method_code():
    bad = [
        (src, dst)
        for src, dsts in graph().items() if src.split(".")[0] == "fedsuite"
        for dst in dsts if dst.split(".")[0] in ("strategies", "clients") and (src, dst) not in DISCOVERY
    ]
    assert not bad, f"fedsuite/ imports method code: {bad}"


def test_client_rules_do_not_import_server_rules():
    bad = [(src, dst) for src, dsts in graph().items() if src.startswith("clients")
           for dst in dsts if dst.startswith("strategies")]
    assert not bad, f"clients/ imports strategies/: {bad}"


def in_contract(module: str) -> bool:
    return module == CONTRACT or module.startswith(CONTRACT + ".")


def test_methods_import_only_the_method_contract():
    """``strategies/`` and ``clients/`` import of fedsuite only ``fedsuite.method`` and its modules."""
    bad = sorted((src, dst) for src, dsts in graph().items() if src.split(".")[0] in ("strategies", "clients")
                 for dst in dsts if dst.split(".")[0] == "fedsuite" and not in_contract(dst))
    assert not bad, f"method code imports fedsuite modules outside the method contract: {bad}"


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of a fedsuite module's layer (its package under ``fedsuite``, or
    its own name for a top-level module; "" for the package ``fedsuite`` itself)."""
    name = module.split(".")[1] if "." in module else ""
    found = [i for i, names in enumerate(LAYERS) if name in names]
    assert found, f"{module}: in no layer of LAYERS"
    return found[0]


def upward_imports(g: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The (importer, imported) pairs among fedsuite's modules where the imported module's layer is above the importer's."""
    return {(src, dst) for src, dsts in g.items() if src.split(".")[0] == "fedsuite"
            for dst in dsts if dst.split(".")[0] == "fedsuite" and layer_of(dst) > layer_of(src)}


def test_every_layer_imports_only_the_layers_below_it():
    """fedsuite's layers import downwards (:data:`LAYERS`), but for the :data:`EXCEPTIONS`; every
    top-level entry of ``fedsuite/`` is in a layer; each exception is still in the code."""
    entries = {p.stem if p.suffix == ".py" else p.name for p in (ROOT / "fedsuite").iterdir()
               if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.name != "__init__.py"}
    assert entries == {name for names in LAYERS for name in names if name}, "LAYERS lists fedsuite/'s entries"
    upward = upward_imports(graph())
    bad = sorted(upward - set(EXCEPTIONS))
    assert not bad, f"imports of a higher layer: {bad}"
    stale = sorted(set(EXCEPTIONS) - upward)
    assert not stale, f"EXCEPTIONS that the code no longer has: {stale}"


#: the most entries ``fedsuite/`` shows at its top level, and the most lines of any of its modules
MAX_TOP_LEVEL_ENTRIES = 15
MAX_MODULE_LINES = 400


def test_the_layout_stays_readable():
    """``fedsuite/`` holds at most :data:`MAX_TOP_LEVEL_ENTRIES` files and folders at its top level
    (its layers, ``errors``, ``upstream`` and the public entry modules), and no module of it is over
    :data:`MAX_MODULE_LINES` lines: a module that grows past it is split by what it does."""
    entries = sorted(p.name for p in (ROOT / "fedsuite").iterdir() if p.name != "__pycache__")
    assert len(entries) <= MAX_TOP_LEVEL_ENTRIES, entries
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "fedsuite").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_the_method_contract_imports_no_layer_above_it():
    """``fedsuite.method`` imports nothing of the engine, the records, the launcher, the queues,
    deployment or the CLI (and no exception allows it)."""
    method = LAYERS.index(("method",))
    bad = sorted((src, dst) for src, dsts in graph().items() if in_contract(src)
                 for dst in dsts if dst.split(".")[0] == "fedsuite" and layer_of(dst) > method)
    assert not bad, f"the method contract imports layers above it: {bad}"


def test_the_layer_check_sees_an_upward_import():
    """An import from the method contract into the engine is upward; the engine's import of the
    contract is not."""
    g = {"fedsuite.method.strategy": {"fedsuite.engine.nodes"}, "fedsuite.engine.nodes": {"fedsuite.method.wire"}}
    assert upward_imports(g) == {("fedsuite.method.strategy", "fedsuite.engine.nodes")}


def test_no_import_cycle():
    g = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_function_local_imports(tmp_path):
    """The walker counts an import inside a function body (the kind that used to hide a cycle)."""
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from strategies.base import X\n")
    assert imports_of("fedsuite.m", path, {"fedsuite.m", "strategies", "strategies.base"}) == {"strategies.base"}


def is_module(dotted: str) -> bool:
    """Whether ``dotted`` (``flwr.common.config``) is a module or package of an installed
    distribution, found on disk without importing anything."""
    top, *rest = dotted.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        return False
    base = Path(spec.origin).parent.joinpath(*rest)
    return (base.with_suffix(".py").exists() or (base / "__init__.py").exists()
            or any(base.parent.glob(f"{base.name}.*.so")))


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for an attribute chain of names, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def upstream_internals(path: Path) -> list[str]:
    """The non-public Flower and Ray names ``path`` uses: imports (anywhere, with ``importlib``'s
    ``import_module("...")`` too) of a module outside :data:`PUBLIC`, of a name that begins with "_",
    and attributes that begin with "_" of such a module (``ray._private.worker``)."""
    def internal(module: str) -> bool:
        return module.split(".")[0] in ("flwr", "ray") and (
            module not in PUBLIC or any(part.startswith("_") for part in module.split(".")))

    found = []
    label = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{label}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where} {alias.name}" for alias in node.names if internal(alias.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if internal(node.module):
                found.append(f"{where} {node.module}")
            elif node.module.split(".")[0] in ("flwr", "ray"):
                found += [f"{where} {node.module}.{alias.name}" for alias in node.names
                          if alias.name.startswith("_") or (is_module(f"{node.module}.{alias.name}")
                                                            and internal(f"{node.module}.{alias.name}"))]
        elif (isinstance(node, ast.Call) and dotted(node.func) in ("importlib.import_module", "import_module", "__import__")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and internal(node.args[0].value)):
            found.append(f"{where} {node.args[0].value}")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__"):
            name = dotted(node)
            if name and name.split(".")[0] in ("flwr", "ray"):
                found.append(f"{where} {name}")
    return found


def test_only_fedsuite_upstream_takes_flower_or_ray_internals():
    """Every non-public Flower or Ray name comes from ``fedsuite.upstream``, where each is listed with
    its reason (tests/test_upstream.py imports each by name)."""
    bad = [hit for folder in UPSTREAM_USERS for path in sorted((ROOT / folder).rglob("*.py"))
           if path != ROOT / "fedsuite" / "upstream.py" for hit in upstream_internals(path)]
    assert not bad, f"Flower or Ray internals imported outside fedsuite/upstream.py: {bad}"


def test_the_internals_checker_sees_each_kind_of_use(tmp_path):
    """A function-local import of an internal module, a private name from a public module, a
    submodule of a public module that is not public itself, importlib's import, a private attribute;
    and not the public API."""
    path = tmp_path / "m.py"
    path.write_text("import ray\nfrom flwr.app import Context\nfrom ray import tune\nfrom flwr.common import EventType\n"
                    "def f():\n    from flwr.superlink.grid import InMemoryGrid\n    from ray import _raylet\n"
                    "    from flwr.common import config\n    importlib.import_module('flwr.supercore.run')\n"
                    "    return ray._private.worker\n")
    assert [hit.split(" ", 1)[1] for hit in upstream_internals(path)] == [
        "flwr.superlink.grid", "ray._raylet", "flwr.common.config", "flwr.supercore.run", "ray._private"]


def test_a_methods_init_passes_its_base_no_keyword_arguments():
    """``FedSuiteStrategy.__init__`` takes the ServerSetup alone, and so does every strategy's: a
    ``**kwargs`` passed on to a base that takes none reads as an option that does not exist."""
    bad = []
    for folder in ("strategies", "clients"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef) and node.name == "__init__" and node.args.kwarg:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} **{node.args.kwarg.arg}")
    assert not bad, f"__init__ taking **kwargs its base does not take: {bad}"


def test_a_test_files_tests_share_one_xdist_worker(request):
    """The suite's speed rests on ``--dist loadgroup``: tests/conftest.py puts each file's tests in
    one group, so they run on one worker and share its cache of simulations. With pytest 9.2 and
    xdist 3.8 the grouping is silently lost (pytest-xdist#1386); this fails instead."""
    if not hasattr(request.config, "workerinput"):
        pytest.skip("not run by an xdist worker")
    assert request.config.getvalue("loadgroup"), "the suite runs with --dist loadgroup (pyproject addopts)"
    assert request.node.nodeid.endswith("@test_architecture"), request.node.nodeid



def test_reading_configs_and_records_loads_neither_torch_nor_flower():
    """``fedsuite report`` and every reader of a run's folder import ``fedsuite.config`` and
    ``fedsuite.records.results``; neither needs torch or Flower, whose imports took most of ``fedsuite
    report``'s time (benchmarks/README.md). A fresh interpreter shows what an import pulls in; the
    registry imports the plug-ins and the methods (torch) only when asked for them."""
    import subprocess
    import sys

    code = ("import sys, fedsuite.config, fedsuite.records.results, fedsuite.method.registry; "
            "print(sorted(m for m in ('torch', 'flwr', 'ray', 'fedsuite.method.plugins', 'strategies') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_reproduce_help_lists_every_target_without_building_one():
    """``fedsuite reproduce --help`` lists the targets by name (``target_names``: the tables' keys),
    the names ``load_targets`` builds, and builds none: the help imports neither torch, Flower nor
    the methods, which building a target's configs needs (3-4 s of a help; benchmarks/README.md)."""
    import subprocess
    import sys

    from fedsuite.queues.reproduce.tables import load_targets

    code = ("import sys; from fedsuite.cli.options import reproduce_targets; print(' '.join(reproduce_targets())); "
            "print(sorted(m for m in ('torch', 'flwr', 'ray', 'fedsuite.method.plugins', 'strategies') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    names, imported = out.stdout.splitlines()
    assert names.split() == [*sorted(load_targets()), "list"]
    assert imported == "[]", imported
