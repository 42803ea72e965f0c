"""The layout rules of the Architecture page (docs/architecture.md), checked on the source (AST), so that a change
that breaks one fails here: every import points down the drawn layers (catalog < scoring < tasks <
trainer < synthetic < flows < demo; the one way up is `quipu demo`, flows/cli.py -> demo/run.py),
Prefect only in flows/ and demo/, no import cycle, only `quipu.*` imports, nothing named `flows` or
`tasks` installed, one config block per stage of the pipeline definition, nothing below flows/
imports the pipeline definition, and every `python -m` / `torchrun -m` command the docs show names
a module that exists once installed."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

from tests.conftest import ROOT

# the layers, bottom up: a module imports only from a lower layer or its own package
# (docs/architecture.md draws them)
LAYERS = {"catalog": 0, "scoring": 1, "tasks": 2, "trainer": 3, "synthetic": 4, "flows": 5, "demo": 6}
# the one import up the layers: the `quipu demo` command runs the demo's steps, which compose flows
UPHILL = {("quipu.flows.cli", "quipu.demo"), ("quipu.flows.cli", "quipu.demo.run")}


def installed_folders() -> dict[str, str]:
    """Top-level `quipu.*` package -> its folder, as pyproject.toml installs them."""
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name.removeprefix("quipu."): folder for name, folder in dirs.items()}


PACKAGES = sorted(installed_folders().values())


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
    # a graph that lost the repository (a moved folder, a parser that finds nothing) passes every
    # rule below: it must hold the modules and the edges every reader of this code knows are there
    assert len(mods) >= 50 and sum(len(v) for v in graph.values()) >= 100, (len(mods), len(graph))
    assert {"quipu.tasks.stage", "quipu.catalog.files"} <= graph["quipu.flows.curate"] | graph["quipu.tasks.extract"]
    assert any(n.startswith("quipu.catalog") for n in graph["quipu.catalog.ownership"] | graph["quipu.catalog.registry"])
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


def layer(module: str) -> int:
    return LAYERS[module.split(".")[1]]


def uphill_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a module into another package at its own layer or above, `UPHILL` aside."""
    return sorted((m, n) for m, deps in graph.items() for n in deps
                  if m.split(".")[1] != n.split(".")[1] and layer(n) >= layer(m) and (m, n) not in UPHILL)


def test_the_layer_map_covers_every_installed_package():
    folders = installed_folders()
    assert folders == {name: name for name in folders}    # package quipu.X is the folder X/
    assert sorted(LAYERS) == sorted(folders)
    assert {"scoring", "synthetic"} <= set(LAYERS)


def test_every_import_points_down():
    graph = import_graph()
    edges = {(m.split(".")[1], n.split(".")[1]) for m, deps in graph.items() for n in deps}
    # the check sees the edges it is about: stages load models, training reads curated text
    assert {("tasks", "scoring"), ("trainer", "scoring"), ("trainer", "tasks"), ("flows", "synthetic")} <= edges
    assert uphill_imports(graph) == []


def test_an_uphill_import_is_found():
    """tasks -> trainer, flows -> demo (other than the demo command), scoring -> tasks are each reported."""
    graph = {"quipu.tasks.quality": {"quipu.trainer.models", "quipu.scoring.resolver"},
             "quipu.flows.ablate": {"quipu.demo.corpus", "quipu.synthetic.ablate_mix"},
             "quipu.flows.cli": {"quipu.demo.run", "quipu.demo"},
             "quipu.scoring.model_files": {"quipu.tasks.child_worker", "quipu.catalog.processes"}}
    assert uphill_imports(graph) == [("quipu.flows.ablate", "quipu.demo.corpus"),
                                     ("quipu.scoring.model_files", "quipu.tasks.child_worker"),
                                     ("quipu.tasks.quality", "quipu.trainer.models")]


def test_the_worker_image_copies_every_package():
    dockerfile = (ROOT / "deploy" / "Dockerfile.worker").read_text()
    assert [f for f in PACKAGES if f"COPY {f} {f}\n" not in dockerfile] == []


def test_prefect_only_in_flows_and_demo():
    uses_prefect = {m for m, p in modules().items() if any(n.split(".")[0] == "prefect" for n in imports(p))}
    assert {"quipu.flows.curate", "quipu.flows.deploy"} <= uses_prefect   # the check sees imports at all
    assert [m for m in uses_prefect if layer(m) < LAYERS["flows"]] == []


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
            f"print([n for n in {PACKAGES!r} if u.find_spec(n)])")
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


# ---- the pipeline definition is the top of tasks/ --------------------------------------------

