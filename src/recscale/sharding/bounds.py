"""A lower bound on the slowest rank's cost of any plan of a set of tables, so a report can say
how far a plan is from the best possible.

No plan's slowest rank costs less than

- the cheapest total over all ranks (each table's cheapest sharding option, every shard in the
  compute tier with its cost-model cost, summed) divided by the ranks, nor
- the largest piece that cannot be split further: for each table, the costliest shard of its
  most finely split option (row-wise over every rank, columns at the minimum width, ...), the
  cheapest such over the options its constraints allow; the largest over tables.

Both assume the compute tier for every shard (slower tiers only cost more) and the cost model's
terms, so they bound the planner's own estimate, not measured time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .cost import DP, CostModel
from .enumerate import TableArrays, enumerate_options
from .topology import Topology
from .types import TIERS, PlannerOptions, TableSpec


@dataclass(frozen=True)
class LowerBound:
    """Seconds: ``value`` = max(``total_over_ranks``, ``largest_piece``); ``piece_table``: the
    table whose smallest possible piece is the largest."""

    value: float
    total_over_ranks: float
    largest_piece: float
    piece_table: str


def lower_bound(tables: Sequence[TableSpec], topo: Topology, batch_size: int,
                options: PlannerOptions) -> LowerBound:
    arrays = TableArrays.build(list(tables))
    grid = enumerate_options(arrays, topo, options)
    cm = CostModel(topo, batch_size, options)
    ct = TIERS.index(topo.compute_tier)
    n, m = grid.valid.shape
    total = np.full((n, m), np.inf)
    piece = np.full((n, m), np.inf)
    W = topo.world_size
    N, L, F = arrays.N[:, None], arrays.L[:, None], arrays.F[:, None]
    for j in range(m):
        kind, k = int(grid.kind[j]), int(grid.k[j])
        wide = cm.shards(kind, N, L, F, grid.wide_rows[:, j:j + 1], grid.wide_cols[:, j:j + 1],
                         k, ct, 0.0).total[:, 0]
        mean = cm.shards(kind, N, L, F, grid.mean_rows[:, j:j + 1], grid.mean_cols[:, j:j + 1],
                         k, ct, 0.0).total[:, 0]
        ok = grid.valid[:, j]
        shards = W if kind == DP else grid.n_shards[:, j]
        total[:, j] = np.where(ok, mean * shards, np.inf)
        piece[:, j] = np.where(ok, wide, np.inf)
    tot = float(np.min(total, axis=1).sum()) / W
    per_table = np.min(piece, axis=1)
    i = int(np.argmax(per_table))
    return LowerBound(max(tot, float(per_table[i])), tot, float(per_table[i]), tables[i].name)


def plan_lower_bound(plan) -> LowerBound:
    """The bound for a plan's tables (their constraints unknown to the plan: every option is
    allowed, which can only lower the bound, so it stays a bound)."""
    specs = [TableSpec(t.name, t.num_embeddings, t.embedding_dim, t.pooling_factor,
                       feature_names=t.feature_names) for t in plan.tables]
    return lower_bound(specs, plan.topology, plan.batch_size_per_rank, plan.options)
