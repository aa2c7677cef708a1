"""Planner inputs: table specs, constraints, precisions, optimizer and planner options.

Everything here is a frozen dataclass validated in ``__post_init__``; a bad value raises
``ConfigError`` (a ``ValueError``) naming the field, the value and what is allowed.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from numbers import Integral, Real
from typing import Any

from recscale.comm.precision import CommsConfig
from recscale.config import ConfigError, check, check_choice, nearest


class ShardingType(str, enum.Enum):
    """How one embedding table is split across ranks."""

    DATA_PARALLEL = "data_parallel"  # replicated on every rank, gradients all-reduced
    TABLE_WISE = "table_wise"  # the whole table on one rank
    ROW_WISE = "row_wise"  # equal contiguous row blocks over all ranks
    COLUMN_WISE = "column_wise"  # column slices on distinct ranks
    TABLE_ROW_WISE = "table_row_wise"  # row blocks over the ranks of one host (hierarchical)
    TABLE_COLUMN_WISE = "table_column_wise"  # column slices on the ranks of one host


SHARDING_TYPES: tuple[str, ...] = tuple(t.value for t in ShardingType)
TIERS: tuple[str, ...] = ("hbm", "ddr", "ssd")
# Bytes per element. int8 is fbgemm's row-wise quantised format: +8 bytes (fp32 scale and bias)
# per vector, added where it is communicated.
PRECISION_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
WEIGHT_PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")
# Optimizer state per row of a shard with `d` columns, in fp32 floats: (per row, per element).
OPTIMIZER_STATE: dict[str, tuple[int, int]] = {
    "exact_sgd": (0, 0),
    "exact_rowwise_adagrad": (1, 0),
    "exact_adagrad": (0, 1),
    "adam": (0, 2),
}
STRATEGIES: tuple[str, ...] = ("balanced", "greedy", "round_robin")


class PlannerError(Exception):
    """The tables cannot be placed on the topology.

    Attributes name the table, the bytes it needs, the capacity it was measured against, and the
    changes that would make it fit.
    """

    def __init__(
        self,
        message: str,
        *,
        table: str | None = None,
        bytes_needed: float | None = None,
        capacity: float | None = None,
        suggestions: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.table = table
        self.bytes_needed = bytes_needed
        self.capacity = capacity
        self.suggestions = tuple(suggestions)


def _choice(key: str, value: Any, choices: Sequence[str]) -> str:
    """``value`` (an enum member counts as its value) among ``choices``, as a string."""
    if isinstance(value, enum.Enum):
        value = value.value
    check_choice(key, value, choices)
    return str(value)


def _positive_int(key: str, value: Any) -> int:
    check(not isinstance(value, bool) and isinstance(value, Integral) and int(value) > 0, key,
          value, "a positive integer")
    return int(value)


def _positive_float(key: str, value: Any, *, allow_zero: bool = False) -> float:
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(float(value))
    check(ok and float(value) >= 0 and (float(value) > 0 or allow_zero), key, value,
          "a non-negative finite number" if allow_zero else "a positive number")
    return float(value)


def _check_keys(where: str, mapping: Mapping[str, Any], cls: type) -> None:
    allowed = sorted(f.name for f in fields(cls) if f.init)
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown key {where}.{unknown[0]}{nearest(unknown[0], allowed)}; "
                          f"allowed keys: {', '.join(allowed)}")


@dataclass(frozen=True)
class TableConstraints:
    """Restrictions on one table: the sharding types it may use and/or a pinned memory tier."""

    sharding_types: tuple[str, ...] | None = None
    tier: str | None = None

    def __post_init__(self) -> None:
        if self.sharding_types is not None:
            seq = self.sharding_types
            if isinstance(seq, (str, ShardingType)):
                seq = (seq,)
            check(isinstance(seq, (list, tuple)) and len(seq) > 0, "constraints.sharding_types",
                  self.sharding_types, "a non-empty list of " + ", ".join(SHARDING_TYPES))
            types = tuple(
                _choice(f"constraints.sharding_types[{i}]", t, SHARDING_TYPES)
                for i, t in enumerate(seq)
            )
            object.__setattr__(self, "sharding_types", types)
        if self.tier is not None:
            object.__setattr__(self, "tier", _choice("constraints.tier", self.tier, TIERS))

    @classmethod
    def coerce(cls, value: Any, where: str = "constraints") -> TableConstraints | None:
        if value is None or isinstance(value, TableConstraints):
            return value
        check(isinstance(value, Mapping), where, value,
              "a mapping with keys sharding_types and/or tier")
        _check_keys(where, value, cls)
        st = value.get("sharding_types")
        return cls(sharding_types=tuple(st) if isinstance(st, list) else st,
                   tier=value.get("tier"))

    def to_dict(self) -> dict[str, Any]:
        return {"sharding_types": None if self.sharding_types is None else list(self.sharding_types),
                "tier": self.tier}


@dataclass(frozen=True)
class TableSpec:
    """One embedding table: ``num_embeddings`` rows of ``embedding_dim`` columns.

    ``pooling_factor`` is the mean number of ids per sample per feature; ``feature_names`` are the
    sparse features that look this table up (default: one feature named like the table).
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float = 1.0
    feature_names: tuple[str, ...] = ()
    constraints: TableConstraints | None = None
    # distinct ids / ids in a global batch (measured in the data; 1.0: every id its own row): a
    # batch's backward updates each distinct row once
    distinct_fraction: float = 1.0

    def __post_init__(self) -> None:
        check(isinstance(self.name, str) and len(self.name) > 0, "name", self.name,
              "a non-empty string")
        where = f"table {self.name!r}"
        object.__setattr__(self, "num_embeddings",
                           _positive_int(f"{where}: num_embeddings", self.num_embeddings))
        object.__setattr__(self, "embedding_dim",
                           _positive_int(f"{where}: embedding_dim", self.embedding_dim))
        object.__setattr__(self, "pooling_factor",
                           _positive_float(f"{where}: pooling_factor", self.pooling_factor))
        u = _positive_float(f"{where}: distinct_fraction", self.distinct_fraction)
        check(u <= 1.0, f"{where}: distinct_fraction", u, "in (0, 1]")
        object.__setattr__(self, "distinct_fraction", u)
        names = self.feature_names
        if isinstance(names, str):
            names = (names,)
        if names is None or len(names) == 0:
            names = (self.name,)
        check(all(isinstance(n, str) and n for n in names), f"{where}: feature_names",
              self.feature_names, "a list of non-empty strings")
        object.__setattr__(self, "feature_names", tuple(names))
        object.__setattr__(self, "constraints",
                           TableConstraints.coerce(self.constraints, f"{where}: constraints"))

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    @property
    def num_params(self) -> int:
        return self.num_embeddings * self.embedding_dim

    def allowed_types(self) -> tuple[str, ...]:
        if self.constraints is None or self.constraints.sharding_types is None:
            return SHARDING_TYPES
        return self.constraints.sharding_types

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "table") -> TableSpec:
        check(isinstance(d, Mapping), where, d,
              "a mapping with name, num_embeddings, embedding_dim, ...")
        _check_keys(where, d, cls)
        for key in ("name", "num_embeddings", "embedding_dim"):
            if key not in d:
                raise ConfigError(f"{where}: missing key {key!r} (required: name, num_embeddings, "
                                  "embedding_dim)")
        kw = dict(d)
        if isinstance(kw.get("feature_names"), list):
            kw["feature_names"] = tuple(kw["feature_names"])
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "num_embeddings": self.num_embeddings,
            "embedding_dim": self.embedding_dim,
            "pooling_factor": self.pooling_factor,
            "feature_names": list(self.feature_names),
            "constraints": None if self.constraints is None else self.constraints.to_dict(),
            **({"distinct_fraction": self.distinct_fraction}
               if self.distinct_fraction != 1.0 else {}),
        }


