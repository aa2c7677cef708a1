"""What every planning stage reads: ``PlanContext`` and the option costs.

In: the tables (``TableArrays``), the topology, the per-rank batch and the ``PlannerOptions``.
Out: ``PlanContext``, read-only for the whole run (cost model, option grid, tier budgets per
rank, ranks per host); ``option_costs`` prices every (table, option) pair for given tiers and
cache fractions (``OptionCosts``). No stage writes to the context (its arrays are read-only) but
for ``groups``, the memo of cut shards that ``shards.build_layout`` fills.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cost import DP, TIER_INDEX, CostModel
from .option_grid import OptionGrid, TableArrays, enumerate_options
from .topology import Topology
from .types import TIERS, PlannerOptions

INF = np.inf


def gb(x: float) -> str:
    return f"{x / 1e9:,.2f} GB"


def _read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class PlanContext:
    """Inputs of one planning run and what follows from them alone."""

    tables: TableArrays
    topo: Topology
    opts: PlannerOptions
    model: CostModel
    grid: OptionGrid
    W: int  # ranks
    Lw: int  # ranks per host
    ct: int  # compute tier (index into TIERS)
    avail: tuple[int, ...]  # tiers with capacity, fastest first
    capacity: np.ndarray  # (3,) bytes per rank and tier
    budget: np.ndarray  # (3,) usable bytes per rank and tier (capacity x memory_fraction)
    host_of: np.ndarray  # (W,) host of each rank
    n: int  # tables
    dp_col: int  # the data-parallel option's column in the grid
    # every table's shards per (table, option, tier, cache) once cut (``shards.build_layout``):
    # a memo, the one thing written during a run; what it holds follows from the inputs alone
    groups: dict = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, tables: TableArrays, topo: Topology, batch_size_per_rank: int,
              opts: PlannerOptions) -> PlanContext:
        grid = enumerate_options(tables, topo, opts)
        for name in ("kind", "k", "valid", "n_shards", "wide_rows", "wide_cols", "mean_rows",
                     "mean_cols"):
            _read_only(getattr(grid, name))
        cap = np.array([topo.capacity(t) for t in TIERS])
        W = topo.world_size
        return cls(
            tables=tables, topo=topo, opts=opts, model=CostModel(topo, batch_size_per_rank, opts),
            grid=grid, W=W, Lw=topo.local_world_size, ct=TIER_INDEX[topo.compute_tier],
            avail=tuple(TIER_INDEX[t] for t in topo.tiers), capacity=_read_only(cap),
            budget=_read_only(cap * opts.memory_fraction),
            host_of=_read_only(np.arange(W) // topo.local_world_size), n=len(tables.N),
            dp_col=int(np.flatnonzero(grid.kind == DP)[0]),
        )


@dataclass(frozen=True)
class OptionCosts:
    """(tables, options) arrays: largest shard cost, total cost, widest shard's bytes in its tier
    and in the compute tier, and all shards' I/O bytes."""

    max: np.ndarray
    total: np.ndarray
    wide_storage: np.ndarray
    wide_ct: np.ndarray
    total_io: np.ndarray


def option_costs(ctx: PlanContext, tier: np.ndarray, cache: np.ndarray) -> OptionCosts:
    """Every option of every table priced with the table's ``tier`` and ``cache`` fraction
    (data-parallel options always in the compute tier without a cache)."""
    g, t, m = ctx.grid, ctx.tables, ctx.model
    shape = (ctx.n, g.m)
    mx, tot, wst, wct, tio = (np.empty(shape) for _ in range(5))
    for j in range(g.m):
        kind, k = int(g.kind[j]), int(g.k[j])
        tj = np.full(ctx.n, ctx.ct) if kind == DP else tier
        cj = np.zeros(ctx.n) if kind == DP else cache
        w = m.shards(kind, t.N, t.L, t.F, g.wide_rows[:, j], g.wide_cols[:, j], k, tj, cj, t.U)
        a = m.shards(kind, t.N, t.L, t.F, g.mean_rows[:, j], g.mean_cols[:, j], k, tj, cj, t.U)
        mx[:, j] = w.total
        tot[:, j] = a.total * g.n_shards[:, j]
        wst[:, j] = w.storage
        wct[:, j] = w.cache + w.io
        tio[:, j] = a.io * g.n_shards[:, j]
    return OptionCosts(mx, tot, wst, wct, tio)
