"""The import graph of bertflow's own code, read with `ast` (nothing is imported): no import
circles among `tasks` modules or among the benchmarks' modules, no module imports a layer
above its own, and each benchmarks/ folder imports only what it may (BENCH_FOLDER_IMPORTS).
Each failure names the modules and the import (the edge) to remove.

Every `import` statement in a module's source counts, wherever it stands:
- at module level;
- inside a function or method: a lazy import only delays a circle to run time;
- under `if TYPE_CHECKING:`: it never runs, but the module still depends on the other's names
  (type checkers, `typing.get_type_hints` and readers follow it), and issue 47's remaining
  circles were of this kind. Declare what a module needs of a higher one as a Protocol
  beside it instead.
Not seen: code in strings (`python -c`), `importlib` calls, and the package `__init__` that
importing a submodule runs first (none of bertflow's imports a bertflow module:
test_package_inits_import_nothing_of_bertflow checks it).

Layers, lowest first (a module may import its own layer and those below):

    tasks (the package: environment and version), tasks.errors
    tasks.io            storage, URIs, readers, credentials: no config, no steps
    tasks.topology, tasks.task_kinds, tasks.class_weights, tasks.thresholds
    tasks.config, tasks.score_config
    tasks.params_doc, tasks.params_form
    tasks.model         encoder, layers, tokenizer and word-piece aligner, CPU kernels
    tasks.runs          run layout, manifests, summaries
    tasks.scoring       a batch-scoring run's plan, shard records and publication
    tasks.training, tasks.gate
                        strategy, plan and AdamW, inputs, checkpoints; the gate's statistics
    tasks.provision     worker backends (controller side)
    tasks.steps         one module per CLI step
    tasks.__main__      the CLI
    bertflow_airflow    the Airflow side
    dags/, plugins/

tasks.runs sits below tasks.training and tasks.provision below tasks.steps because the code
uses them so: training reads the run layout (checkpoint_sources: the champion's folder), and
the provision and release steps drive the backends.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tasks", "bertflow_airflow")  # importable packages
SCRIPTS = ("dags", "plugins")  # files Airflow loads by path, named "dags/<file>"

LAYERS: list[tuple[str, ...]] = [
    ("tasks", "tasks.errors"),
    ("tasks.io",),
    ("tasks.topology", "tasks.task_kinds", "tasks.class_weights", "tasks.thresholds"),
    ("tasks.config", "tasks.score_config"),
    ("tasks.params_doc", "tasks.params_form"),
    # tasks.model below training (issue 47): it owns the CPU kernels its layers run on and
    # the word-piece aligner beside its tokenizer; training builds and trains it.
    ("tasks.model",),
    ("tasks.runs",),
    ("tasks.scoring",),  # a scoring run's plan, shard records and publication
    # tasks.tracking (MLflow) reads run folders and the exported version's lineage; promote
    # calls it.
    ("tasks.training", "tasks.gate", "tasks.tracking"),
    ("tasks.provision",),
    ("tasks.steps",),
    ("tasks.__main__",),
    ("bertflow_airflow",),
    ("dags", "plugins"),
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}

# Import circles that remain in modules other issues own, each by the import that closes it
# (importer, imported). Delete an entry when its circle is gone; the test says when. None is
# left: issues 31 and 32 removed the last two.
EXPECTED_BACK_EDGES: set[tuple[str, str]] = {
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    if rel.parts[0] in SCRIPTS:
        return "/".join(rel.parts)
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    out = {}
    for top in PACKAGES + SCRIPTS:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "build" not in path.relative_to(ROOT).parts:
                out[_module_name(path)] = path
    return out


SOURCES = _sources()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in SOURCES.items()}


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node anywhere in the tree (see the module's docstring)."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def _own(name: str) -> str | None:
    """The longest bertflow module `name` starts with, or None for other packages."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in SOURCES:
            return candidate
        parts.pop()
    return None