@dataclass(frozen=True)
class PlannerOptions:
    """Knobs of ``plan_sharding``; every one has a default.

    - ``optimizer``: sets optimizer-state bytes per row (exact_sgd 0, exact_rowwise_adagrad 1 float,
      exact_adagrad D floats, adam 2*D floats).
    - ``weight_precision``: bytes per stored weight (fp32/fp16/bf16).
    - ``comms``: wire precision per direction (``recscale.comm.CommsConfig``, a name, or a dict; the
      runtime reads the same config).
    - ``memory_fraction``: share of each tier's capacity the planner may fill (rest is headroom for
      activations, the dense model and allocator slack).
    - ``column_granularity`` / ``min_column_width``: column shards are multiples of the granularity
      and never narrower than the minimum.
    - ``cache_fraction``: share of a spilled shard's rows cached in the compute tier; None lets the
      planner pick from a few candidates by estimated cost.
    - ``cache_hit_exponent``: hit rate of a cache holding a fraction c of the rows is c**exponent
      (skewed, Zipf-like ids).
    - ``index_bytes``: bytes per sparse id on the wire (int64: 8).
    - ``pack_fraction``: the planner prefers shards no larger than this share of a rank's tier.
    - ``data_parallel_max_fraction``: a table is replicated only if it takes at most this share of
      the compute tier of each rank.
    - ``split_fractions``: targets tried for the largest shard as a share of the mean rank cost; the
      best resulting plan is kept.
    - ``strategy``: "balanced" (this planner), or the baselines "greedy" / "round_robin"
      (table-wise, row-wise only for tables too large for one rank, no search).
    - ``max_improve_iters``: cap on local-search steps (0: 8 * world_size + 200).

    Built directly, a bad value fails naming the field (``memory_fraction=2 ...``); built by
    ``coerce(mapping, key="sharding.options")``, naming the full key
    (``sharding.options.memory_fraction=2 ...``).
    """

    optimizer: str = "exact_rowwise_adagrad"
    weight_precision: str = "fp32"
    comms: CommsConfig = field(default_factory=CommsConfig)
    memory_fraction: float = 0.9
    column_granularity: int = 4
    min_column_width: int = 16
    cache_fraction: float | None = None
    cache_hit_exponent: float = 0.2
    index_bytes: int = 8
    pack_fraction: float = 0.5
    data_parallel_max_fraction: float = 0.01
    split_fractions: tuple[float, ...] = (0.5, 0.25, 0.125)
    strategy: str = "balanced"
    max_improve_iters: int = 0

    def __post_init__(self) -> None:
        values = _checked_options({f.name: getattr(self, f.name) for f in fields(self)}, "")
        object.__setattr__(self, "comms", values["comms"])
        object.__setattr__(self, "split_fractions", values["split_fractions"])

    @classmethod
    def coerce(cls, value: Any = None, *, key: str | None = None,
               **overrides: Any) -> PlannerOptions:
        """Options from None (the defaults), a ``PlannerOptions`` or a mapping of its fields, with
        ``overrides`` (the keyword arguments of ``plan_sharding``) on top. ``key``: where the
        options sit in a config file (``sharding.options``); errors then name ``key.field``."""
        where = key or "options"
        if value is None:
            base: dict[str, Any] = {}
        elif isinstance(value, PlannerOptions):
            base = {f.name: getattr(value, f.name) for f in fields(cls)}
        else:
            check(isinstance(value, Mapping), where, value,
                  "a PlannerOptions or a mapping of its fields")
            _check_keys(where, value, cls)
            base = dict(value)
        _check_keys("plan_sharding", overrides, cls)
        base.update(overrides)
        if key:  # check here, so that errors name the full key
            defaults = {f.name: getattr(_DEFAULT_OPTIONS, f.name) for f in fields(cls)}
            base = _checked_options({**defaults, **base}, key)
        return cls(**base)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["comms"] = self.comms.to_dict()
        out["split_fractions"] = list(self.split_fractions)
        return out


