"""The import graph of fedsuite/, strategies/ and clients/ (docs/DESIGN.md, "Packages and the direction of imports").

Every import statement counts, wherever it stands (module level, inside a function, under
``if TYPE_CHECKING:``): a cycle hidden in a function body is still a cycle.

* the engine (``fedsuite``) imports neither ``strategies`` nor ``clients``; the one exception is
  the registry's discovery, which imports the ``strategies`` package to list its modules;
* client rules never import server rules;
* ``strategies/`` and ``clients/`` import only the engine's contract modules (:data:`CONTRACT`);
* there is no import cycle among the modules of the three packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedsuite", "strategies", "clients")
#: (importer, imported) pairs allowed to point from the engine into the method packages
DISCOVERY = {("fedsuite.registry", "strategies")}
#: the engine modules a method may import: the strategy base and what it hands a server rule, the
#: client-rule base and its loop, the wire format, array maths and the server optimisers' steps,
#: seeding, the batch conversion of the data layer, the config base, the registry and the activity
#: measures' contract (a method declares its distinguishing component there). Never the apps, the
#: launcher or the runtime: a method that needs something of the run gets it through ServerSetup or
#: LocalTask.
CONTRACT = {"fedsuite.strategy", "fedsuite.rounds", "fedsuite.training", "fedsuite.wire", "fedsuite.arrays",
            "fedsuite.server_opt", "fedsuite.seeding", "fedsuite.data", "fedsuite.params", "fedsuite.registry",
            "fedsuite.activity"}


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


def test_methods_import_only_the_engines_contract_modules():
    bad = sorted((src, dst) for src, dsts in graph().items() if src.split(".")[0] in ("strategies", "clients")
                 for dst in dsts if dst.split(".")[0] == "fedsuite" and dst not in CONTRACT)
    assert not bad, f"method code imports engine modules outside the contract: {bad}"


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
    ``fedsuite.results``; neither needs torch or Flower, whose imports took most of ``fedsuite
    report``'s time (benchmarks/README.md). A fresh interpreter shows what an import pulls in; the
    registry imports the plug-ins and the methods (torch) only when asked for them."""
    import subprocess
    import sys

    code = ("import sys, fedsuite.config, fedsuite.results, fedsuite.registry; "
            "print(sorted(m for m in ('torch', 'flwr', 'ray', 'fedsuite.plugins', 'strategies') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_reproduce_help_lists_every_target_without_building_one():
    """``fedsuite reproduce --help`` lists the targets by name (``target_names``: the tables' keys),
    the names ``load_targets`` builds, and builds none: the help imports neither torch, Flower nor
    the methods, which building a target's configs needs (3-4 s of a help; benchmarks/README.md)."""
    import subprocess
    import sys

    from fedsuite.reproduce.tables import load_targets

    code = ("import sys; from fedsuite.cli import reproduce_targets; print(' '.join(reproduce_targets())); "
            "print(sorted(m for m in ('torch', 'flwr', 'ray', 'fedsuite.plugins', 'strategies') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    names, imported = out.stdout.splitlines()
    assert names.split() == [*sorted(load_targets()), "list"]
    assert imported == "[]", imported