def _targets(module: str, node) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for one import statement."""
    if isinstance(node, ast.Import):
        return [(own, None) for alias in node.names if (own := _own(alias.name))]
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if not SOURCES[module].name == "__init__.py":
            package = package[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    own = _own(base)
    if own is None:
        return []
    out = []
    for alias in node.names:
        if f"{base}.{alias.name}" in SOURCES:  # `from tasks.io import storage`
            out.append((f"{base}.{alias.name}", None))
        else:
            out.append((own, alias.name if own == base else None))
    return out


GRAPH: dict[str, set[str]] = {}
NAMES_TAKEN: list[tuple[str, int, str, str]] = []  # (importer, line, module, name)
for _module, _tree in TREES.items():
    GRAPH[_module] = set()
    for _node in _imports(_tree):
        for _target, _name in _targets(_module, _node):
            if _target != _module:
                GRAPH[_module].add(_target)
            if _name is not None:
                NAMES_TAKEN.append((_module, _node.lineno, _target, _name))

# benchmarks/: scripts run by path with benchmarks/ on the import path (the scripts' own
# folder; the workers' through PYTHONPATH), which import each other as top-level modules
# (`import quality`, `from lib import common`); named "benchmarks/<path without .py>", a
# package by its folder ("benchmarks/lib").
BENCH = ROOT / "benchmarks"
BENCH_SOURCES = {p.relative_to(BENCH).with_suffix("").as_posix().removesuffix("/__init__"): p
                 for p in sorted(BENCH.rglob("*.py"))}


def _bench_target(dotted: str) -> str | None:
    """The benchmarks module `import dotted` loads: the longest that exists, or None."""
    parts = dotted.split(".")
    while parts and "/".join(parts) not in BENCH_SOURCES:
        parts.pop()
    return "/".join(parts) or None


def _bench_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in BENCH_SOURCES.items():
        names = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {_bench_target(alias.name) for alias in node.names}
            elif not node.level and node.module:  # `from lib import common`: lib/common
                names |= {_bench_target(f"{node.module}.{alias.name}") for alias in node.names}
        graph[f"benchmarks/{name}"] = {f"benchmarks/{n}" for n in names
                                       if n is not None and n != name}
    return graph


BENCH_GRAPH = _bench_graph()

# What each benchmarks/ folder may import (benchmarks/README.md): lib/ sits below the scripts
# on top; the workers run by path in a fresh process and take only lib/; the peers run in
# .venv-peer, which has no bertflow for lib/ to import, and take nothing. Nothing imports a
# worker or a peer: they are processes, not modules.
BENCH_FOLDER_IMPORTS = {"lib": {"lib"}, "workers": {"lib"}, "peers": set(),
                        "scripts": {"lib", "scripts"}}


def _bench_folder(module: str) -> str:
    """"benchmarks/lib/common" -> "lib", "benchmarks/quality" -> "scripts" (the top)."""
    parts = module.split("/")
    folder = parts[1] if len(parts) > 2 or parts[1] == "lib" else "scripts"
    if folder not in BENCH_FOLDER_IMPORTS:
        raise AssertionError(f"{module}: benchmarks/{folder}/ has no entry in "
                             "BENCH_FOLDER_IMPORTS (tests/test_imports.py): add one, and the "
                             "folder to benchmarks/README.md")
    return folder


def _bench_folder_report(graph: dict[str, set[str]]) -> list[str]:
    """One line per import a module's folder may not make (BENCH_FOLDER_IMPORTS)."""
    out = []
    for module, targets in graph.items():
        folder = _bench_folder(module)
        allowed = BENCH_FOLDER_IMPORTS[folder]
        shown = f"{folder}/" if folder != "scripts" else folder
        names = ", ".join(sorted(allowed)) or "nothing of benchmarks/"
        out += [f"{module} imports {t} ({shown} may import: {names})"
                for t in targets if _bench_folder(t) not in allowed]
    return sorted(out)


def _unit(module: str) -> str:
    """The layer unit of a module: its entry in LAYERS, the longest that is a prefix."""
    if "/" in module:
        return module.split("/")[0]
    parts = module.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in RANK:
            return candidate
        parts.pop()
    raise AssertionError(f"{module} is in no layer: add it (or its package) to LAYERS in "
                         "tests/test_imports.py, at the level it belongs to")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _a_circle(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest circle through the component's first module: [a, b, ..., a]."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph.get(node, ())):
            if child == start:
                return paths[node] + [start]
            if child in members and child not in paths:
                paths[child] = paths[node] + [child]
                queue.append(child)
    raise AssertionError(f"no circle through {start}")  # a component always has one


def _circle_report(graph: dict[str, set[str]]) -> list[str]:
    """One line per circle: its path (each arrow an import; the last closes it) and, when
    more modules are tangled in, all of them."""
    lines = []
    for component in _cycles(graph):
        path = _a_circle(component, graph)
        line = " -> ".join(path)
        if len(component) > len(path) - 1:
            line += f"  (tangled together: {', '.join(component)})"
        lines.append(line)
    return lines


def _upward_report(graph: dict[str, set[str]]) -> list[str]:
    """One line per import from a lower layer to a higher one (LAYERS)."""
    return sorted(f"{m} imports {t} ({_unit(m)} is below {_unit(t)})"
                  for m, targets in graph.items() for t in targets
                  if RANK[_unit(t)] > RANK[_unit(m)])


def _module_level_names(tree: ast.Module) -> set[str] | None:
    """Names a module binds at its top level (None if it has `import *`)."""
    names: set[str] = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)
    return names


