"""Every ```python block of docs/*.md runs as written from a project root: here, each one that
needs nothing but the project (in a fresh copy of it, so files it writes land there); the ones
in ``tests.doc_snippets.ELSEWHERE`` (a finished kedro run, root) in the test named beside each."""

import ast

import pytest
import yaml

from tests.conftest import PROJECT_ROOT
from tests.doc_snippets import ELSEWHERE, elsewhere, python_blocks, run_snippet, snippets
from tests.e2e.project import make_project_copy

HERE = [s for s in snippets()
        if not any(s.doc == doc and marker in s.code for doc, marker, _ in ELSEWHERE.values())]


@pytest.mark.parametrize("snippet", HERE, ids=[s.where for s in HERE])
def test_the_docs_python_snippet_runs_as_written_from_a_project_root(snippet, tmp_path):
    # one torch thread: `make test` runs two of these at once on 2 cores, where a second thread
    # waiting on a busy core made the Hessian-free snippet's step 100x slower (3 s, not 30 ms)
    run_snippet(snippet, cwd=make_project_copy(tmp_path), timeout=120,
                env={"OMP_NUM_THREADS": "1"})


def _calls_naming(func: ast.AST, name: str) -> bool:
    """Whether ``func`` calls ``run_snippet`` or ``elsewhere`` with the string ``name``."""
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None))
               in ("run_snippet", "elsewhere")
               and any(isinstance(a, ast.Constant) and a.value == name for a in n.args)
               for n in ast.walk(func))


def test_every_python_snippet_in_docs_is_run_by_a_test():
    """Each block runs above, or is ELSEWHERE's (matched by exactly one block) and the test named
    there runs it by its name; so a new snippet cannot go untested."""
    every = snippets()
    assert len(set(every)) == len(every)
    skipped = {elsewhere(name) for name in ELSEWHERE}  # each names exactly one snippet
    assert len(skipped) == len(ELSEWHERE), "two ELSEWHERE entries name the same snippet"
    assert set(HERE) | skipped == set(every) and not set(HERE) & skipped
    for name, (_, _, test) in ELSEWHERE.items():
        path, func_name = test.split("::")
        tree = ast.parse((PROJECT_ROOT / path).read_text())
        funcs = [n for n in ast.walk(tree)
                 if isinstance(n, ast.FunctionDef) and n.name == func_name]
        assert funcs, f"ELSEWHERE[{name!r}] names {test}, which does not exist"
        assert _calls_naming(funcs[0], name), f"{test} does not run the snippet {name!r}"


def test_the_parser_finds_python_fences_as_markdown_does():
    text = "\n".join([
        "# t", "```python", "a = 1", "```",                # line 2
        "```bash", "echo no", "```",
        "- item", "", "  ~~~py", "  b = 2", "  ~~~",       # line 10: in a list item
        "", "text", "",
        "    ```python", "    an indented code block, not a fence", "    ```",
        "<!--", "```python", "in an HTML comment", "```", "-->",
        "````Python title", "c = '```'", "````",          # line 24
    ])
    assert python_blocks(text) == [(2, "a = 1\n"), (10, "b = 2\n"), (24, "c = '```'\n")]


def test_snippets_that_use_mlflow_read_the_projects_store():
    """A snippet that imports MLflow sets the store `kedro run` writes to (conf/base/mlflow.yml),
    so it does not look in MLflow's default, a new ./mlflow.db."""
    conf = yaml.safe_load((PROJECT_ROOT / "conf/base/mlflow.yml").read_text())
    store = conf["server"]["mlflow_tracking_uri"]
    users = [s for s in snippets() if "import mlflow" in s.code]
    assert users  # docs/serving.md's
    for s in users:
        uris = [n.args[0].value for n in ast.walk(ast.parse(s.code))
                if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "set_tracking_uri"
                and n.args and isinstance(n.args[0], ast.Constant)]
        assert uris == [store], f"{s.where}: sets the tracking URI {uris}, expected [{store!r}]"
