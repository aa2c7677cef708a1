"""``plan_sharding``: validate inputs, run the partitioner, assemble a ``ShardingPlan``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from numbers import Integral
from typing import Any

import numpy as np

from recscale.config import ConfigError, check

from .cost import DP
from .option_grid import TableArrays
from .partition import solve
from .plan import RankPlan, ShardingPlan, ShardSpec, TablePlan
from .shards import Solution
from .topology import Topology
from .types import SHARDING_TYPES, TIERS, PlannerOptions, TableSpec


def coerce_tables(tables: Iterable[TableSpec | Mapping[str, Any]]) -> list[TableSpec]:
    """TableSpecs from specs or dicts; names must be unique."""
    if isinstance(tables, (str, bytes, Mapping)) or not isinstance(tables, Iterable):
        raise ConfigError(f"tables={tables!r} is not allowed: expected a list of TableSpec or "
                          "table dicts")
    out: list[TableSpec] = []
    for i, t in enumerate(tables):
        if isinstance(t, TableSpec):
            out.append(t)
        elif isinstance(t, Mapping):
            out.append(TableSpec.from_dict(t, where=f"tables[{i}]"))
        else:
            raise ConfigError(f"tables[{i}]={t!r} is not allowed: expected a TableSpec or a dict")
    if not out:
        raise ConfigError("tables=[] is not allowed: expected at least one table")
    seen: set[str] = set()
    for t in out:
        if t.name in seen:
            raise ConfigError(f"table name {t.name!r} is not allowed twice: expected unique names")
        seen.add(t.name)
    return out


def coerce_topology(topology: Topology | str) -> Topology:
    if isinstance(topology, Topology):
        return topology
    if isinstance(topology, str):
        return Topology.preset(topology)
    raise ConfigError(f"topology={topology!r} is not allowed: expected a Topology or a preset name")


def plan_sharding(
    tables: Iterable[TableSpec | Mapping[str, Any]],
    topology: Topology | str,
    batch_size_per_rank: int,
    options: PlannerOptions | Mapping[str, Any] | None = None,
    **overrides: Any,
) -> ShardingPlan:
    """Plan how every table is sharded and where every shard lives.

    ``batch_size_per_rank`` is the per-rank (local) batch; the plan records it
    (``ShardingPlan.batch_size_per_rank``) and ``ShardingPlan.check_matches`` compares it with a run's. ``options`` / keyword overrides are the fields of
    ``PlannerOptions`` (optimizer, weight_precision, comms, memory_fraction, cache_fraction,
    strategy, ...). Raises ``ConfigError`` (a ValueError) for bad inputs and ``PlannerError`` when
    the tables cannot fit.
    """
    start = time.perf_counter()
    specs = coerce_tables(tables)
    topo = coerce_topology(topology)
    b = batch_size_per_rank
    # the message keeps the name "batch_size" that callers and tests have always matched
    check(not isinstance(b, bool) and isinstance(b, Integral) and b > 0, "batch_size", b,
          "a positive integer")
    opts = PlannerOptions.coerce(options, **overrides)
    arrays = TableArrays.build(specs)
    sol = solve(arrays, topo, int(b), opts)
    plan = _assemble(specs, topo, int(b), opts, sol)
    object.__setattr__(plan, "planning_seconds", time.perf_counter() - start)
    return plan


def _assemble(specs, topo: Topology, batch_size_per_rank: int, opts: PlannerOptions,
              sol: Solution) -> ShardingPlan:
    W = topo.world_size
    lay = sol.layout
    ct = topo.compute_tier
    per_table: list[list[ShardSpec]] = [[] for _ in specs]
    tier_names = TIERS
    # plain Python lists are much faster to read element-wise than numpy arrays
    cols = [x.tolist() for x in (lay.table, lay.rank, lay.row_off, lay.row_len, lay.col_off,
                                 lay.col_len, lay.tier, lay.cache, lay.compute, lay.comms,
                                 lay.storage, lay.extra)]
    for tab, rank, ro, rl, co, cl, tier, cache, comp, comm, storage, extra in zip(*cols):
        per_table[tab].append(ShardSpec(
            rank=rank, row_offset=ro, row_length=rl, col_offset=co, col_length=cl,
            tier=tier_names[tier], cache_fraction=cache, compute_cost=comp,
            comms_cost=comm, storage_bytes=storage, compute_tier_bytes=extra))
    dp_pos = {int(t): i for i, t in enumerate(sol.dp_tables)}
    table_plans = []
    for i, spec in enumerate(specs):
        if i in dp_pos:
            j = dp_pos[i]
            nbytes = float(sol.dp_need[j].sum())
            shards = tuple(ShardSpec(
                rank=r, row_offset=0, row_length=spec.num_embeddings, col_offset=0,
                col_length=spec.embedding_dim, tier=ct, cache_fraction=0.0,
                compute_cost=float(sol.dp_compute[j]), comms_cost=float(sol.dp_comms[j]),
                storage_bytes=float(sol.dp_storage[j]), compute_tier_bytes=nbytes
                - float(sol.dp_storage[j])) for r in range(W))
            kind = SHARDING_TYPES[DP]
        else:
            shards = tuple(sorted(per_table[i], key=lambda s: (s.row_offset, s.col_offset)))
            kind = SHARDING_TYPES[int(sol.kinds[i])]
        table_plans.append(TablePlan(
            name=spec.name, sharding_type=kind, num_embeddings=spec.num_embeddings,
            embedding_dim=spec.embedding_dim, pooling_factor=spec.pooling_factor,
            feature_names=spec.feature_names, shards=shards,
            distinct_fraction=spec.distinct_fraction))
    ranks = tuple(
        RankPlan(rank=r, compute_cost=float(sol.compute[r]), comms_cost=float(sol.comms[r]),
                 hbm_bytes=float(sol.memory[0, r]), ddr_bytes=float(sol.memory[1, r]),
                 ssd_bytes=float(sol.memory[2, r]))
        for r in range(W))
    load = sol.compute + sol.comms
    crit = int(np.argmax(load))
    on_crit = [(-s.cost, tp.name) for tp in table_plans for s in tp.shards if s.rank == crit]
    crit_tables = tuple(name for _, name in sorted(on_crit)[:3])
    return ShardingPlan(topology=topo, batch_size_per_rank=batch_size_per_rank, options=opts,
                        cache_fraction=float(sol.cache_fraction), tables=tuple(table_plans),
                        ranks=ranks, critical_rank=crit, critical_tables=crit_tables)

