"""Which split each input row goes to (``preprocess.splits``), in three forms:

- fractions of the rows in input order, ``[0.8, 0.1, 0.1]`` (a log already in time order);
- by a time column, ``{by: ts, validation_from: V, test_from: T}`` (a row goes to train when
  its time is before V, to test from T, to validation between), or ``{by: ts, fractions:
  [0.8, 0.1, 0.1]}``: V and T found as the times that many of the rows precede, counted in one
  pass over that column (memory: one entry per distinct time value, not per row; rows at the
  same time stay together). Times are numbers, timestamp or date columns, or text holding a
  number or an ISO date / date-time; a row whose time is missing or neither rejects its row.
  The file is never sorted: each row is written to its split where it stands;
- by source file or partition, ``{train: [globs], validation: [...], test: [...]}``: a pattern
  matches a file's path, its name or any folder on its path (``day=2026-12-0[1-7]``); every
  input file must match the patterns of exactly one split.

Rows keep their input row number (``row``) in every form, so a split's rows trace back to the
input. The manifest records the rule and, for a time split, the boundaries it used
(``split_rule``).
"""

from __future__ import annotations

import datetime
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recscale.config import ConfigError, Validated, check

SPLITS = ("train", "validation", "test")
_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%d")


def check_fractions(value: Sequence[float], key: str) -> None:
    check(len(value) == 3 and all(f >= 0 for f in value) and abs(sum(value) - 1.0) < 1e-6,
          key, list(value), "three non-negative fractions that sum to 1")


@dataclass(frozen=True)
class TimeSplit(Validated):
    """``preprocess.splits`` by a time column (module docstring)."""

    by: str
    validation_from: float | str | None = None  # a time: a number, or an ISO date / date-time
    test_from: float | str | None = None
    fractions: tuple[float, float, float] | None = None  # of the rows ordered by time

    def validate(self, prefix: str = "preprocess.splits") -> None:
        check(isinstance(self.by, str) and bool(self.by), f"{prefix}.by", self.by,
              "the name of the time column")
        given = self.validation_from is not None and self.test_from is not None
        check(given != (self.fractions is not None), f"{prefix}.fractions", self.fractions,
              "either validation_from and test_from (times), or fractions (of the rows ordered "
              "by time), not both and not neither")
        if self.fractions is not None:
            check_fractions(self.fractions, f"{prefix}.fractions")
            return
        for key in ("validation_from", "test_from"):
            try:
                time_bound(getattr(self, key))
            except ValueError:
                check(False, f"{prefix}.{key}", getattr(self, key),
                      "a number or an ISO date / date-time (quoted: '2026-12-01 08:00:00')")
        check(time_bound(self.validation_from) <= time_bound(self.test_from),
              f"{prefix}.test_from", self.test_from,
              f"a time at or after validation_from ({self.validation_from!r})")


@dataclass(frozen=True)
class FileSplit(Validated):
    """``preprocess.splits`` by source file or partition (module docstring)."""

    train: tuple[str, ...]
    validation: tuple[str, ...] = ()
    test: tuple[str, ...] = ()

    def validate(self, prefix: str = "preprocess.splits") -> None:
        check(len(self.train) >= 1, f"{prefix}.train", list(self.train),
              "at least one pattern of the train split's files")

    def split_of(self, path: str) -> int:
        """The split (0, 1, 2) whose patterns match ``path``; ConfigError unless exactly one."""
        parts = PurePath(path).parts
        hits = [k for k, s in enumerate(SPLITS)
                if any(fnmatch.fnmatch(str(path), p) or any(fnmatch.fnmatch(x, p) for x in parts)
                       for p in getattr(self, s))]
        if len(hits) != 1:
            said = "; ".join(f"{s}: {list(getattr(self, s))}" for s in SPLITS)
            what = "no split's patterns" if not hits else \
                "the patterns of " + " and ".join(SPLITS[k] for k in hits)
            raise ConfigError(f"preprocess.splits: input file {path} matches {what} ({said}); "
                              "each input file must match exactly one split")
        return hits[0]


def time_bound(value: float | str | datetime.date | None) -> float:
    """A boundary as the split compares it: a number as is, an ISO date / date-time as seconds
    since 1970-01-01 (UTC); ValueError otherwise."""
    if isinstance(value, bool) or value is None:
        raise ValueError(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime.date):
        value = value.isoformat()
    if isinstance(value, str):
        x, ok = time_values(pa.array([value]))
        if ok[0]:
            return float(x[0])
    raise ValueError(value)


