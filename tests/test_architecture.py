"""The layout rules of README's Architecture section, checked on the source (AST), so that a change
that breaks one fails here: Prefect only in flows/, no import cycle, only `quipu.*` imports, nothing
named `flows` or `tasks` installed, and one config block per stage of the pipeline definition."""
from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ["flows", "tasks", "trainer", "catalog", "demo"]


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = "quipu." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def imports(path: Path) -> list[str]:
    """Every module name an import statement in `path` names, at any depth (function-level too)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for m, path in mods.items():
        for n in imports(path):
            while n and n not in mods:
                n = n.rpartition(".")[0]
            if n and n != m and n != "quipu":
                graph[m].add(n)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))
    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_prefect_only_in_flows_and_demo():
    offenders = [m for m, p in modules().items() if m.split(".")[1] in ("tasks", "trainer", "catalog")
                 and any(n.split(".")[0] == "prefect" for n in imports(p))]
    assert offenders == []


def test_catalog_imports_neither_tasks_nor_flows():
    graph = import_graph()
    assert {(m, n) for m in graph if m.startswith("quipu.catalog") for n in graph[m]
            if not n.startswith("quipu.catalog")} == set()


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_a_cycle_is_found():
    """The check itself: a two-module cycle is reported."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_only_namespaced_imports():
    """In the package and in tests/ and bench/ too: a bare `import tasks` works from the repository
    root and would load a second copy of a module next to `quipu.tasks`."""
    files = [*modules().values(), *sorted((ROOT / "tests").glob("*.py")), *sorted((ROOT / "bench").glob("*.py"))]
    bare = [(str(p.relative_to(ROOT)), n) for p in files for n in imports(p) if n.split(".")[0] in PACKAGES]
    assert bare == []


def test_nothing_named_flows_or_tasks_is_installed(tmp_path):
    code = ("import importlib.util as u, quipu.tasks.stage; "
            "print([n for n in ('flows', 'tasks', 'trainer', 'catalog', 'demo') if u.find_spec(n)])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_stage_has_its_config_block():
    from quipu.flows.curate import CurateConfig
    from quipu.tasks.pipeline import STAGES
    names = [s.name for s in STAGES]
    assert len(set(names)) == len(names)
    for s in STAGES:
        assert CurateConfig.model_fields[s.name].annotation is s.Config
        assert s.Config().batch_rows > 0 and hasattr(s.Config(), "enabled")
