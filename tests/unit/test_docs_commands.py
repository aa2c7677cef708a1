"""The shell commands the docs give (```bash blocks of docs/*.md and the README) name what exists:
a `kedro run` line's pipelines are registered, its env is a conf folder, its run file exists, and
the parameters it would run with (conf/base, the env, the run file and --params, merged as the
project's loader and `run` command merge them) parse into every typed config without an error;
a `python benchmarks/x.py` line names a script that takes each of its flags; a `recscale`
command is a subcommand of the project's CLI. What the commands then do is what the e2e tests
and benchmarks run; this keeps the docs from naming a key, env or flag that is gone."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml
from markdown_it import MarkdownIt

from recscale.cli import split_items
from recscale.config import check_blocks, parse
from recscale.hf.config import MnistJobConfig, SpeechJobConfig
from recscale.hooks import PARAMETER_BLOCKS
from recscale.pipelines.retrain.nodes import RETRAIN_BLOCKS
from recscale.retrain import DLRMRetrainConfig
from recscale.scoring.config import ScoreConfig
from recscale.settings import CONFIG_LOADER_ARGS, CONFIG_LOADER_CLASS
from recscale.tune import TuneConfig
from tests.conftest import PROJECT_ROOT

SHELL = {"bash", "sh", "shell", "console"}


def _commands() -> list[tuple[str, str]]:
    """(doc:line, command) of every line of every shell block, continuations joined, comments
    and prompts dropped."""
    out = []
    docs = sorted((PROJECT_ROOT / "docs").rglob("*.md")) + [PROJECT_ROOT / "README.md"]
    for p in docs:
        for tok in MarkdownIt("commonmark").parse(p.read_text()):
            if tok.type != "fence" or (tok.info.split() or [""])[0].lower() not in SHELL:
                continue
            lines = tok.content.splitlines()
            k = 0
            while k < len(lines):  # a command: its continuations and open quotes joined
                first, line = k, lines[k]
                while True:
                    if line.rstrip().endswith("\\") and k + 1 < len(lines):
                        k += 1
                        line = line.rstrip()[:-1] + " " + lines[k].strip()
                        continue
                    try:
                        shlex.split(line, comments=True)
                    except ValueError:  # a quote opened on this line closes on a later one
                        if k + 1 < len(lines):
                            k += 1
                            line += "\n" + lines[k]
                            continue
                    break
                k += 1
                line = re.sub(r"^\$\s+", "", line.strip())
                if line and not line.startswith("#"):
                    out.append((f"{p.relative_to(PROJECT_ROOT)}:{tok.map[0] + 2 + first}", line))
    return out


COMMANDS = _commands()


def _words(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value cmd
        words.pop(0)
    if words[:1] in (["nice"],) or words[:1] == ["timeout"]:
        words = words[3:] if words[1:2] == ["-n"] else words[2:]
    return words


def _options(words: list[str]) -> dict[str, str]:
    opts, i = {}, 0
    while i < len(words):
        w = words[i]
        if w.startswith("--"):
            key, eq, value = w[2:].partition("=")
            if not eq and i + 1 < len(words) and not words[i + 1].startswith("-"):
                value, i = words[i + 1], i + 1
            opts[key] = value
        i += 1
    return opts


def _runtime(value: str) -> dict:
    from omegaconf import OmegaConf

    items = split_items(value)
    return OmegaConf.to_container(OmegaConf.from_dotlist(items)) if items else {}


def _check_kedro_run(where: str, words: list[str]) -> None:
    from recscale.pipeline_registry import register_pipelines

    opts = _options(words[2:])
    pipelines = (opts.get("pipelines") or opts.get("pipeline") or "").split(",")
    env, params = opts.get("env"), {}
    if "$" in opts.get("params", ""):  # a shell loop's variable: the items without it
        opts["params"] = ",".join(i for i in split_items(opts["params"]) if "$" not in i)
    if "config" in opts:
        run_file = PROJECT_ROOT / opts["config"]
        assert run_file.is_file(), f"{where}: run file {opts['config']} does not exist"
        run = yaml.safe_load(run_file.read_text())["run"]
        pipelines = pipelines if pipelines != [""] else str(run.get("pipelines", "")).split(",")
        env = env or run.get("env")
        params = run.get("params") or {}
        params = _runtime(params) if isinstance(params, str) else params
    known = register_pipelines()
    for name in filter(None, pipelines):
        assert name in known, f"{where}: pipeline {name!r} is not registered ({sorted(known)})"
    written = env and env.startswith("tuned_")  # the tune pipeline writes conf/tuned_<study>/
    if env and "<" not in env and not written:
        assert (PROJECT_ROOT / "conf" / env).is_dir(), f"{where}: env {env!r} has no conf folder"
    shipped = env and "<" not in env and (PROJECT_ROOT / "conf" / env).is_dir()
    # as `kedro run` does: --params given replace the run file's; the loader merges them in
    runtime = _runtime(opts["params"]) if opts.get("params") else params
    loader = CONFIG_LOADER_CLASS(str(PROJECT_ROOT / "conf"), env=env if shipped else "local",
                                 runtime_params=runtime, **CONFIG_LOADER_ARGS)
    merged = loader["parameters"]
    check_blocks(merged, PARAMETER_BLOCKS, f"{where}: parameters")
    parse(DLRMRetrainConfig, {b: merged.get(b) for b in RETRAIN_BLOCKS}, "")
    parse(ScoreConfig, merged.get("score"), "score")
    parse(TuneConfig, merged.get("tune"), "tune")
    parse(MnistJobConfig, merged.get("hf"), "hf")
    parse(SpeechJobConfig, merged.get("hf_speech"), "hf_speech")


def _check_benchmark(where: str, words: list[str]) -> None:
    script = next(w for w in words if w.endswith(".py"))
    path = PROJECT_ROOT / script
    assert path.is_file(), f"{where}: {script} does not exist"
    source = path.read_text()
    for w in words[words.index(script) + 1:]:
        if w.startswith("--"):
            flag = w.split("=")[0]
            assert f'"{flag}"' in source or f"'{flag}'" in source, \
                f"{where}: {script} takes no {flag}"


@pytest.mark.parametrize("where, line", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_names_what_exists(where, line):
    words = _words(line)
    if not words:
        return
    if words[0] == "for" and "do" in words and words[-1] == "done":  # a one-line loop
        body = " ".join(words[words.index("do") + 1:-1]).rstrip(";")
        values = [str(f.relative_to(PROJECT_ROOT)) for v in words[3:words.index("do")]
                  for f in sorted(PROJECT_ROOT.glob(v.rstrip(";")))] or words[3:words.index("do")]
        assert values, f"{where}: the loop runs over nothing"
        for v in values:
            test_a_documented_command_names_what_exists(where, body.replace(f"${words[1]}", v))
        return
    prog = words[0].rsplit("/", 1)[-1]
    if prog == "kedro" and words[1:2] == ["run"]:
        _check_kedro_run(where, words)
    elif prog.startswith("python") and any(w.endswith(".py") and w.startswith("benchmarks/")
                                           for w in words):
        _check_benchmark(where, words)
    elif prog == "recscale":  # its own commands, else a kedro run (recscale/__main__.py)
        tools = {"join": "join.py", "secret": "distributed/job_secret.py",
                 "calibrate": "measure/cli.py"}
        if words[1:2] and words[1] in tools:
            source = (PROJECT_ROOT / "src/recscale" / tools[words[1]]).read_text()
            for w in words[2:]:
                if w.startswith("--"):
                    flag = w.split("=")[0]
                    assert f'"{flag}"' in source, f"{where}: recscale {words[1]} takes no {flag}"
        else:
            _check_kedro_run(where, ["kedro", "run", *words[1:]])


def test_the_docs_give_kedro_runs_to_check():
    runs = [w for w, line in COMMANDS if _words(line)[:2] in (["kedro", "run"],
                                                             [".venv/bin/kedro", "run"])]
    assert len(runs) >= 10, runs
