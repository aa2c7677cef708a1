"""The search space of a study: keys of the DLRM parameters and what each may take.

A key is a dotted path into the parameters (``train.embedding_optimizer.learning_rate``); a list
of named entries is entered by name (``features.tables[items].dim``: the entry of
``features.tables`` whose ``name`` is ``items``) or by position (``model.top_mlp[0]``). A value
spec is one of::

    {log_uniform: [low, high]}     a float, uniform in log space (0 < low < high)
    {uniform: [low, high]}         a float
    {int: [low, high]} / {int: [low, high, step]} / {log_int: [low, high]}
    {choice: [a, b, ...]}          any YAML values (numbers, strings, lists)

``check_space`` sets every key to its bounds and to each choice and parses the whole typed
config (``DLRMConfig``) each time, so an unknown key fails naming the nearest known one, and an
impossible bound fails with the config's own message, before the first trial.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from recscale.config import ConfigError, nearest

KINDS = ("log_uniform", "uniform", "int", "log_int", "choice")
# what a study cannot search: it tunes a model on one dataset, whose rows these blocks decide
FIXED_BLOCKS = ("data",)
_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[([^\]]+)\])?$")


@dataclass(frozen=True)
class Param:
    """One key of the space: ``key`` as written, ``kind`` (one of ``KINDS``), ``args``."""

    key: str
    kind: str
    args: tuple

    def suggest(self, trial) -> Any:
        """The value an Optuna trial draws for this key."""
        a = self.args
        if self.kind == "log_uniform":
            return trial.suggest_float(self.key, a[0], a[1], log=True)
        if self.kind == "uniform":
            return trial.suggest_float(self.key, a[0], a[1])
        if self.kind in ("int", "log_int"):
            step = a[2] if len(a) > 2 else 1
            return trial.suggest_int(self.key, a[0], a[1], step=step, log=self.kind == "log_int")
        # Optuna's choices must be plain scalars: a list choice (an MLP's widths) is drawn by index
        if all(isinstance(c, (bool, int, float, str)) or c is None for c in a):
            return trial.suggest_categorical(self.key, list(a))
        return a[trial.suggest_categorical(f"{self.key}#", list(range(len(a))))]

    def corners(self) -> list:
        """Values that stand for the whole range: the bounds, or every choice."""
        return list(self.args) if self.kind == "choice" else [self.args[0], self.args[1]]


# the space of a study whose tune block names none: what a first study of any log should search
DEFAULT_SPACE = {
    "train.embedding_optimizer.learning_rate": {"log_uniform": [0.01, 0.3]},
    "train.dense_optimizer.learning_rate": {"log_uniform": [0.0003, 0.01]},
    "train.batch_size_per_rank": {"choice": [1024, 2048, 4096]},
}


def parse_space(space: Mapping[str, Any] | None, prefix: str = "tune.space") -> list[Param]:
    """``tune.space`` (``DEFAULT_SPACE`` when empty or absent) -> its ``Param``s, each spec
    checked for its own form."""
    if not space:
        space = DEFAULT_SPACE
    if not isinstance(space, Mapping):
        raise ConfigError(f"{prefix}={space!r} is not allowed: expected a mapping of keys to specs")
    out = []
    for key, spec in space.items():
        where = f"{prefix}[{key!r}]"
        parts = str(key).split(".")
        if not all(_PART.match(p) for p in parts):
            raise ConfigError(f"{where}: {key!r} is not a key: expected a dotted path such as "
                              "train.dense_optimizer.learning_rate or features.tables[items].dim")
        if parts[0] in FIXED_BLOCKS:
            raise ConfigError(f"{where}: keys under {parts[0]}.* cannot be searched: a study tunes "
                              "one dataset (set them in the env's parameters instead)")
        if not isinstance(spec, Mapping) or len(spec) != 1:
            raise ConfigError(f"{where}={spec!r} is not allowed: expected one of "
                              + ", ".join(f"{{{k}: ...}}" for k in KINDS))
        kind, args = next(iter(spec.items()))
        if kind not in KINDS:
            raise ConfigError(f"{where}: {kind!r} is not a kind of range"
                              f"{nearest(str(kind), KINDS)}; expected one of {', '.join(KINDS)}")
        out.append(Param(str(key), kind, _check_args(where, kind, args)))
    return out


def _check_args(where: str, kind: str, args: Any) -> tuple:
    def bad(allowed: str):
        return ConfigError(f"{where}.{kind}={args!r} is not allowed: expected {allowed}")

    if not isinstance(args, (list, tuple)):
        raise bad("a list")
    if kind == "choice":
        if not args:
            raise bad("at least one value")
        return tuple(args)
    if kind in ("int", "log_int"):
        if len(args) not in (2, 3) or not all(isinstance(x, int) and not isinstance(x, bool)
                                              for x in args):
            raise bad("[low, high] or [low, high, step], integers")
        if args[0] > args[1] or (len(args) == 3 and args[2] < 1):
            raise bad("low <= high and step >= 1")
        if kind == "log_int" and (args[0] < 1 or len(args) == 3 and args[2] != 1):
            raise bad("1 <= low <= high, no step")
        return tuple(args)
    if len(args) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                 for x in args) or not all(math.isfinite(x) for x in args):
        raise bad("[low, high], two finite numbers")
    if not args[0] < args[1]:
        raise bad("low < high")
    if kind == "log_uniform" and args[0] <= 0:
        raise bad("0 < low < high (a log scale)")
    return (float(args[0]), float(args[1]))


def set_key(params: dict, key: str, value: Any) -> None:
    """``params`` with ``key`` (a dotted path, list entries by name or position) set to ``value``,
    in place; missing mappings on the way are created (the typed config then judges the key)."""
    node: Any = params
    parts = key.split(".")
    for i, part in enumerate(parts):
        name, sel = _PART.match(part).groups()
        last = i == len(parts) - 1
        if not isinstance(node, dict):
            raise ConfigError(f"{'.'.join(parts[:i])} is not a mapping, so {key} cannot be set")
        if sel is None:
            if last:
                node[name] = copy.deepcopy(value)
                return
            node = node.setdefault(name, {})
            continue
        seq = node.get(name)
        if not isinstance(seq, list):
            raise ConfigError(f"{'.'.join(parts[:i] + [name])} is not a list in the parameters, "
                              f"so {key} cannot select [{sel}] in it")
        idx = _select(seq, sel, key)
        if last:
            seq[idx] = copy.deepcopy(value)
            return
        node = seq[idx]


def _select(seq: list, sel: str, key: str) -> int:
    if sel.lstrip("-").isdigit():
        i = int(sel)
        if not -len(seq) <= i < len(seq):
            raise ConfigError(f"{key}: [{sel}] is out of range: the list has {len(seq)} entries")
        return i % len(seq)
    names = [e.get("name") for e in seq if isinstance(e, dict)]
    for i, e in enumerate(seq):
        if isinstance(e, dict) and e.get("name") == sel:
            return i
    raise ConfigError(f"{key}: no entry named {sel!r}{nearest(sel, names)}; the entries are "
                      f"{', '.join(map(str, names))}")


def apply(params: Mapping[str, Any], values: Mapping[str, Any]) -> dict:
    """A deep copy of ``params`` with every key of ``values`` set."""
    out = copy.deepcopy(dict(params))
    for key, value in values.items():
        set_key(out, key, value)
    return out


def check_space(space: list[Param], params: Mapping[str, Any],
                parse_config: Callable[[dict], Any]) -> None:
    """Every key at each of its corners, the others at their first, parsed as the whole config
    (``parse_config``): a bad key or an impossible bound fails here, naming it."""
    first = {p.key: p.corners()[0] for p in space}
    for p in space:
        for value in p.corners():
            try:
                parse_config(apply(params, {**first, p.key: value}))
            except ConfigError as exc:
                raise ConfigError(f"tune.space[{p.key!r}] at {value!r}: {exc}") from None
