"""The project's own ``kedro run``: Kedro's, but a ``--params`` value that YAML 1.1 would read as a
base-60 number stays the string that was typed, so ``--params=train.launch.nnodes=2:3`` is the
range ``"2:3"``, not the integer 123 (Kedro parses ``--params`` values as YAML 1.1, where ``2:3``
is 2 x 60 + 3), and a list or mapping value keeps its commas (``--params=preprocess.splits=[0.9,
0.0,0.1]``: Kedro splits every comma, so the list would arrive cut in three). Kedro loads a
project's ``cli.py``; its commands take the place of the built-in ones (``recscale`` /
``python -m recscale`` runs this one too)."""

from __future__ import annotations

import copy
import re
from typing import Any

import click
from kedro.framework.cli.project import run as _kedro_run
from omegaconf import OmegaConf

# what YAML 1.1 resolves as a base-60 integer or float: digits, then ":" and one or two digits
SEXAGESIMAL = re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?")


def keep_sexagesimal_strings(item: str) -> str:
    """``key=2:3`` -> ``key="2:3"`` (quoted, so YAML keeps the string); anything else as it is."""
    key, eq, value = item.partition("=")
    if eq and SEXAGESIMAL.fullmatch(value.strip()):
        return f'{key}="{value.strip()}"'
    return item


def split_items(value: str) -> list[str]:
    """``a=1,b=[1,2],c={x: 1, y: 2}`` -> ``["a=1", "b=[1,2]", "c={x: 1, y: 2}"]``: the commas
    between items, not those inside brackets or braces (Kedro splits at every comma)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(value):
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            items.append(value[start:i])
            start = i + 1
    items.append(value[start:])
    return [i.strip() for i in items if i.strip()]


def split_params(ctx: click.Context, param: Any, value: Any) -> Any:
    """Kedro's ``--params`` parsing (``key=value`` items into nested values, read as YAML), on
    items split outside brackets, after quoting the values it would read as base-60 numbers."""
    if not isinstance(value, str):
        return value
    items = [keep_sexagesimal_strings(i) for i in split_items(value)]
    bad = [i for i in items if not i.partition("=")[0].strip() or "=" not in i]
    if bad:
        ctx.fail(f"Invalid format of `{param.name}` option: Item `{bad[0]}` must contain a key "
                 "and a value separated by `=`.")
    return OmegaConf.to_container(OmegaConf.from_dotlist(
        [f"{k.strip()}={v}" for k, _, v in (i.partition("=") for i in items)]))


@click.group(name="recscale")
def cli() -> None:
    """recscale's project commands."""


run = copy.copy(_kedro_run)
run.params = [copy.copy(p) for p in _kedro_run.params]
for _p in run.params:
    if _p.name == "params":
        _p.callback = split_params
cli.add_command(run, "run")
