"""A lower bound for small mixes where memory decides which pieces share a rank: the least
slowest rank of any plan, proven by CP-SAT.

The bound's other terms (``bounds.py``) look at one piece, a pair of tables, or the total; none
sees that a table which fills most of a rank's fast memory on every rank it takes leaves only
the other ranks, or the room beside its pieces, for the rest. On a few tables over a few ranks
that can put the best plan's slowest rank well above the mean and above every piece (the
property tests' mix 160: 4 tables on 12 ranks, best 1.20x the mean). Here every plan is a
solution of one model: for every table one option (every sharding type and split, replicated
included; every tier, a slow tier with any of the plan's cache fractions), each piece on one
rank, at most one piece of a table per rank, a host-bound table's pieces on one host, every
tier's bytes within its usable bytes on every rank. The solver's proven lower bound on that
model's least slowest rank is a lower bound on every plan's.

It stays a bound because the model only relaxes: costs and bytes are rounded down and budgets
up; an option or a piece is left out only where it alone would cost ``upper`` (a known plan's
slowest rank) or more, and the answer is capped at ``upper``, so a plan below it keeps every
option it uses. The solver may stop before it proves its best (a limit of deterministic time,
the same answer on any machine); the bound it has proven by then is still one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .context import PlanContext
from .cost import DP
from .cpsat import PlacementModel, cut, option_keys

# (candidate piece, rank) pairs at most, as the exact stage (``exact.CELLS``)
CELLS = 40_000
# CP-SAT's deterministic time limit (about a second of one core's work each)
WORK = 10.0
# costs in 1/SCALE of ``upper``; bytes in 1/SCALE of a rank's usable bytes
SCALE = 100_000


def coupled_bound(ctx: PlanContext, caches: Sequence[float], upper: float) -> float | None:
    """Seconds: no plan's slowest rank costs less (at most ``upper``); None where the model
    would have more than ``CELLS`` (piece, rank) pairs or there is one rank."""
    W = ctx.W
    if W < 2 or ctx.n == 0 or upper <= 0:
        return None
    keys = option_keys(ctx, np.arange(ctx.n), sorted({float(c) for c in caches}), upper, CELLS,
                       slack=1.0)
    if keys is None:
        return None
    cands = _candidates(ctx, keys, upper)
    if any(not any(c[0] == i for c in cands) for i in range(ctx.n)):
        return upper  # a table has no option below ``upper``: no plan is below it
    cheapest = np.full(ctx.n, np.inf)
    for i, _, cost, _, _ in cands:
        cheapest[i] = min(cheapest[i], float(cost.sum()))
    room = W * upper - cheapest.sum()
    if room < 0:
        return upper
    cands = [c for c in cands if float(c[2].sum()) - cheapest[c[0]] <= room * (1 + 1e-9)]
    return min(upper, _solve(ctx, cands, upper))


def _candidates(ctx: PlanContext, keys: list, upper: float) -> list:
    """(table, option key or None for replicated, cost per piece (for replicated: per rank),
    bytes per piece (pieces, 3), host-bound) of every table's options whose pieces each cost
    less than ``upper`` and fit a rank."""
    t, m = ctx.tables, ctx.model
    out = []
    for i in range(ctx.n):
        if ctx.grid.valid[i, ctx.dp_col]:
            ct = np.array([ctx.ct])
            dp = m.shards(DP, t.N[i:i + 1], t.L[i:i + 1], t.F[i:i + 1], t.N[i:i + 1],
                          t.D[i:i + 1], ctx.W, ct, 0.0, t.U[i:i + 1])
            need = np.zeros((1, 3))
            need[0, ctx.ct] = float(dp.storage[0] + dp.io[0])
            cost = np.array([float(dp.total[0])])
            if cost[0] < upper and (need[0] <= ctx.budget + 1.0).all():
                out.append((i, None, cost, need, False))
    for i, *key in keys:
        cost, need, bound = cut(ctx, i, tuple(key))
        if cost.max() >= upper or (need > ctx.budget[None, :] + 1.0).any():
            continue
        out.append((i, tuple(key), cost, need, bound))
    return out


def _solve(ctx: PlanContext, cands: list, upper: float) -> float:
    unit = np.where(ctx.budget > 0, ctx.budget, 1.0) / SCALE
    model = PlacementModel(ctx.W, ctx.Lw, np.ceil(ctx.budget / unit).astype(np.int64))
    for i, key, cost, need, bound in cands:
        c = np.floor(cost / upper * SCALE).astype(np.int64)
        nb = np.floor(need / unit[None, :]).astype(np.int64)
        if key is None:
            model.replicated(i, int(c[0]), nb[0])
        else:
            model.option(i, c, nb, bound)
    status = model.solve(WORK, SCALE * 4)
    if model.infeasible(status):
        return upper  # no plan below ``upper`` fits
    return max(0.0, float(model.solver.BestObjectiveBound())) / SCALE * upper