# --- the tests ------------------------------------------------------------------------------
def test_the_graph_sees_the_code():
    """A guard for the parser: the known edges are found."""
    assert "tasks.errors" in GRAPH["tasks.config"]
    assert "tasks.steps.validate" in GRAPH["bertflow_airflow.run_tasks"]  # a function-level import
    assert "tasks.model.token_encoding" in GRAPH["tasks.training.entity_serving"]  # TYPE_CHECKING
    assert len([m for m in SOURCES if m.startswith("tasks.")]) > 50
    assert "benchmarks/lib/common" in BENCH_GRAPH["benchmarks/model_sizes"]
    assert "benchmarks/lib/synthetic_inputs" in BENCH_GRAPH["benchmarks/lib/common"]  # in a def
    assert "benchmarks/quality" in BENCH_GRAPH["benchmarks/class_weights"]
    assert BENCH_GRAPH["benchmarks/workers/_bertflow_train_worker"] == {
        "benchmarks/lib/trainbench_data"}  # `from lib.trainbench_data import train_flops`


def test_every_kind_of_import_is_an_edge():
    """Module level, in a function, under TYPE_CHECKING, relative: all are read."""
    tree = ast.parse("import tasks.errors\n"
                     "from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from tasks.config import RunConfig\n"
                     "def f():\n    from tasks.steps import train\n"
                     "class C:\n    def m(self):\n        from . import uris\n")
    found = {t for node in _imports(tree) for t, _ in _targets("tasks.io.storage", node)}
    assert found == {"tasks.errors", "tasks.config", "tasks.steps.train", "tasks.io.uris"}


def test_the_checks_report_a_circle_and_an_upward_import():
    """The checks can fail: on a made-up graph with a circle and an upward import, each is
    reported with the modules and the import."""
    graph = {"tasks.io.a": {"tasks.steps.b"},  # upward: io is below steps
             "tasks.steps.b": {"tasks.steps.c"},
             "tasks.steps.c": {"tasks.steps.d"},
             "tasks.steps.d": {"tasks.steps.b", "tasks.errors"},  # closes b -> c -> d -> b
             "tasks.errors": set()}
    assert _circle_report(graph) == ["tasks.steps.b -> tasks.steps.c -> tasks.steps.d "
                                     "-> tasks.steps.b"]
    assert _upward_report(graph) == [
        "tasks.io.a imports tasks.steps.b (tasks.io is below tasks.steps)"]
    bench = {"benchmarks/common": {"benchmarks/model_sizes"},
             "benchmarks/model_sizes": {"benchmarks/common", "benchmarks/mfu"},
             "benchmarks/mfu": {"benchmarks/model_sizes"}}
    assert _circle_report(bench) == [
        "benchmarks/common -> benchmarks/model_sizes -> benchmarks/common  (tangled together: "
        "benchmarks/common, benchmarks/mfu, benchmarks/model_sizes)"]
    assert _circle_report({"a": {"b"}, "b": set()}) == []
    folders = {"benchmarks/lib/common": {"benchmarks/quality"},  # lib is below the scripts
               "benchmarks/quality": {"benchmarks/lib/common", "benchmarks/peers/_p"},
               "benchmarks/peers/_p": set()}
    assert _bench_folder_report(folders) == [
        "benchmarks/lib/common imports benchmarks/quality (lib/ may import: lib)",
        "benchmarks/quality imports benchmarks/peers/_p (scripts may import: lib, scripts)"]


def test_no_import_circles_among_tasks_modules():
    graph = {m: {t for t in targets if t.startswith("tasks")
                 and (m, t) not in EXPECTED_BACK_EDGES}
             for m, targets in GRAPH.items() if m.startswith("tasks")}
    circles = _circle_report(graph)
    assert not circles, (
        "import circles (each arrow an import; the last one closes the circle); move what "
        "both sides need into a module below them:\n" + "\n".join(circles))


