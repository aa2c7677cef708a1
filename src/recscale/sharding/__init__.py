"""Embedding-table sharding planner (pure Python + numpy; no torch, Kedro or MLflow).

>>> from recscale.sharding import TableSpec, Topology, plan_sharding
>>> plan = plan_sharding([TableSpec("t0", 1_000_000, 128)], Topology.preset("zionex"), 512)
>>> plan.table("t0").sharding_type in SHARDING_TYPES
True

See docs/sharding.md for the cost model, the algorithm (one module per stage, driven by
``partition.solve``) and the topology presets.
"""

from .config import ShardingConfig
from .from_data import table_specs_from_manifest
from .plan import PlanMismatchError, RankPlan, ShardingPlan, ShardSpec, TablePlan
from .planner import plan_sharding
from .report import format_report, save_chart
from .topology import PRESETS, Topology
from .types import (
    OPTIMIZER_STATE,
    SHARDING_TYPES,
    TIERS,
    WEIGHT_PRECISIONS,
    PlannerError,
    PlannerOptions,
    ShardingType,
    TableConstraints,
    TableSpec,
)

__all__ = [
    "OPTIMIZER_STATE",
    "PRESETS",
    "SHARDING_TYPES",
    "TIERS",
    "WEIGHT_PRECISIONS",
    "PlanMismatchError",
    "PlannerError",
    "PlannerOptions",
    "RankPlan",
    "ShardSpec",
    "ShardingConfig",
    "ShardingPlan",
    "ShardingType",
    "TablePlan",
    "TableConstraints",
    "TableSpec",
    "Topology",
    "format_report",
    "plan_sharding",
    "save_chart",
    "table_specs_from_manifest",
]
