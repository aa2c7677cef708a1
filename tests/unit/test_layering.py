"""The house's layering, read from the source: the packages of src/recscale import each other
without a cycle and only in the directions the house allows (docs/architecture.md), the modules
of one package import each other without a cycle, the cost model's measurement is imported only
by the pipelines and the CLI, and the library never imports Kedro or MLflow. Imports under
``if TYPE_CHECKING:`` are annotations, not imports, and do not count."""

import ast
import sys
from pathlib import Path

from tests.conftest import PROJECT_ROOT

SRC = PROJECT_ROOT / "src" / "recscale"
LIBRARY = ("comm", "data", "distributed", "embedding", "evaluate", "hf", "measure", "model", "optim",
           "report", "retrain", "runconfig", "scoring", "sharding", "train")
# the house's direction (docs/architecture.md): what each library package may import
ALLOWED = {
    "comm": set(),
    "data": set(),  # the generators write the true probabilities; their AUC is evaluate's
    "distributed": set(),
    "embedding": {"comm", "data", "sharding"},
    "evaluate": set(),
    "hf": {"data", "distributed", "optim"},  # the MNIST / spoken-digit application
    # the machine's measurement runs the runtime's pieces and training steps
    "measure": {"comm", "data", "distributed", "embedding", "model", "report", "runconfig",
                "sharding", "train"},
    "model": {"data", "embedding", "sharding"},  # sharding: the dense arch as the cost model sees it
    "optim": set(),
    "report": {"embedding", "model", "sharding"},
    "retrain": {"data", "evaluate", "model", "runconfig", "scoring", "sharding", "train"},
    # the root config puts every package's block together (and resolves the model and the plan)
    "runconfig": {"comm", "data", "distributed", "embedding", "evaluate", "model", "optim",
                  "sharding"},
    "scoring": {"data", "evaluate", "model"},
    "sharding": {"comm"},
    # optim: Hessian-free as the DLRM's dense optimizer (train.dense_optimizer.name); evaluate:
    # the validation points' metrics (train.validation)
    "train": {"comm", "data", "distributed", "embedding", "evaluate", "model", "optim", "report",
              "runconfig", "sharding"},
    # the study's trials train and score through the run's own code (Optuna, no Kedro or MLflow)
    "tune": {"runconfig", "scoring", "train"},
}
# the measurement is a tool the pipelines and ``recscale calibrate`` call, not a library layer
ONLY_FROM_OUTSIDE_THE_LIBRARY = {"measure"}


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (annotations only: never imported)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for child in node.body for n in ast.walk(child))
    return out


def _imports(path: Path, package: list[str], names: bool = False) -> set[str]:
    """Absolute module names ``path`` imports, at its top or inside a function (relative imports
    resolved against ``package``); ``names``: also ``module.name`` for every ``from module
    import name`` (a name may be a submodule)."""
    out = set()
    tree = ast.parse(path.read_text())
    skip = _type_checking_blocks(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            if names:
                out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def package_graph() -> dict[str, dict[str, set[str]]]:
    """{package: {imported package: files that import it}} over src/recscale's sub-packages."""
    graph: dict[str, dict[str, set[str]]] = {}
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).parts
        if len(rel) < 2:  # top-level modules (config.py, progress.py ...) belong to no package
            continue
        src = rel[0]
        for name in _imports(path, ["recscale", *rel[:-1]]):
            parts = name.split(".")
            if len(parts) >= 2 and parts[0] == "recscale" and parts[1] in packages \
                    and parts[1] != src:
                graph.setdefault(src, {}).setdefault(parts[1], set()).add(str(path.relative_to(SRC)))
    return graph


def module_graphs() -> dict[str, dict[str, dict[str, set[str]]]]:
    """Per package: {module: {module of the same package it imports: {the importing file}}}
    (the package's ``__init__`` left out: it only re-exports)."""
    modules = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        if parts[-1] != "__init__":
            modules[".".join(parts)] = path
    graphs: dict[str, dict[str, dict[str, set[str]]]] = {}
    for name, path in modules.items():
        package = name.rsplit(".", 1)[0]
        for other in _imports(path, package.split("."), names=True):
            if other in modules and other != name and other.rsplit(".", 1)[0] == package:
                graphs.setdefault(package, {}).setdefault(name, {}).setdefault(
                    other, set()).add(str(path.relative_to(SRC)))
    return graphs


