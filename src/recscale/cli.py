"""The project's own ``kedro run``: Kedro's, but a ``--params`` value that YAML 1.1 would read as a
base-60 number stays the string that was typed, so ``--params=train.launch.nnodes=2:3`` is the
range ``"2:3"``, not the integer 123 (Kedro parses ``--params`` values as YAML 1.1, where ``2:3``
is 2 x 60 + 3). Kedro loads a project's ``cli.py``; its commands take the place of the built-in
ones (``recscale`` / ``python -m recscale`` runs this one too)."""

from __future__ import annotations

import copy
import re
from typing import Any

import click
from kedro.framework.cli.project import run as _kedro_run
from kedro.framework.cli.utils import _split_params, split_string

# what YAML 1.1 resolves as a base-60 integer or float: digits, then ":" and one or two digits
SEXAGESIMAL = re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?")


def keep_sexagesimal_strings(item: str) -> str:
    """``key=2:3`` -> ``key="2:3"`` (quoted, so YAML keeps the string); anything else as it is."""
    key, eq, value = item.partition("=")
    if eq and SEXAGESIMAL.fullmatch(value.strip()):
        return f'{key}="{value.strip()}"'
    return item


def split_params(ctx: click.Context, param: Any, value: Any) -> Any:
    """Kedro's ``--params`` parsing, after quoting the values it would read as base-60 numbers."""
    if isinstance(value, str):
        value = ",".join(keep_sexagesimal_strings(i) for i in split_string(ctx, param, value))
    return _split_params(ctx, param, value)


@click.group(name="recscale")
def cli() -> None:
    """recscale's project commands."""


run = copy.copy(_kedro_run)
run.params = [copy.copy(p) for p in _kedro_run.params]
for _p in run.params:
    if _p.name == "params":
        _p.callback = split_params
cli.add_command(run, "run")