def _checked_options(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    """PlannerOptions field values checked (errors name ``prefix.field``), with ``comms`` as a
    CommsConfig and ``split_fractions`` as a tuple of floats."""

    def k(name: str) -> str:
        return f"{prefix}.{name}" if prefix else name

    out = dict(values)
    _choice(k("optimizer"), values["optimizer"], tuple(OPTIMIZER_STATE))
    _choice(k("weight_precision"), values["weight_precision"], WEIGHT_PRECISIONS)
    out["comms"] = CommsConfig.coerce(values["comms"], k("comms"))
    mf = _positive_float(k("memory_fraction"), values["memory_fraction"])
    check(mf <= 1, k("memory_fraction"), values["memory_fraction"], "a number in (0, 1]")
    _positive_int(k("column_granularity"), values["column_granularity"])
    _positive_int(k("min_column_width"), values["min_column_width"])
    if values["cache_fraction"] is not None:
        c = _positive_float(k("cache_fraction"), values["cache_fraction"], allow_zero=True)
        check(c < 1, k("cache_fraction"), values["cache_fraction"], "a number in [0, 1) or null")
    _positive_float(k("cache_hit_exponent"), values["cache_hit_exponent"])
    _positive_int(k("index_bytes"), values["index_bytes"])
    pf = _positive_float(k("pack_fraction"), values["pack_fraction"])
    check(pf <= 1, k("pack_fraction"), values["pack_fraction"], "a number in (0, 1]")
    _positive_float(k("data_parallel_max_fraction"), values["data_parallel_max_fraction"],
                    allow_zero=True)
    sf = values["split_fractions"]
    if isinstance(sf, Real):
        sf = (sf,)
    check(isinstance(sf, (list, tuple)) and len(sf) > 0, k("split_fractions"),
          values["split_fractions"], "a non-empty list of positive numbers")
    out["split_fractions"] = tuple(_positive_float(k("split_fractions"), x) for x in sf)
    _choice(k("strategy"), values["strategy"], STRATEGIES)
    mi = values["max_improve_iters"]
    check(not isinstance(mi, bool) and isinstance(mi, Integral) and mi >= 0,
          k("max_improve_iters"), mi, "a non-negative integer")
    return out


_DEFAULT_OPTIONS = PlannerOptions()
