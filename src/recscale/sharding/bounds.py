"""A lower bound on the slowest rank's cost of any plan of a set of tables, so a report can say
how far a plan is from the best possible.

No plan's slowest rank costs less than

- the cheapest total over all ranks divided by the ranks: each table's cheapest sharding option
  per tier among those whose widest shard one rank's tier can hold, and the tables spread over
  the tiers as a linear programme would (any fraction of a table in any tier, at most
  ``memory_fraction`` of every tier's capacity over all ranks filled with weights and optimizer
  state, a slow tier's shards with a cache of ``cache_fraction`` of their bytes in the compute
  tier, or any of several cache fractions where a plan's tables have different ones), nor
- the largest piece (``piece_bound``): the costliest of the tables' smallest pieces (each
  table's most finely split option: row-wise over every rank, columns at the minimum width,
  ...), or, larger where tables split over every rank put a floor under every rank, a piece plus
  the floor of the tables that cannot be cut that small, or, larger where a table's smaller
  pieces cost more in all, the least over its options of the larger of the option's piece and
  the mean rank cost it implies, or the same for every table at once (``least_target``: a target
  T, every table's cheapest option with pieces of at most T, the mean those imply).

The piece assumes the compute tier (slower tiers only cost more). Both use the cost model's terms,
so they bound the planner's own estimate, not measured time; I/O buffers are left out of memory
(which can only lower the bound).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from .cost import CW, DP, RW, TWCW, TWRW, CostModel
from .option_grid import OptionGrid, TableArrays, enumerate_options
from .topology import Topology
from .types import TIERS, PlannerOptions, TableSpec

# Tables paired in the piece bound (the largest bounds alone; pairs grow as their square).
PAIR_TABLES = 12
# A plan's slowest rank above this x both the bound's other terms and its mean: the coupled-
# pieces term (``coupled.py``) is worked out too (below it the plan is within the rule anyway).
COUPLED_ABOVE = 1.05


@dataclass(frozen=True)
class LowerBound:
    """Seconds: ``value`` = max(``total_over_ranks``, ``largest_piece``, ``coupled``);
    ``piece_table``: the table whose piece sets ``largest_piece``; ``spread_floor``: the part of
    ``largest_piece`` that tables split over every rank put on each rank beside that piece;
    ``coupled``: the least slowest rank of pieces that memory makes share ranks (``coupled.py``;
    0 where not worked out)."""

    value: float
    total_over_ranks: float
    largest_piece: float
    piece_table: str
    spread_floor: float = 0.0
    coupled: float = 0.0


def lower_bound(tables: Sequence[TableSpec], topo: Topology, batch_size: int,
                options: PlannerOptions, cache_fraction: float | Sequence[float] = 0.0
                ) -> LowerBound:
    """``cache_fraction``: the cache of a slow tier's shards, or the cache fractions a plan's
    slow tables may take (each table any of them)."""
    caches = _caches(cache_fraction)
    arrays = TableArrays.build(list(tables))
    grid = enumerate_options(arrays, topo, options)
    cm = CostModel(topo, batch_size, options)
    ct = TIERS.index(topo.compute_tier)
    tiers = [TIERS.index(t) for t in topo.tiers]
    n, m = grid.valid.shape
    W = topo.world_size
    N, L, F, U = arrays.N[:, None], arrays.L[:, None], arrays.F[:, None], arrays.U[:, None]
    # (tier, cache) settings a table may take: the compute tier without a cache, the others
    # with any of ``caches``
    settings = [(t, c) for t in tiers for c in ((0.0,) if t == ct else caches)]
    total = {st: np.full((n, m), np.inf) for st in settings}
    usable = {t: topo.capacity(TIERS[t]) * options.memory_fraction for t in tiers}
    for j in range(m):
        kind, k = int(grid.kind[j]), int(grid.k[j])
        ok = grid.valid[:, j]
        shards = W if kind == DP else grid.n_shards[:, j]
        wide = cm.storage_bytes(grid.wide_rows[:, j], grid.wide_cols[:, j])
        for t, c in settings:
            if kind == DP and t != ct:
                continue  # replicas live in the compute tier
            mean = cm.shards(kind, N, L, F, grid.mean_rows[:, j:j + 1],
                             grid.mean_cols[:, j:j + 1], k, t, c, U).total[:, 0]
            # an option whose widest shard no rank's tier can hold is no plan's
            total[(t, c)][:, j] = np.where(ok & (wide <= usable[t]), mean * shards, np.inf)
    cost = np.stack([np.min(total[st], axis=1) for st in settings], axis=1)  # (n, settings)
    tot = _spread(cost, cm.storage_bytes(arrays.N, arrays.D), topo, settings, ct,
                  options.memory_fraction) / W
    piece, i, floor = piece_bound(arrays, grid, cm, W, ct, usable, caches,
                                  options.column_granularity)
    return LowerBound(max(tot, piece), tot, piece, tables[i].name, floor)


def piece_bound(arrays: TableArrays, grid: OptionGrid, cm: CostModel, W: int, ct: int,
                usable: dict[int, float], cache_fraction: float | Sequence[float],
                granularity: int, at_once: bool = True) -> tuple[float, int, float]:
    """(seconds, table, floor): no plan's slowest rank costs less than the larger of

    - the costliest table's smallest piece (each table's most finely split option), and
    - a piece P plus what every table that cannot be cut into pieces of at most P puts on every
      rank: such a table takes an option split over every rank (row-wise, column-wise into as
      many pieces as ranks, replicated), one shard on each, so the rank holding P holds its
      smallest shard too. The least such sum over P; and
    - for each table, the least over its options of the larger of the option's widest piece and
      the mean rank cost if it takes that option and every other table its cheapest (a finer
      option that makes smaller pieces often costs more in all: its pieces cannot be had
      without that mean); and the same for every table at once: the least over a target T
      of the larger of T and the mean rank cost when every table takes its cheapest option
      whose widest piece is at most T (``least_target``; ``at_once=False`` leaves it out); and
    - for pairs of the ``PAIR_TABLES`` tables with the largest such bounds, the least over both
      tables' options of the same with both options' pieces and totals, and, where the two
      options have more pieces together than there are ranks, a narrowest piece of each on one
      rank.

    A shard costs what it costs in the fastest tier (``usable``: bytes per rank and tier index)
    whose rank can hold the option's widest shard, with a cache of ``cache_fraction`` below the
    compute tier where the compute tier can hold it (given several: the largest it can hold, the
    cheapest); options no tier can hold are left out. ``table``:
    the table whose piece sets the bound; ``floor``: the spread load beside it (0 when the first
    term is the larger)."""
    n, m = grid.valid.shape
    caches = _caches(cache_fraction)
    N, L, F, U = arrays.N[:, None], arrays.L[:, None], arrays.F[:, None], arrays.U[:, None]
    piece = np.full((n, m), np.inf)  # widest shard
    least = np.full((n, m), np.inf)  # narrowest shard, options spanning every rank only
    narrow = np.full((n, m), np.inf)  # narrowest shard, every option
    total = np.full((n, m), np.inf)  # all shards
    count = np.where(grid.kind[None, :] == DP, W, grid.n_shards)  # shards on distinct ranks
    for j in range(m):
        kind, k = int(grid.kind[j]), int(grid.k[j])
        wide = cm.storage_bytes(grid.wide_rows[:, j], grid.wide_cols[:, j])
        # the fastest tier that can hold the widest shard (replicas: the compute tier only)
        tier = np.full(n, -1)
        for t in sorted(usable, reverse=True):
            if kind != DP or t == ct:
                tier = np.where(wide <= usable[t], t, tier)
        ok = grid.valid[:, j] & (tier >= 0)
        tier = np.where(ok, tier, ct)[:, None]
        # a slow tier's shard has its cache in the compute tier, or none if it cannot hold it
        c = np.zeros((n, 1))
        for cf in caches:  # ascending: the largest that fits
            c = np.where((tier != ct) & (cf * wide[:, None] <= usable.get(ct, 0.0)), cf, c)
        piece[:, j] = np.where(ok, cm.shards(kind, N, L, F, grid.wide_rows[:, j:j + 1],
                                             grid.wide_cols[:, j:j + 1], k, tier, c,
                                             U).total[:, 0], np.inf)
        mean = cm.shards(kind, N, L, F, grid.mean_rows[:, j:j + 1], grid.mean_cols[:, j:j + 1], k,
                         tier, c, U).total[:, 0]
        total[:, j] = np.where(ok, mean * (W if kind == DP else grid.n_shards[:, j]), np.inf)
        spans = ok & ((grid.n_shards[:, j] >= W) if kind != DP else True)
        rows, cols = arrays.N.copy(), arrays.D.copy()
        if kind in (RW, TWRW):
            rows = arrays.N - (grid.n_shards[:, j] - 1) * grid.wide_rows[:, j]
        elif kind in (CW, TWCW) and k > 1:
            cols = (arrays.D // granularity // k) * granularity
        narrow[:, j] = np.where(ok, cm.shards(kind, N, L, F, rows[:, None], cols[:, None], k,
                                              tier, c, U).total[:, 0], np.inf)
        least[:, j] = np.where(spans, narrow[:, j], np.inf)
    if n == 0:
        return 0.0, 0, 0.0
    smallest = np.min(piece, axis=1)
    first = int(np.argmax(smallest))
    best = (float(smallest[first]), first, 0.0)
    spanning = np.isfinite(least)
    p = np.min(np.where(spanning, np.inf, piece), axis=1)  # least piece of an unspread option
    s = np.min(least, axis=1)  # least shard of a spread option
    coupled = np.inf, first, 0.0
    for P in np.unique(np.concatenate([[0.0], p[np.isfinite(p)]])):
        need = p > P
        if not np.isfinite(s[need]).all():
            continue
        floor = float(s[need].sum())
        if P + floor < coupled[0]:
            at = int(np.flatnonzero(p == P)[0]) if P > 0 else first
            coupled = (float(P + floor), at, floor)
    if coupled[0] > best[0]:
        best = coupled
    cheapest = np.min(total, axis=1)
    rest = float(cheapest[np.isfinite(cheapest)].sum()) - np.where(np.isfinite(cheapest),
                                                                     cheapest, 0.0)
    with_mean = np.min(np.maximum(piece, (rest[:, None] + total) / W), axis=1)
    i = int(np.argmax(with_mean))
    if with_mean[i] > best[0]:
        best = (float(with_mean[i]), i, 0.0)
    if at_once:
        v, i = least_target(piece, total, W)
        if v > best[0]:
            best = (v, i, 0.0)
    # pairs of the tables with the largest such bounds: options with more pieces together than
    # ranks put a piece of each on some rank
    top = np.lexsort((np.arange(n), -with_mean))[:PAIR_TABLES]
    for a_i, a in enumerate(top):
        for b in top[a_i + 1:]:
            both = np.maximum(piece[a][:, None], piece[b][None, :])
            both = np.maximum(both, (rest[a] - cheapest[b] + total[a][:, None]
                                     + total[b][None, :]) / W)
            share = count[a][:, None] + count[b][None, :] > W
            both = np.where(share, np.maximum(both, narrow[a][:, None] + narrow[b][None, :]),
                            both)
            v = float(np.min(both))
            if v > best[0]:
                best = (v, int(a), 0.0)
    return best


def least_target(piece: np.ndarray, total: np.ndarray, W: int) -> tuple[float, int]:
    """(seconds, table): the least over a target T of max(T, the mean rank cost when every
    table takes its cheapest option whose widest piece is at most T), and the table whose
    option changes at that T. Each table's least total over options with pieces up to T
    falls in steps as T grows; the sum is swept over those steps."""
    ok = np.isfinite(piece) & np.isfinite(total)
    has = ok.any(axis=1)
    if not has.any():
        return 0.0, 0
    P = np.where(ok, piece, np.inf)[has]
    C = np.where(ok, total, np.inf)[has]
    idx = np.argsort(P, axis=1, kind="stable")
    Ps = np.take_along_axis(P, idx, axis=1)
    least = np.minimum.accumulate(np.take_along_axis(C, idx, axis=1), axis=1)
    t0 = float(Ps[:, 0].max())  # below it some table has no option at all
    at0 = np.sum(Ps <= t0, axis=1) - 1
    rows = np.arange(P.shape[0])
    base = float(least[rows, at0].sum())
    prev = np.concatenate([np.full((P.shape[0], 1), np.inf), least[:, :-1]], axis=1)
    step = (Ps > t0) & np.isfinite(Ps) & (least < prev)
    r, c = np.nonzero(step)
    T = Ps[r, c]
    order = np.lexsort((r, T))
    drop = (least[r, c] - prev[r, c])[order]
    Ts = np.concatenate([[t0], T[order]])
    sums = base + np.concatenate([[0.0], np.cumsum(drop)])
    v = np.maximum(Ts, sums / W)
    k = int(np.argmin(v))
    tables = np.flatnonzero(has)
    tab = int(tables[np.argmax(Ps[:, 0])]) if k == 0 else int(tables[r[order][k - 1]])
    return float(v[k]), tab


def _caches(cache_fraction: float | Sequence[float]) -> tuple[float, ...]:
    """The distinct cache fractions, ascending."""
    if isinstance(cache_fraction, (int, float)):
        return (float(cache_fraction),)
    return tuple(sorted({float(c) for c in cache_fraction})) or (0.0,)


def _spread(cost: np.ndarray, nbytes: np.ndarray, topo: Topology,
            settings: list[tuple[int, float]], ct: int, memory_fraction: float) -> float:
    """The least total cost of spreading fractions of the tables over the (tier, cache)
    ``settings`` (a linear programme); the cheapest setting per table when everything fits the
    compute tier."""
    n, T = cost.shape
    tiers = sorted({t for t, _ in settings})
    cap = np.array([topo.capacity(TIERS[t]) * topo.world_size * memory_fraction for t in tiers])
    if T == 1 or nbytes.sum() <= cap[tiers.index(ct)]:
        return float(np.min(cost, axis=1).sum())
    from scipy.optimize import linprog

    c = np.where(np.isfinite(cost), cost, 1e30).reshape(-1)  # x[i, setting] row-major
    A_eq = np.kron(np.eye(n), np.ones(T))
    A_ub = np.zeros((len(tiers), n * T))
    for k, (t, cf) in enumerate(settings):
        A_ub[tiers.index(t), k::T] = nbytes
        if t != ct:  # a slow tier's cache lives in the compute tier
            A_ub[tiers.index(ct), k::T] += cf * nbytes
    res = linprog(c, A_ub=A_ub, b_ub=cap, A_eq=A_eq, b_eq=np.ones(n), bounds=(0, 1),
                  method="highs")
    if not res.success:  # the tables do not fit at all: the planner says so itself
        return float(np.min(cost, axis=1).sum())
    return float(res.fun)


def plan_lower_bound(plan, coupled: bool = True) -> LowerBound:
    """The bound for a plan's tables (their constraints unknown to the plan: every option is
    allowed, which can only lower the bound, so it stays a bound). With ``coupled``, where the
    plan's slowest rank is more than ``COUPLED_ABOVE`` x both that bound and the plan's mean
    and the mix is small (``coupled.CELLS``), the coupled-pieces term too (over every cache
    fraction the planner may choose; the plan's maximum its upper limit)."""
    specs = [TableSpec(t.name, t.num_embeddings, t.embedding_dim, t.pooling_factor,
                       feature_names=t.feature_names, distinct_fraction=t.distinct_fraction)
             for t in plan.tables]
    caches = sorted({plan.cache_fraction} | {s.cache_fraction for t in plan.tables
                                             for s in t.shards
                                             if s.tier != plan.topology.compute_tier})
    lb = lower_bound(specs, plan.topology, plan.batch_size_per_rank, plan.options, caches)
    if not coupled or plan.max_cost <= COUPLED_ABOVE * max(lb.value, plan.mean_cost):
        return lb
    from .context import PlanContext
    from .coupled import coupled_bound
    from .tiering import cache_candidates

    # every cache fraction the planner may choose, not only this plan's
    o = plan.options
    ctx = PlanContext.build(TableArrays.build(specs), plan.topology, plan.batch_size_per_rank, o)
    v = coupled_bound(ctx, sorted(set(cache_candidates(o)) | set(caches)), plan.max_cost)
    if v is None:
        return lb
    return replace(lb, value=max(lb.value, v), coupled=v)
