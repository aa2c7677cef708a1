"""The planner's output: ``ShardingPlan`` and its parts, JSON round-trippable.

``ShardingPlan.from_dict(plan.to_dict()) == plan`` holds (``planning_seconds`` is stored but left out
of equality, so two runs on the same input compare equal). A plan records what it was made for
(per-rank batch, world size, wire precisions); ``check_matches`` refuses a run that differs with
``PlanMismatchError``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from recscale.comm.precision import CommsConfig
from recscale.config import ConfigError

from .topology import Topology
from .types import TIERS, PlannerOptions

FORMAT_VERSION = 1
_REPLAN = "plan again for this run (kedro run --pipelines=sharding)"


class PlanMismatchError(ConfigError):
    """A sharding plan was made for another run: another per-rank batch, world size or wire
    precision. ``key`` is the run's setting that differs, ``planned`` the plan's value and
    ``actual`` the run's."""

    def __init__(self, field: str, planned: Any, key: str, actual: Any) -> None:
        super().__init__(f"the sharding plan was made for {field}={planned} but {key}={actual}: "
                         f"{_REPLAN} or set {key}={planned}")
        self.field = field
        self.key = key
        self.planned = planned
        self.actual = actual


@dataclass(frozen=True)
class ShardSpec:
    """One shard: a block of rows x columns of a table on one rank, in one memory tier.

    ``cache_fraction`` is the share of its rows cached in the compute tier (0 for shards that live
    in the compute tier). Costs are seconds per iteration; bytes are per tier: ``storage_bytes``
    (weights + optimizer state) in ``tier``, ``compute_tier_bytes`` (cache + I/O buffers) in the
    compute tier.
    """

    rank: int
    row_offset: int
    row_length: int
    col_offset: int
    col_length: int
    tier: str
    cache_fraction: float
    compute_cost: float
    comms_cost: float
    storage_bytes: float
    compute_tier_bytes: float

    @property
    def cost(self) -> float:
        return self.compute_cost + self.comms_cost

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "row_offset": self.row_offset, "row_length": self.row_length,
            "col_offset": self.col_offset, "col_length": self.col_length, "tier": self.tier,
            "cache_fraction": self.cache_fraction, "compute_cost": self.compute_cost,
            "comms_cost": self.comms_cost, "cost": self.cost,
            "storage_bytes": self.storage_bytes, "compute_tier_bytes": self.compute_tier_bytes,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ShardSpec:
        return cls(
            rank=int(d["rank"]), row_offset=int(d["row_offset"]), row_length=int(d["row_length"]),
            col_offset=int(d["col_offset"]), col_length=int(d["col_length"]), tier=str(d["tier"]),
            cache_fraction=float(d["cache_fraction"]), compute_cost=float(d["compute_cost"]),
            comms_cost=float(d["comms_cost"]), storage_bytes=float(d["storage_bytes"]),
            compute_tier_bytes=float(d["compute_tier_bytes"]),
        )