def test_no_import_circles_among_benchmark_modules():
    """A circle among benchmarks/ modules (common.py <-> model_sizes.py until issue 47) means
    a helper lives in the wrong file, even within one folder."""
    circles = _circle_report(BENCH_GRAPH)
    assert not circles, (
        "import circles among benchmarks/ modules; move what both sides need into a module "
        "below them (as benchmarks/lib/synthetic_inputs.py):\n" + "\n".join(circles))


def test_benchmark_modules_import_only_what_their_folder_may():
    bad = _bench_folder_report(BENCH_GRAPH)
    assert not bad, ("imports across benchmarks/ folders (BENCH_FOLDER_IMPORTS, "
                     "benchmarks/README.md); move what is shared into benchmarks/lib/:\n"
                     + "\n".join(bad))


@pytest.mark.parametrize("edge", sorted(EXPECTED_BACK_EDGES), ids="->".join)
def test_each_expected_circle_is_still_there(edge):
    importer, imported = edge
    assert imported in GRAPH.get(importer, ()), (
        f"{importer} no longer imports {imported}: delete the entry from EXPECTED_BACK_EDGES "
        "in tests/test_imports.py")
    graph = {m: {t for t in GRAPH[m] if t.startswith("tasks")} for m in GRAPH
             if m.startswith("tasks")}
    assert any(importer in c and imported in c for c in _cycles(graph)), (
        f"{importer} -> {imported} closes no circle any more: delete it from "
        "EXPECTED_BACK_EDGES in tests/test_imports.py")


def test_no_module_imports_a_layer_above_its_own():
    upward = _upward_report(GRAPH)
    assert not upward, ("imports that run up the layers (see this file's docstring); move "
                        "what the lower module needs down, or declare it there as a "
                        "Protocol:\n" + "\n".join(upward))


@pytest.mark.parametrize("low, forbidden", [
    ("tasks.io", ("tasks.config", "tasks.steps", "tasks.training", "tasks.runs",
                  "tasks.provision")),
    ("tasks.model", ("tasks.training", "tasks.steps", "tasks.runs", "tasks.provision")),
    ("tasks.training", ("tasks.steps",)),
    ("tasks.runs", ("tasks.steps",)),
    ("tasks", ("bertflow_airflow", "dags", "plugins")),
])
def test_named_rules(low, forbidden):
    """The rules the layers imply that matter most, spelled out."""
    bad = sorted(f"{m} imports {t}" for m, targets in GRAPH.items() for t in targets
                 if (m == low or m.startswith(low + ".")) and t.startswith(forbidden))
    assert not bad, "\n".join(bad)


def test_imported_names_exist():
    """`from tasks.x import name` names something tasks/x.py defines, also in imports inside
    functions that a test may never run (a moved function leaves no stale import behind)."""
    defined = {m: _module_level_names(TREES[m]) for m in TREES}
    missing = [f"{importer}:{line} takes {name} from {module}"
               for importer, line, module, name in NAMES_TAKEN
               if defined[module] is not None and name not in defined[module]]
    assert not missing, "\n".join(missing)


def test_package_inits_import_nothing_of_bertflow():
    """Importing tasks.x.y runs tasks/x/__init__.py first, an edge the graph leaves out: it
    holds only while the package inits import no bertflow module."""
    bad = sorted(f"{m} imports {', '.join(sorted(GRAPH[m]))}" for m, path in SOURCES.items()
                 if path.name == "__init__.py" and GRAPH[m])
    assert not bad, "\n".join(bad)


def test_tasks_imports_no_airflow_at_module_level():
    """tasks/ runs in worker images without Airflow: only a function may import it (to read
    a connection)."""
    bad = []
    for module, tree in TREES.items():
        if not module.startswith("tasks"):
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""])
                bad += [f"{module}:{node.lineno}" for n in names
                        if n == "airflow" or n.startswith("airflow.")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("folder", ["dags", "plugins", "benchmarks"])
def test_no_sys_path_edits(folder):
    """The package is installed (pyproject.toml, `make install`): DAGs, the plugin and the
    benchmarks import it as any installed package."""
    edits = [f"{path.relative_to(ROOT)}:{number}"
             for path in sorted((ROOT / folder).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if "sys.path" in line]  # in code run as a string too
    assert not edits, "\n".join(edits)
