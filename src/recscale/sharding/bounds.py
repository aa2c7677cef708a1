"""A lower bound on the slowest rank's cost of any plan of a set of tables, so a report can say
how far a plan is from the best possible.

No plan's slowest rank costs less than

- the cheapest total over all ranks divided by the ranks: each table's cheapest sharding option
  per tier, and the tables spread over the tiers as a linear programme would (any fraction of a
  table in any tier, at most ``memory_fraction`` of every tier's capacity over all ranks filled
  with weights and optimizer state, a slow tier's shards with a cache of ``cache_fraction`` of
  their bytes in the compute tier), nor
- the largest piece that cannot be split further: for each table, the costliest shard of its
  most finely split option (row-wise over every rank, columns at the minimum width, ...), the
  cheapest such over the options its constraints allow; the largest over tables.

The piece assumes the compute tier (slower tiers only cost more). Both use the cost model's terms,
so they bound the planner's own estimate, not measured time; I/O buffers are left out of memory
(which can only lower the bound).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .cost import DP, CostModel
from .option_grid import TableArrays, enumerate_options
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
                options: PlannerOptions, cache_fraction: float = 0.0) -> LowerBound:
    arrays = TableArrays.build(list(tables))
    grid = enumerate_options(arrays, topo, options)
    cm = CostModel(topo, batch_size, options)
    ct = TIERS.index(topo.compute_tier)
    tiers = [TIERS.index(t) for t in topo.tiers]
    n, m = grid.valid.shape
    W = topo.world_size
    N, L, F, U = arrays.N[:, None], arrays.L[:, None], arrays.F[:, None], arrays.U[:, None]
    total = {t: np.full((n, m), np.inf) for t in tiers}
    piece = np.full((n, m), np.inf)
    for j in range(m):
        kind, k = int(grid.kind[j]), int(grid.k[j])
        ok = grid.valid[:, j]
        shards = W if kind == DP else grid.n_shards[:, j]
        for t in tiers:
            if kind == DP and t != ct:
                continue  # replicas live in the compute tier
            c = 0.0 if t == ct else cache_fraction
            mean = cm.shards(kind, N, L, F, grid.mean_rows[:, j:j + 1],
                             grid.mean_cols[:, j:j + 1], k, t, c, U).total[:, 0]
            total[t][:, j] = np.where(ok, mean * shards, np.inf)
        wide = cm.shards(kind, N, L, F, grid.wide_rows[:, j:j + 1], grid.wide_cols[:, j:j + 1],
                         k, ct, 0.0, U).total[:, 0]
        piece[:, j] = np.where(ok, wide, np.inf)
    cost = np.stack([np.min(total[t], axis=1) for t in tiers], axis=1)  # (n, tiers)
    tot = _spread(cost, cm.storage_bytes(arrays.N, arrays.D), topo, tiers, ct,
                  options.memory_fraction, cache_fraction) / W
    per_table = np.min(piece, axis=1)
    i = int(np.argmax(per_table))
    return LowerBound(max(tot, float(per_table[i])), tot, float(per_table[i]), tables[i].name)


def _spread(cost: np.ndarray, nbytes: np.ndarray, topo: Topology, tiers: list[int], ct: int,
            memory_fraction: float, cache_fraction: float) -> float:
    """The least total cost of spreading fractions of the tables over the tiers (a linear
    programme); the compute tier alone when everything fits there."""
    n, T = cost.shape
    best = cost[:, tiers.index(ct)]
    cap = np.array([topo.capacity(TIERS[t]) * topo.world_size * memory_fraction for t in tiers])
    if T == 1 or nbytes.sum() <= cap[tiers.index(ct)]:
        return float(np.min(cost, axis=1).sum()) if T > 1 else float(best.sum())
    from scipy.optimize import linprog

    c = np.where(np.isfinite(cost), cost, 1e30).reshape(-1)  # x[i, t] row-major
    A_eq = np.kron(np.eye(n), np.ones(T))
    A_ub = np.zeros((T, n * T))
    for k, t in enumerate(tiers):
        A_ub[k, k::T] = nbytes
        if t != ct:  # a slow tier's cache lives in the compute tier
            A_ub[tiers.index(ct), k::T] += cache_fraction * nbytes
    res = linprog(c, A_ub=A_ub, b_ub=cap, A_eq=A_eq, b_eq=np.ones(n), bounds=(0, 1),
                  method="highs")
    if not res.success:  # the tables do not fit at all: the planner says so itself
        return float(np.min(cost, axis=1).sum())
    return float(res.fun)


def plan_lower_bound(plan) -> LowerBound:
    """The bound for a plan's tables (their constraints unknown to the plan: every option is
    allowed, which can only lower the bound, so it stays a bound)."""
    specs = [TableSpec(t.name, t.num_embeddings, t.embedding_dim, t.pooling_factor,
                       feature_names=t.feature_names, distinct_fraction=t.distinct_fraction)
             for t in plan.tables]
    return lower_bound(specs, plan.topology, plan.batch_size_per_rank, plan.options,
                       plan.cache_fraction)