@dataclass(frozen=True)
class TablePlan:
    """How one table is sharded. Shards are ordered by (row_offset, col_offset); for row-wise
    types, shard ``i`` holds rows ``[i * block, (i + 1) * block)`` with ``block = row_block_size``."""

    name: str
    sharding_type: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float
    feature_names: tuple[str, ...]
    shards: tuple[ShardSpec, ...]
    distinct_fraction: float = 1.0  # as TableSpec's

    @property
    def cost(self) -> float:
        return sum(s.cost for s in self.shards)

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(s.rank for s in self.shards)

    @property
    def tier(self) -> str:
        return self.shards[0].tier

    @property
    def row_block_size(self) -> int:
        """Rows per block for row-wise types (what block_bucketize_sparse_features takes)."""
        return self.shards[0].row_length

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "sharding_type": self.sharding_type,
            "num_embeddings": self.num_embeddings, "embedding_dim": self.embedding_dim,
            "pooling_factor": self.pooling_factor, "feature_names": list(self.feature_names),
            "cost": self.cost, "shards": [s.to_dict() for s in self.shards],
            **({"distinct_fraction": self.distinct_fraction}
               if self.distinct_fraction != 1.0 else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TablePlan:
        return cls(
            name=str(d["name"]), sharding_type=str(d["sharding_type"]),
            num_embeddings=int(d["num_embeddings"]), embedding_dim=int(d["embedding_dim"]),
            pooling_factor=float(d["pooling_factor"]),
            feature_names=tuple(d["feature_names"]),
            shards=tuple(ShardSpec.from_dict(s) for s in d["shards"]),
            distinct_fraction=float(d.get("distinct_fraction", 1.0)),
        )


@dataclass(frozen=True)
class RankPlan:
    """Per-rank estimated seconds per iteration (compute vs communication) and bytes per tier."""

    rank: int
    compute_cost: float
    comms_cost: float
    hbm_bytes: float
    ddr_bytes: float
    ssd_bytes: float

    @property
    def cost(self) -> float:
        return self.compute_cost + self.comms_cost

    def memory(self, tier: str) -> float:
        return float(getattr(self, f"{tier}_bytes"))

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "compute_cost": self.compute_cost, "comms_cost": self.comms_cost,
                "cost": self.cost,
                "memory": {t: self.memory(t) for t in TIERS}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RankPlan:
        mem = d["memory"]
        return cls(rank=int(d["rank"]), compute_cost=float(d["compute_cost"]),
                   comms_cost=float(d["comms_cost"]), hbm_bytes=float(mem["hbm"]),
                   ddr_bytes=float(mem["ddr"]), ssd_bytes=float(mem["ssd"]))


@dataclass(frozen=True)
class ShardingPlan:
    """Sharding type and shard placement of every table, with per-rank cost and memory."""

    topology: Topology
    batch_size_per_rank: int
    options: PlannerOptions
    cache_fraction: float
    tables: tuple[TablePlan, ...]
    ranks: tuple[RankPlan, ...]
    critical_rank: int
    critical_tables: tuple[str, ...]
    planning_seconds: float = field(default=0.0, compare=False)

    # --- accessors for the runtime -----------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.topology.world_size

    @property
    def local_world_size(self) -> int:
        return self.topology.local_world_size

    @property
    def max_cost(self) -> float:
        return max(r.cost for r in self.ranks)

    @property
    def mean_cost(self) -> float:
        return sum(r.cost for r in self.ranks) / len(self.ranks)

    @property
    def max_over_mean(self) -> float:
        mean = self.mean_cost
        return self.max_cost / mean if mean > 0 else 1.0

    @cached_property
    def _by_name(self) -> dict[str, TablePlan]:
        return {t.name: t for t in self.tables}

    @cached_property
    def _by_rank(self) -> tuple[tuple[tuple[TablePlan, ShardSpec], ...], ...]:
        out: list[list[tuple[TablePlan, ShardSpec]]] = [[] for _ in range(self.world_size)]
        for t in self.tables:
            for s in t.shards:
                out[s.rank].append((t, s))
        return tuple(tuple(x) for x in out)

    def table(self, name: str) -> TablePlan:
        try:
            return self._by_name[name]
        except KeyError:
            shown = ", ".join(repr(t.name) for t in self.tables[:10])
            more = ", ..." if len(self.tables) > 10 else ""
            raise KeyError(f"table {name!r} is not in the plan; tables: {shown}{more}") from None

    def shards_for_rank(self, rank: int) -> tuple[tuple[TablePlan, ShardSpec], ...]:
        """(table plan, shard) pairs held by ``rank``, in table order."""
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ConfigError(f"rank={rank!r} is not allowed: expected an integer in "
                              f"[0, {self.world_size})")
        return self._by_rank[rank]

    def sharding_types(self) -> dict[str, str]:
        return {t.name: t.sharding_type for t in self.tables}

    def check_matches(self, *, batch_size_per_rank: int, world_size: int,
                      comms: CommsConfig | None = None) -> None:
        """Raise ``PlanMismatchError`` naming the first setting of the run that differs from what
        the plan was made for: ``train.batch_size_per_rank``, ``train.launch.world_size``, then
        (when ``comms`` is given) ``comms.forward``, ``comms.backward``, ``comms.dense_allreduce``.
        ``comms.loss_scale`` does not enter the plan and is not compared."""
        if batch_size_per_rank != self.batch_size_per_rank:
            raise PlanMismatchError("batch_size_per_rank", self.batch_size_per_rank,
                                    "train.batch_size_per_rank", batch_size_per_rank)
        if world_size != self.world_size:
            raise PlanMismatchError("world_size", self.world_size, "train.launch.world_size",
                                    world_size)
        if comms is not None:
            for name in ("forward", "backward", "dense_allreduce"):
                planned, actual = getattr(self.options.comms, name), getattr(comms, name)
                if actual != planned:
                    raise PlanMismatchError(f"comms.{name}", planned, f"comms.{name}", actual)

    def report(self, max_rows: int = 20) -> str:
        from .report import format_report

        return format_report(self, max_rows=max_rows)

    # --- serialisation -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        crit = self.ranks[self.critical_rank]
        return {
            "format_version": FORMAT_VERSION,
            "topology": self.topology.to_dict(),
            "batch_size_per_rank": self.batch_size_per_rank,
            "options": self.options.to_dict(),
            "cache_fraction": self.cache_fraction,
            "tables": [t.to_dict() for t in self.tables],
            "ranks": [r.to_dict() for r in self.ranks],
            "summary": {
                "max_cost": self.max_cost,
                "mean_cost": self.mean_cost,
                "max_over_mean": self.max_over_mean,
                "critical_path": {
                    "rank": self.critical_rank,
                    "compute_cost": crit.compute_cost,
                    "comms_cost": crit.comms_cost,
                    "tables": list(self.critical_tables),
                },
                "planning_seconds": self.planning_seconds,
                "sharding_types": _count(t.sharding_type for t in self.tables),
                "tiers": _count(s.tier for t in self.tables for s in t.shards),
            },
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ShardingPlan:
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise ConfigError(f"format_version={version!r} is not allowed: expected "
                              f"{FORMAT_VERSION}")
        summary = d["summary"]
        opts = dict(d["options"])
        opts["split_fractions"] = tuple(opts["split_fractions"])
        return cls(
            topology=Topology.from_dict(d["topology"]),
            # plans saved before the field was renamed say "batch_size"
            batch_size_per_rank=int(d["batch_size_per_rank"] if "batch_size_per_rank" in d
                                    else d["batch_size"]),
            options=PlannerOptions(**{**opts, "comms": CommsConfig.coerce(opts["comms"])}),
            cache_fraction=float(d["cache_fraction"]),
            tables=tuple(TablePlan.from_dict(t) for t in d["tables"]),
            ranks=tuple(RankPlan.from_dict(r) for r in d["ranks"]),
            critical_rank=int(summary["critical_path"]["rank"]),
            critical_tables=tuple(summary["critical_path"]["tables"]),
            planning_seconds=float(summary.get("planning_seconds", 0.0)),
        )

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path

    @classmethod
    def load(cls, path: str | Path) -> ShardingPlan:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))