def find_cycle(graph: dict[str, dict[str, set[str]]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(n: str, stack: list[str]) -> list[str] | None:
        state[n] = 1
        for m in sorted(graph.get(n, {})):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (cyc := visit(m, stack + [m])):
                return cyc
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (cyc := visit(n, [n])):
            return cyc
    return None


def test_the_package_import_graph_has_no_cycle():
    graph = package_graph()
    cycle = find_cycle(graph)
    where = "" if cycle is None else "; ".join(
        f"{a} -> {b} in {sorted(graph[a][b])[0]}" for a, b in zip(cycle, cycle[1:]))
    assert cycle is None, f"import cycle {' -> '.join(cycle)}: {where}"


def test_the_modules_of_each_package_import_each_other_without_a_cycle():
    bad = {}
    for package, graph in sorted(module_graphs().items()):
        if (cycle := find_cycle(graph)) is not None:
            bad[package] = " -> ".join(m.rsplit(".", 1)[1] for m in cycle)
    assert not bad, f"module import cycles: {bad}"


def test_a_module_cycle_is_found_inside_a_package(tmp_path, monkeypatch):
    """The module check sees a cycle made by a function's import (as ``recscale.train.api`` and
    ``recscale.train.sharded`` once imported each other), not one under TYPE_CHECKING."""
    pkg = tmp_path / "recscale" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from recscale.pkg.b import g\n")
    (pkg / "b.py").write_text("def g():\n    from recscale.pkg import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from recscale.pkg.a import x\n")
    (pkg / "d.py").write_text("from recscale.pkg.c import y\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path / "recscale")
    graph = module_graphs()["recscale.pkg"]
    assert find_cycle(graph) == ["recscale.pkg.a", "recscale.pkg.b", "recscale.pkg.a"]
    assert "recscale.pkg.c" not in graph and graph["recscale.pkg.d"].keys() == {"recscale.pkg.c"}


def test_the_cost_models_measurement_is_imported_only_by_the_pipelines_and_the_cli():
    graph = package_graph()
    bad = [f"{a} -> {b} ({sorted(files)[0]})" for a in LIBRARY
           for b, files in graph.get(a, {}).items() if b in ONLY_FROM_OUTSIDE_THE_LIBRARY]
    assert not bad, bad
    users = {a for a, deps in graph.items() if "measure" in deps}
    assert users <= {"pipelines"}, users


def test_train_holds_the_loop_runtimes_steps_checkpoints_jobs_and_entry_point_only():
    """``train/`` by job (its ``__init__`` says which module is which), no module of it over
    about 400 lines."""
    allowed = {"__init__", "entry", "loop", "overlap", "faults", "runtime", "step", "hf_step",
               "checkpoint", "checkpoint_files", "rank", "job_worker", "validation", "average",
               "result"}
    found = {p.stem for p in (SRC / "train").glob("*.py")}
    assert found <= allowed, sorted(found - allowed)
    doc = (SRC / "train" / "__init__.py").read_text()
    assert all(f"``{m}.py``" in doc for m in found - {"__init__"}), "train/__init__ names them"
    long = {p.name: n for p in (SRC / "train").glob("*.py")
            if (n := len(p.read_text().splitlines())) > 420}
    assert not long, long


def test_each_library_package_imports_only_what_the_house_allows():
    graph = package_graph()
    bad = [f"{a} -> {b} ({sorted(files)[0]})" for a in LIBRARY
           for b, files in graph.get(a, {}).items() if b not in ALLOWED[a]]
    assert not bad, bad


def test_no_private_name_is_imported_from_another_package():
    bad = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).parts
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("recscale."):
                private = [a.name for a in node.names if a.name.startswith("_")]
                other = node.module.split(".")[1]
                if private and (len(rel) < 2 or other != rel[0]):
                    bad.append(f"{path.relative_to(SRC)}: from {node.module} import {private}")
    assert not bad, bad


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b": {"a/x.py"}}, "b": {"c": {"b/y.py"}}, "c": {"a": {"c/z.py"}}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    del graph["c"]["a"]
    assert find_cycle(graph) is None


def test_the_library_never_imports_kedro_or_mlflow():
    bad = []
    for pkg in LIBRARY:
        for path in (SRC / pkg).rglob("*.py"):
            rel = path.relative_to(SRC).parts
            for name in _imports(path, ["recscale", *rel[:-1]]):
                if name.split(".")[0] in ("kedro", "kedro_datasets", "kedro_mlflow", "mlflow"):
                    bad.append(f"{path.relative_to(SRC)} imports {name}")
    assert not bad, bad
