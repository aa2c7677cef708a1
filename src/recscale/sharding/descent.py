"""Stage 6d: where many ranks sit near the slowest, lower the load they hold above a target.

In: the ``PlanContext``, a placed ``Solution``, the bound's largest piece (seconds), the option
prices of the tiers in force (``option_search.tier_prices``) and the evaluation that places one
table's new shards around the others (``evaluate(sol, table, option, tier, cache)``).
Out: ``descend`` -> a ``Solution`` whose maximum rank cost is never higher than the input's.

The option search (stage 6b) keeps a change only when the slowest rank gets faster. Where a
third of the ranks sit within a few percent of the slowest, no single change does that: each
helps one rank, and the maximum falls only once all have been helped. Here the measure is the
excess: the load above a target ``T`` (``BALANCE`` x the plan's mean, at least the largest
piece), summed over the ranks. From the heaviest rank above ``T`` down, every other option,
tier and cache (that one rank can hold) of its ``TABLES_PER_RANK`` costliest tables is placed
around the other shards; of the first rank where one helps, the change that leaves the least
excess is kept, if it lowers the excess and leaves the maximum no higher, and the scan starts
again. ``T`` stays fixed while the excess falls (so a change cannot lower the excess by raising
the mean); when no rank is above it, it is set again from the new mean, and the search stops
once the maximum is within ``BALANCE`` of the mean. It also stops when no change helps or the
budget of placements (by the plan's size, so the result never depends on the clock) is spent.
Deterministic.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .context import PlanContext
from .option_search import choice_of
from .proposals import OptionPrices
from .shards import Solution
from .types import PlannerError

# The balance aimed at: ranks above this share of the mean hold the excess.
BALANCE = 1.05
# Tables of each rank above the target whose options are tried (its costliest first).
TABLES_PER_RANK = 2
# Placements in all: this many shard-placements' worth, at most ``MAX_EVALUATIONS`` plans.
SHARD_BUDGET = 1_000_000
MAX_EVALUATIONS = 5000


def descend(ctx: PlanContext, sol: Solution, piece: float,
            prices: dict[tuple[int, float], OptionPrices],
            evaluate: Callable[[Solution, int, int, np.ndarray, np.ndarray], Solution]
            ) -> Solution:
    lay = sol.layout
    if ctx.W < 2 or lay.rank.size == 0:
        return sol
    budget = int(min(MAX_EVALUATIONS, SHARD_BUDGET // max(int(lay.rank.size), 1)))
    n = 0
    target = max(BALANCE * float(sol.load.mean()), piece)
    while n < budget:
        top = float(sol.load.max())
        if top <= target:
            # no rank above the target: aim at the new mean's, if the maximum is above it
            again = max(BALANCE * float(sol.load.mean()), piece)
            if again >= top:
                break
            target = again
            continue
        found, n = _step(ctx, sol, target, prices, evaluate, n, budget)
        if found is None:
            break
        sol = found
    return sol


def _excess(sol: Solution, target: float) -> float:
    return float(np.maximum(sol.load - target, 0.0).sum())


def _step(ctx: PlanContext, sol: Solution, target: float,
          prices: dict[tuple[int, float], OptionPrices], evaluate: Callable, n: int,
          budget: int) -> tuple[Solution | None, int]:
    """The best change for the first rank above ``target`` (heaviest first) that has one that
    lowers the excess without raising the maximum; (None, n) when no rank has one."""
    lay, load = sol.layout, sol.load
    top = float(load.max())
    ex0 = _excess(sol, target)
    tier, cache, option = _in_force(ctx, sol)
    over = [int(r) for r in np.argsort(-load, kind="stable") if load[r] > target]
    for r in over:
        on_r = np.flatnonzero(lay.rank == r)
        tabs: list[int] = []
        for s in on_r[np.argsort(-lay.cost_of(on_r), kind="stable")]:
            if int(lay.table[s]) not in tabs:
                tabs.append(int(lay.table[s]))
        best, best_ex = None, ex0 * (1 - 1e-9)
        for tab in tabs[:TABLES_PER_RANK]:
            pinned = int(ctx.tables.pinned[tab])
            for (t, cf), pr in prices.items():
                if pinned >= 0 and t != pinned:
                    continue
                for j in np.flatnonzero(pr.fit[tab]):
                    j = int(j)
                    if j == ctx.dp_col or (j == option[tab] and t == tier[tab]
                                           and cf == cache[tab]):
                        continue
                    if n >= budget:
                        return best, n
                    tt, cc = tier.copy(), cache.copy()
                    tt[tab], cc[tab] = t, cf
                    try:
                        new = evaluate(sol, tab, j, tt, cc)
                    except PlannerError:
                        continue
                    n += 1
                    ex = _excess(new, target)
                    if new.load.max() <= top * (1 + 1e-12) and ex < best_ex:
                        best, best_ex = new, ex
        if best is not None:
            return best, n
    return None, n


def _in_force(ctx: PlanContext, sol: Solution) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each table's tier and cache fraction as placed (demotions included; replicated tables:
    the compute tier, no cache) and its option column (``option_search.choice_of``)."""
    tier = np.full(ctx.n, ctx.ct, dtype=np.int64)
    cache = np.zeros(ctx.n)
    lay = sol.layout
    for tab, s, _ in lay.groups:
        tier[tab], cache[tab] = int(lay.tier[s]), float(lay.cache[s])
    return tier, cache, choice_of(ctx, sol)