PIPELINE = "quipu.tasks.pipeline"
# tasks/pipeline.py lists the stages; the driver and every stage get a stage from the reference
# they are handed, so a stage that is not listed there still runs and the driver is testable alone
def pipeline_importers(graph: dict[str, set[str]]) -> set[str]:
    """Modules below flows/ that import the pipeline definition (flows/ and demo/ compose the
    pipeline: they may)."""
    return {m for m, deps in graph.items() if PIPELINE in deps and layer(m) < LAYERS["flows"]}


def test_nothing_below_flows_imports_the_pipeline():
    assert sorted(pipeline_importers(import_graph())) == []


def test_a_pipeline_import_below_flows_is_found():
    graph = {"quipu.tasks.dedup": {PIPELINE}, "quipu.flows.curate": {PIPELINE}, PIPELINE: {"quipu.tasks.dedup"}}
    assert pipeline_importers(graph) == {"quipu.tasks.dedup"}


# ---- the reader wing (tasks/reading/): formats in a table, below the stages ---------------------

READING = "quipu.tasks.reading"
# what the wing may import: itself, the stage contract and driver (a long document's parts are kept
# phase results), the child process runner, the language table (OCR's languages) and catalog
READING_MAY_IMPORT = (READING, "quipu.tasks.stage", "quipu.tasks.driver", "quipu.tasks.child_worker",
                      "quipu.tasks.languages", "quipu.catalog")


def test_the_reader_wing_imports_no_stage():
    graph = import_graph()
    wing = {m: graph.get(m, set()) for m in modules() if m == READING or m.startswith(READING + ".")}
    assert len(wing) >= 10, sorted(wing)
    assert {m: sorted(d for d in deps if not d.startswith(READING_MAY_IMPORT))
            for m, deps in wing.items() if any(not d.startswith(READING_MAY_IMPORT) for d in deps)} == {}


def test_every_format_is_one_module_and_one_row():
    from quipu.tasks.reading.formats import FORMATS
    assert [f.read.__module__.rpartition(".")[0] for f in FORMATS] == [READING] * len(FORMATS)
    assert all(f.read.__name__ == "read_file" for f in FORMATS)
    assert len({f.kind for f in FORMATS}) == len({f.read.__module__ for f in FORMATS}) == len(FORMATS)
    suffixes = [s for f in FORMATS for s in f.suffixes]
    assert len(suffixes) == len(set(suffixes)) and all(s.startswith(".") and s == s.lower() for s in suffixes)


# ---- module commands in the docs ---------------------------------------------------------------

MODULE_COMMAND = re.compile(r"\b(?:python[\d.]*|torchrun)\b[^\n`|\"']*?\s-m\s+([A-Za-z_][\w.]*)")


def module_commands(text: str) -> list[str]:
    """The module of every `python -m X` / `torchrun [options] -m X` in `text`."""
    return [m.group(1).rstrip(".") for m in MODULE_COMMAND.finditer(text)]


def missing_modules(names: list[str], cwd: Path) -> list[str]:
    """The names no installed module answers to, looked up (`find_spec`: the module is not run)
    from `cwd`, a folder outside the checkout, as a user's shell would."""
    code = ("import importlib.util, json, sys\n"
            "def found(n):\n"
            "    try:\n        return importlib.util.find_spec(n) is not None\n"
            "    except ImportError:\n        return False\n"
            "print(json.dumps([n for n in sys.argv[1:] if not found(n)]))")
    out = subprocess.run([sys.executable, "-c", code, *names], cwd=cwd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_every_module_command_in_the_docs_names_an_installed_module(tmp_path):
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *modules().values(), *sorted((ROOT / "bench").glob("*.py"))]
    found = {(str(p.relative_to(ROOT)), n) for p in sources for n in module_commands(p.read_text())}
    assert any(n == "quipu.flows.train_dist" for _, n in found)    # the scan sees the docs' torchrun lines
    missing = set(missing_modules(sorted({n for _, n in found}), tmp_path))
    assert sorted((p, n) for p, n in found if n in missing) == []


def test_a_command_naming_a_checkout_folder_is_found(tmp_path):
    """`-m flows.train_dist` works in the checkout only: outside it, no module answers."""
    text = "run `torchrun --nproc_per_node 2 -m flows.train_dist CONFIG` or\n    python3 -m quipu.flows.cli curate"
    assert module_commands(text) == ["flows.train_dist", "quipu.flows.cli"]
    assert missing_modules(module_commands(text), tmp_path) == ["flows.train_dist"]


def test_one_fasttext_loader():
    """fastText files are loaded in one place, `quipu.scoring.model_files.load_fasttext` (checked in a
    child first, then loaded): the language-ID model and every classifier of the family go through it."""
    def loads(path: Path) -> bool:
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "load_model"
                   and isinstance(n.func.value, ast.Name) and n.func.value.id == "fasttext"
                   for n in ast.walk(ast.parse(path.read_text())))
    assert sorted(name for name, path in modules().items() if loads(path)) == ["quipu.scoring.model_files"]