def time_values(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A time column -> (float64 times, ok): numbers as they are; timestamps and dates, and text
    in an ISO format, as seconds since 1970-01-01; ok False where missing or not a time."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = col.type
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        secs = pc.cast(pc.cast(col, pa.timestamp("us")), pa.int64())
        x = secs.to_numpy(zero_copy_only=False).astype(np.float64) / 1e6
        return np.nan_to_num(x), ~np.asarray(col.is_null().to_numpy(zero_copy_only=False))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        number = pc.fill_null(pc.match_substring_regex(col, _NUMBER), False)
        x = pc.if_else(number, col, pa.scalar(None, t)).cast(pa.float64())
        x = x.to_numpy(zero_copy_only=False)
        text = pc.utf8_trim_whitespace(col)
        for fmt in _FORMATS:
            stamp = pc.strptime(text, format=fmt, unit="us", error_is_null=True)
            v = pc.cast(stamp, pa.int64()).to_numpy(zero_copy_only=False).astype(np.float64)
            x = np.where(np.isnan(x), v / 1e6, x)
        ok = ~np.isnan(x)
        return np.where(ok, x, 0.0), ok
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        x = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
        ok = ~np.isnan(x)
        return np.where(ok, x, 0.0), ok
    raise ConfigError(f"preprocess.splits.by: the time column has type {t}; expected numbers, "
                      "timestamps, dates or text")


def time_counts(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct times of a block's rows and how many rows have each (rows without a time
    left out): what a split by fractions of the rows ordered by time counts."""
    x, ok = time_values(col)
    return np.unique(x[ok], return_counts=True)


def merge_counts(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    if not parts:
        return np.zeros(0), np.zeros(0, np.int64)
    values = np.concatenate([v for v, _ in parts])
    counts = np.concatenate([c for _, c in parts])
    u, inv = np.unique(values, return_inverse=True)
    return u, np.bincount(inv, weights=counts, minlength=len(u)).astype(np.int64)


class Splitter:
    """The rule resolved for one input: ``split_of(path, rows, block)`` gives each row of a
    block its split (0 train, 1 validation, 2 test) and the rows it must reject."""

    def __init__(self, rule, total: int, counts: tuple[np.ndarray, np.ndarray] | None = None):
        self.rule, self.total = rule, total
        self.bounds = None
        self.times = None
        if isinstance(rule, TimeSplit):
            if rule.fractions is not None:
                self.times = boundaries_at(counts, rule.fractions)
            else:
                self.times = (time_bound(rule.validation_from), time_bound(rule.test_from))
        elif not isinstance(rule, FileSplit):
            self.bounds = split_bounds(total, rule)

    @property
    def column(self) -> str | None:
        """The column the rule reads (a time split's), else None."""
        return self.rule.by if isinstance(self.rule, TimeSplit) else None

    def row_bounds(self, path: str) -> np.ndarray:
        """Fractions and file splits: the first global row past each split for a file's rows
        (a file split puts all of a file's rows in its split)."""
        if self.bounds is not None:
            return self.bounds
        k = self.rule.split_of(path)
        return np.array([0 if k > 0 else self.total, 0 if k > 1 else self.total, self.total],
                        np.int64)

    def may_train(self, path: str, row_base: int) -> bool:
        """Whether a unit starting at global row ``row_base`` of file ``path`` can hold train
        rows (the fitting pass reads only those)."""
        if self.times is not None:
            return True
        return row_base < self.row_bounds(path)[0]

    def split_of(self, path: str, rows: np.ndarray, block: pa.Table
                 ) -> tuple[np.ndarray, np.ndarray]:
        """-> (split per row, int8; rows without a usable time, bool)."""
        if self.times is None:
            split = np.searchsorted(self.row_bounds(path), rows, side="right")
            return split.astype(np.int8), np.zeros(len(rows), bool)
        x, ok = time_values(block.column(self.column))
        split = (x >= self.times[0]).astype(np.int8) + (x >= self.times[1])
        return split, ~ok

    def reason(self, block: pa.Table, r: int) -> str:
        v = block.column(self.column)[r].as_py()
        what = "missing" if v is None else f"{str(v)[:40]!r} is not a time"
        return f"preprocess.splits.by: {self.column}={what}"

    def record(self) -> dict:
        """What the manifest keeps: the rule, and a time split's boundaries as compared."""
        if isinstance(self.rule, FileSplit):
            return {"files": {s: list(getattr(self.rule, s)) for s in SPLITS}}
        if self.times is not None:
            return {"by": self.column, "validation_from": self.times[0],
                    "test_from": self.times[1], "fractions": self.rule.fractions}
        return {"fractions": list(self.rule)}


def boundaries_at(counts: tuple[np.ndarray, np.ndarray] | None,
                  fractions: Sequence[float]) -> tuple[float, float]:
    """The times before which ``fractions[0]`` and ``fractions[0] + fractions[1]`` of the rows
    lie (the first time whose rows would pass that share; ties stay together)."""
    values, n = counts if counts is not None else (np.zeros(0), np.zeros(0, np.int64))
    if len(values) == 0:
        raise ConfigError("preprocess.splits.by: no row has a time to split by")
    cum = np.cumsum(n)
    total = cum[-1]
    out = []
    for f in (fractions[0], fractions[0] + fractions[1]):
        target = np.floor(f * total + 1e-9)
        i = int(np.searchsorted(cum, target, side="right"))  # first value whose rows pass it
        out.append(float(values[i]) if i < len(values) else float(np.inf))
    return out[0], out[1]


def split_bounds(total: int, splits: Sequence[float]) -> np.ndarray:
    """First row past each split (train, validation, test), in row order."""
    bounds = np.floor(np.cumsum(splits) * total + 1e-9).astype(np.int64)
    bounds[-1] = total
    return bounds


def check_criteo_splits(rule) -> None:
    """Criteo's TSV has no named columns: fractions in row order or a file split only."""
    if isinstance(rule, TimeSplit):
        raise ConfigError(f"preprocess.splits.by={rule.by!r} is not allowed with the Criteo "
                          "preset: its TSV has no named time column and its rows are in time "
                          "order; give fractions ([0.8, 0.1, 0.1]) or split by day files "
                          "({train: [day_0*], test: [day_23*]})")
