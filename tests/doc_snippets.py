"""The ```python blocks of docs/*.md, found by parsing the markdown, and running one as a user
would: as written, in a fresh interpreter, from a project root.

Most snippets run in tests/unit/test_docs_snippets.py. The ones that need what a unit test cannot
have (a finished ``kedro run``, root) are listed in ``ELSEWHERE`` with the test that runs them;
tests/unit/test_docs_snippets.py checks that every block is one or the other.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt  # CommonMark; it comes with Kedro (through rich)

from tests.conftest import PROJECT_ROOT

DOCS = PROJECT_ROOT / "docs"
PYTHON = {"python", "py", "python3"}  # a fence's language that makes it a Python snippet

# name -> (doc, a text only that doc's snippet holds, the test that runs it: "file::function")
ELSEWHERE = {
    "serving.predict": ("docs/serving.md", "mlflow.pyfunc.load_model(",
                        "tests/e2e/test_kedro_dlrm.py::test_the_runs_model_scores_raw_rows_as_the_"
                        "evaluation_in_process_in_batch_and_over_http"),
    "serving.compare": ("docs/serving.md", "evaluation_scores.parquet",
                        "tests/e2e/test_kedro_dlrm.py::test_the_runs_model_scores_raw_rows_as_the_"
                        "evaluation_in_process_in_batch_and_over_http"),
    "multihost.hosts": ("docs/multihost.md", "NamespaceHosts(",
                        "tests/multihost/test_netns.py::test_the_docs_snippet_runs_on_namespace_"
                        "hosts"),
}


@dataclass(frozen=True)
class Snippet:
    doc: str  # relative to the project root: "docs/serving.md"
    line: int  # the line of its opening fence, from 1
    code: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line of the opening fence from 1, code) of each fenced block whose language is Python,
    as a CommonMark parser sees them (fences in lists and quotes too; none inside an indented
    code block or an HTML comment)."""
    return [(tok.map[0] + 1, tok.content) for tok in MarkdownIt("commonmark").parse(text)
            if tok.type == "fence" and tok.info.split()[:1]
            and tok.info.split()[0].lower() in PYTHON]


def snippets() -> list[Snippet]:
    """Every Python snippet under docs/, in file order."""
    return [Snippet(p.relative_to(PROJECT_ROOT).as_posix(), line, code)
            for p in sorted(DOCS.rglob("*.md"))
            for line, code in python_blocks(p.read_text())]


def elsewhere(name: str) -> Snippet:
    """The one snippet ``ELSEWHERE[name]`` names (fails unless exactly one matches)."""
    doc, marker, _ = ELSEWHERE[name]
    found = [s for s in snippets() if s.doc == doc and marker in s.code]
    assert len(found) == 1, (f"ELSEWHERE[{name!r}]: {len(found)} python snippets of {doc} hold "
                             f"{marker!r} ({[s.where for s in found]}); expected exactly one")
    return found[0]


def run_snippet(snippet: Snippet | str, cwd: Path, timeout: float = 120,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``snippet`` (or ``ELSEWHERE``'s by name) as written: ``python -c`` in ``cwd`` (on
    sys.path as in a REPL), no MLflow URI from the environment (``env``: variables to add);
    fails naming doc:line."""
    s = elsewhere(snippet) if isinstance(snippet, str) else snippet
    env = {**{k: v for k, v in os.environ.items()
              if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")},  # tests' own stores
           "DO_NOT_TRACK": "true", "MLFLOW_DISABLE_TELEMETRY": "true",
           "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", **(env or {})}
    try:
        res = subprocess.run([sys.executable, "-c", s.code], cwd=cwd, env=env, text=True,
                             capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        raise AssertionError(f"{s.where}: the snippet ran past {timeout} s in {cwd}:\n"
                             f"{(err or '')[-3000:]}") from None
    assert res.returncode == 0, (f"{s.where}: the snippet failed (exit {res.returncode}) in "
                                 f"{cwd}:\n{res.stderr[-4000:]}")
    return res
