"""The house's layering, read from the source: the packages of src/recscale import each other
without a cycle, and the library never imports Kedro or MLflow."""

import ast
from pathlib import Path

from tests.conftest import PROJECT_ROOT

SRC = PROJECT_ROOT / "src" / "recscale"
LIBRARY = ("comm", "data", "distributed", "embedding", "evaluate", "model", "optim", "retrain",
           "sharding", "train")
# the house's direction (docs/architecture.md): what each library package may import
ALLOWED = {
    "comm": set(),
    "data": {"evaluate"},  # the synthetic generator's oracle AUC (evaluate is a leaf)
    "distributed": set(),
    "embedding": {"comm", "data", "sharding"},
    "evaluate": set(),
    "model": {"data", "embedding"},
    "optim": {"data", "distributed"},  # the HF job configs name their data blocks
    "retrain": {"data", "evaluate", "model", "sharding", "train"},
    "sharding": {"comm"},
    # optim: Hessian-free as the DLRM's dense optimizer (train.dense_optimizer.name)
    "train": {"comm", "data", "distributed", "embedding", "evaluate", "model", "optim",
              "sharding"},
}


def _imports(path: Path, package: list[str]) -> set[str]:
    """Absolute module names ``path`` imports (relative imports resolved against ``package``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                out.add(".".join(base + ([node.module] if node.module else [])))
            else:
                out.add(node.module or "")
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
