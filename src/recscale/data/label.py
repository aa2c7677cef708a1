"""A label rule: which values of a column are clicks (``features.label: {column, positive}``).

A log rarely stores a 0/1 click: a ratings log has ratings, an event log an event type, a
purchase log a flag. ``positive`` says which values count as a click:

- a comparison with a number, as a string: ``">= 4"`` (``>``, ``>=``, ``<``, ``<=``, ``==``,
  ``!=``), on the value read as a number (a value that is not one rejects its row);
- a list of values: ``[buy, add_to_cart]`` or ``[4, 5]`` (numbers compared as numbers, strings as
  the column's text, ``true``/``false`` with any case);
- one value: ``true`` (a boolean column or its text), ``purchase``, ``1``.

Every other present value is a non-click; a missing value rejects its row (``bad label``).
Without a rule the column must hold 0 and 1 (a boolean column too).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from recscale.config import ConfigError, Validated, check

_COMPARE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)\s*$")
_OPS = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
        ">": operator.gt, "<": operator.lt}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


@dataclass(frozen=True)
class LabelRule(Validated):
    """``features.label`` as a rule: ``column`` holds the values, ``positive`` says which are
    clicks (module docstring)."""

    column: str
    positive: Any

    def validate(self, prefix: str = "features.label") -> None:
        check(isinstance(self.column, str) and bool(self.column), f"{prefix}.column", self.column,
              "the label's column")
        allowed = ("a comparison with a number ('>= 4'), a list of values ([buy, add_to_cart]) "
                   "or one value (true, purchase, 1)")
        p = self.positive
        if isinstance(p, (list, tuple)):
            check(len(p) > 0 and all(isinstance(v, (str, int, float, bool)) for v in p),
                  f"{prefix}.positive", p, allowed)
        else:
            check(isinstance(p, (str, int, float, bool)) and p != "", f"{prefix}.positive", p,
                  allowed)
            if isinstance(p, str) and p.strip()[:1] in "<>=!":
                check(_COMPARE.match(p) is not None, f"{prefix}.positive", p,
                      "a comparison with a number, such as '>= 4' or '< 0.5'")

    @property
    def comparison(self) -> tuple[str, float] | None:
        """(operator, number) of a comparison rule, else None."""
        m = _COMPARE.match(self.positive) if isinstance(self.positive, str) else None
        return (m.group(1), float(m.group(2))) if m else None

    @property
    def values(self) -> tuple:
        """The values that are clicks (a set rule or a one-value rule)."""
        p = self.positive
        return tuple(p) if isinstance(p, (list, tuple)) else (p,)

    @property
    def numeric(self) -> bool:
        """Whether the column is read as numbers (a comparison, or every value a number)."""
        return self.comparison is not None or all(_is_number(v) for v in self.values)

    def clicks_of_numbers(self, x: np.ndarray) -> np.ndarray:
        """Clicks of present values read as numbers."""
        cmp = self.comparison
        if cmp is not None:
            return _OPS[cmp[0]](x, cmp[1])
        return np.isin(x, np.asarray([float(v) for v in self.values]))

    def clicks_of_text(self, s: np.ndarray) -> np.ndarray:
        """Clicks of present values as text (trimmed; ``true``/``false`` compared in lower case)."""
        plain = [_text(v) for v in self.values if not isinstance(v, bool)]
        flags = [_text(v) for v in self.values if isinstance(v, bool)]
        out = np.isin(s, np.asarray(plain, dtype=object)) if plain else np.zeros(len(s), bool)
        if flags:
            out |= np.isin(np.char.lower(s.astype(str)), np.asarray(flags))
        return out

    def example(self, click: bool) -> Any:
        """A value this rule reads as ``click`` (the generator writes these)."""
        cmp = self.comparison
        if cmp is not None:
            op, v = cmp
            yes = {">=": v, ">": v + 1, "<=": v, "<": v - 1, "==": v, "!=": v + 1}[op]
            no = {">=": v - 1, ">": v, "<=": v + 1, "<": v, "==": v + 1, "!=": v}[op]
            out = yes if click else no
            return int(out) if float(out).is_integer() else out
        vals = self.values
        if click:
            return vals[0]
        if all(_is_number(v) for v in vals):
            return max(vals) + 1
        if any(isinstance(v, bool) for v in vals) and len({bool(v) for v in vals}) == 1:
            return not vals[0]
        return "other"


def non_binary_error(column: str, seen: list) -> ConfigError:
    """A label column that holds more than clicks: the values seen and the rule to write."""
    shown = ", ".join(f"{v:g}" if isinstance(v, float) else repr(v) for v in seen[:5])
    return ConfigError(
        f"features.label: column {column!r} is not a 0/1 click (values seen: {shown}); say which "
        f"values are clicks, e.g. features.label: {{column: {column}, positive: \">= 4\"}} (a "
        "comparison, a list of values or one value; docs/features.md, \"Labels\")")
