"""Stage 3: the sharding option of every table, and refinement by splitting dominant tables.

In: the ``PlanContext`` and the tables' tiers and cache fractions (from ``tiering``).
Out: ``price_options`` -> ``OptionPrices`` (every option's costs plus which options fit a rank;
computed once per tier assignment); ``select`` -> ``Proposal`` (the option per table and the
compute-tier I/O bytes it needs); ``split_dominant`` -> the best ``Solution`` found by splitting
the costliest table on the slowest ranks, given the placement function to use (``place``).

``select`` takes, per table, the option with the least total cost whose largest shard costs at
most ``split_fraction`` x the mean rank cost (the mean over all load, or with ``movable_only``
over the load that placement can still move), preferring shards within ``pack_fraction`` of one
rank's tier. The baselines ("greedy", "round_robin", or ``baseline=True``) take whole tables where
they fit a rank, else row-wise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .bounds import least_target
from .context import INF, OptionCosts, PlanContext, option_costs
from .cost import DP, RW, TW
from .shards import Solution, better
from .types import SHARDING_TYPES, PlannerError

# Pieces of at most this share of the target are sand (``rocks_and_sand``).
SAND = 0.2


@dataclass(frozen=True)
class OptionPrices:
    """Costs of every (table, option) for one tier assignment, and the options each table may
    take: ``base`` (within ``pack_fraction`` of a rank's tier if any, else fitting a rank, else
    any valid sharded option), ``baseline_fit`` (what the baselines choose from) and ``fit``
    (every sharded option whose widest shard fits one rank's tier)."""

    costs: OptionCosts
    base: np.ndarray  # (tables, options) bool
    baseline_fit: np.ndarray  # (tables, options) bool
    fit: np.ndarray  # (tables, options) bool


class Proposal(NamedTuple):
    choice: np.ndarray  # (tables,) option column per table
    io_bytes: float  # compute-tier I/O buffers of the chosen options of the sharded tables


def _fits(ctx: PlanContext, tier: np.ndarray, wst: np.ndarray, wct: np.ndarray,
          frac: float) -> np.ndarray:
    """(n, m): the widest shard fits ``frac`` of one rank's tier (and the compute tier)."""
    b = ctx.budget
    tb = b[tier][:, None]
    in_ct = (tier == ctx.ct)[:, None]
    same = wst + wct <= frac * b[ctx.ct]
    split = (wst <= frac * tb) & (wct <= frac * b[ctx.ct])
    valid = ctx.grid.valid & (tb > 0)
    return valid & np.where(in_ct, same, split)


def price_options(ctx: PlanContext, tier: np.ndarray, cache: np.ndarray) -> OptionPrices:
    oc = option_costs(ctx, tier, cache)
    wst, wct = oc.wide_storage, oc.wide_ct
    g = ctx.grid
    non_dp = np.ones(g.m, dtype=bool)
    non_dp[ctx.dp_col] = False
    fit = _fits(ctx, tier, wst, wct, 1.0) & non_dp
    pref = _fits(ctx, tier, wst, wct, ctx.opts.pack_fraction) & non_dp
    base = np.where(pref.any(axis=1)[:, None], pref,
                    np.where(fit.any(axis=1)[:, None], fit, g.valid & non_dp))
    return OptionPrices(oc, base, np.where(pref.any(axis=1)[:, None], pref, fit), fit)


def select(ctx: PlanContext, prices: OptionPrices, is_dp: np.ndarray, split_fraction: float,
           movable_only: bool = False, baseline: bool = False) -> Proposal:
    """Option per table: the least total cost whose largest shard is at most
    ``split_fraction`` x the mean rank cost (with ``movable_only``: counting only shards that
    do not span every rank, i.e. the load that placement can still balance)."""
    oc, base = prices.costs, prices.base
    mx, tot = oc.max, oc.total
    g = ctx.grid
    if ctx.opts.strategy != "balanced" or baseline:
        choice = _baseline_choice(ctx, prices.baseline_fit)
    else:
        choice = _argmin_tie(np.where(base, tot, INF), np.where(base, mx, INF))
        dp_total = 0.0 if movable_only else tot[is_dp, ctx.dp_col].sum()
        spans = g.n_shards >= ctx.W
        rows = np.arange(ctx.n)
        for _ in range(3):
            counted = ~is_dp & ~(movable_only & spans[rows, choice])
            mean = (tot[rows, choice][counted].sum() + dp_total) / ctx.W
            cap = split_fraction * mean
            elig = base & (mx <= cap * (1 + 1e-12))
            has = elig.any(axis=1)
            by_total = _argmin_tie(np.where(elig, tot, INF), np.where(elig, mx, INF))
            by_max = _argmin_tie(np.where(base, mx, INF), np.where(base, tot, INF))
            new = np.where(has, by_total, by_max)
            if np.array_equal(new, choice):
                break
            choice = new
    choice = np.where(is_dp, ctx.dp_col, choice)
    io = float(oc.total_io[np.arange(ctx.n), choice][~is_dp].sum())
    no_option = ~g.valid[np.arange(ctx.n), choice]
    if no_option.any():
        i = int(np.flatnonzero(no_option)[0])
        name = ctx.tables.names[i]
        allowed = [SHARDING_TYPES[k] for k in np.flatnonzero(ctx.tables.allowed[i])]
        raise PlannerError(
            f"table {name!r}: no sharding type among {allowed} applies (column-wise needs "
            f"embedding_dim a multiple of column_granularity={ctx.opts.column_granularity}); "
            "allow another sharding type",
            table=name, suggestions=("allow another sharding type",))
    return Proposal(choice, io)


def rocks_and_sand(ctx: PlanContext, prices: OptionPrices, is_dp: np.ndarray, grow: float,
                   rock: float, sand: float = SAND) -> np.ndarray:
    """Option per table for a target T: ``grow`` x the least over T of max(T, the mean when
    every table takes its cheapest option with pieces of at most T) (``bounds.least_target``).
    Each table takes its cheapest option whose pieces are at most T and either rocks (at least
    ``rock`` x T: nearly a rank each) or sand (at most ``sand`` x T: they fill what the rocks
    leave), else its cheapest with pieces of at most T. Pieces of a third to a half of a rank,
    two or three a rank, are what leaves ranks lumpy where tables are few per rank."""
    oc, base = prices.costs, prices.base
    mx = np.where(base, oc.max, INF)
    tot = np.where(base, oc.total, INF)
    dp = ctx.dp_col
    mx[is_dp], tot[is_dp] = INF, INF
    mx[is_dp, dp], tot[is_dp, dp] = oc.max[is_dp, dp], oc.total[is_dp, dp]
    T = grow * least_target(mx, tot, ctx.W)[0]
    under = mx <= T * (1 + 1e-12)
    ok = under & ((mx <= sand * T) | (mx >= rock * T))
    pick = np.where(ok.any(axis=1), _argmin_tie(np.where(ok, tot, INF), np.where(ok, mx, INF)),
                    _argmin_tie(np.where(under, tot, INF), np.where(under, mx, INF)))
    fallback = _argmin_tie(np.where(base, mx, INF), np.where(base, tot, INF))
    choice = np.where(under.any(axis=1), pick, fallback)
    return np.where(is_dp, dp, choice)


def small_pieces(ctx: PlanContext, prices: OptionPrices, is_dp: np.ndarray, tier: np.ndarray,
                 share: float) -> np.ndarray:
    """Option per table, for when no other start packs: the cheapest in total whose widest
    shard holds at most ``share`` of one rank's bytes in its tier (and the compute tier), else
    the one whose widest shard holds the fewest bytes (``share`` 0: every table so)."""
    oc = prices.costs
    valid = ctx.grid.valid.copy()
    valid[:, ctx.dp_col] = False
    size = np.where(valid, oc.wide_storage + oc.wide_ct, INF)
    smallest = _argmin_tie(size, np.where(valid, oc.total, INF))
    small = _fits(ctx, tier, oc.wide_storage, oc.wide_ct, share) & valid
    cheapest = _argmin_tie(np.where(small, oc.total, INF), np.where(small, size, INF))
    choice = np.where(small.any(axis=1), cheapest, smallest)
    return np.where(is_dp, ctx.dp_col, choice)


def _argmin_tie(primary: np.ndarray, secondary: np.ndarray) -> np.ndarray:
    best = primary.min(axis=1, keepdims=True)
    near = primary <= best * (1 + 1e-9)
    return np.argmin(np.where(near, secondary, INF), axis=1)


def _baseline_choice(ctx: PlanContext, fit: np.ndarray) -> np.ndarray:
    """Table-wise where a whole table fits one rank (within ``pack_fraction`` of its tier if
    possible), else row-wise, else the first option that fits."""
    g = ctx.grid
    tw = int(np.flatnonzero(g.kind == TW)[0])
    rw = int(np.flatnonzero(g.kind == RW)[0])
    first_fit = np.argmax(fit, axis=1)
    first_valid = np.argmax(g.valid & (g.kind != DP)[None, :], axis=1)
    return np.where(fit[:, tw], tw, np.where(fit[:, rw], rw,
                                             np.where(fit.any(axis=1), first_fit, first_valid)))


# --- refinement: split dominant tables ------------------------------------------------------------------
def split_dominant(ctx: PlanContext, prices: OptionPrices, best: Solution, choice: np.ndarray,
                   place: Callable[[np.ndarray], Solution], rounds: int = 12,
                   tol: float = 0.002) -> Solution:
    """While ranks stay above the mean, split the costliest splittable table on some of them,
    re-place (``place(choice)``), and keep the result if the slowest rank got faster (or, as fast,
    the spread got smaller). Per round four variants are tried: on every rank above the mean, the
    cheapest option with a smaller largest shard ("cheapest") or pieces no larger than the rank's
    excess over the mean ("excess", else the table's finest option); "excess" on the ranks in the
    upper half of the excess only ("top"); "cheapest" on the slowest rank only ("single")."""
    for _ in range(rounds):
        load = best.load
        mean = load.mean()
        if load.max() <= mean * (1 + tol):
            break
        round_best = None
        for variant in ("cheapest", "excess", "top", "single"):
            new = _split_choice(ctx, best, choice, prices, mean, tol, variant)
            if new is None:
                continue
            try:
                sol = place(new)
            except PlannerError:
                continue
            if round_best is None or better(sol, round_best[0]):
                round_best = (sol, new)
        if round_best is None or not better(round_best[0], best):
            break
        best, choice = round_best
    return best


def _split_choice(ctx: PlanContext, sol: Solution, choice: np.ndarray, prices: OptionPrices,
                  mean: float, tol: float, variant: str) -> np.ndarray | None:
    oc, base = prices.costs, prices.base
    lay = sol.layout
    load = sol.load
    new = choice.copy()
    done: set[int] = set()
    # ranks to relieve: all above the mean, the upper half of the excess ("top"), or the slowest
    floor = mean * (1 + tol)
    if variant == "top":
        floor = max(floor, (load.max() + mean) / 2)
    for r in np.lexsort((np.arange(ctx.W), -load)):
        if load[r] <= floor or (variant == "single" and done):
            break
        on_r = np.flatnonzero(lay.rank == r)
        for s in on_r[np.lexsort((on_r, -lay.cost_of(on_r)))]:
            tab = int(lay.table[s])
            if tab in done:
                continue
            finer = base[tab] & (oc.max[tab] < oc.max[tab, choice[tab]] * (1 - 1e-9))
            if not finer.any():
                continue
            small = finer & (oc.max[tab] <= load[r] - mean)
            if variant in ("cheapest", "single"):
                new[tab] = int(np.argmin(np.where(finer, oc.total[tab], INF)))
            elif small.any():
                new[tab] = int(np.argmin(np.where(small, oc.total[tab], INF)))
            else:
                new[tab] = int(np.argmin(np.where(finer, oc.max[tab], INF)))
            done.add(tab)
            break
    return new if done else None
