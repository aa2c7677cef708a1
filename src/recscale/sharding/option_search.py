"""Stage 6b: change the sharding option of the tables on the slowest rank, finer or coarser.

In: the ``PlanContext``, the option prices of the tiers in force, a placed ``Solution`` with the
option per table that made it, the largest piece no plan can avoid (``piece``, seconds: the
bound's ``largest_piece``) and the function that places a choice (``place``: stages 3b-5).
Out: ``reoption`` -> the best ``Solution`` found and its choice (never worse than the input).

``split_dominant`` only splits tables finer. A table split over every rank (row-wise, or
column-wise into as many pieces as ranks) puts the same load on every rank, a floor under the
rest that no placement can move; the cure there is a coarser option (table-row-wise within a
host, fewer column pieces) whose pieces placement can put on the lighter ranks. Each round looks
at the tables with the costliest shards on the slowest rank and every other option, tier and
cache (a lower tier with the plan's cache fraction or none) that one rank can hold,
estimates the maximum each would leave (the larger of the new mean and the new floor plus the
largest piece that does not span every rank), places the few most promising (``place``: the
caller's evaluation), then, while none has helped, the few most promising by where their pieces
land on the lightest ranks without the table (``PACKED_ORDER``; ``patient``: keep trying
further candidates while none has helped, then
the best candidates of the two first tables together; when still none helps, the options of
the table whose shards fill the compute tier of ranks below the mean: ``_memory_hog``; then,
where the plan has no cache, the slowest rank's tables below with a small one:
``cache_prices``), and keeps the best if the slowest rank got faster. It stops when the slowest rank is within ``STOP`` of
``piece`` (the bound's largest piece, which is never below the tables' cheapest total over the
ranks: a plan balanced at a mean far above that still searches), when no candidate helps, or
when the budget of placements (``evaluations``, by the plan's size, so the result never depends
on the clock) is spent.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .bounds import piece_bound
from .context import PlanContext
from .proposals import OptionPrices, price_options
from .shards import Solution, better
from .tiering import TierAssignment
from .types import PlannerError

# The slowest rank within this share of the bound's largest piece: nothing left to gain, stop.
STOP = 1.01
# Tables on the slowest rank looked at per round, and candidates placed per round.
TABLES_PER_ROUND = 3
PLACED_PER_ROUND = 4
# Placements in all: this many shard-placements' worth (a plan of S shards costs S), at least
# ``MIN_EVALUATIONS`` plans and at most ``MAX_EVALUATIONS``.
SHARD_BUDGET = 400_000
MIN_EVALUATIONS, MAX_EVALUATIONS = 4, 60
# Candidates of each of the two first tables combined when no single change helps.
PAIR_CANDIDATES = 2
# Cache fractions a table moved below the compute tier may take when the plan has none (nothing
# spilled in aggregate, so tiering chose no cache, yet a table that one rank's compute tier
# cannot hold in a cheap shape may do better below with a cache).
NO_CACHE_TRIES = (0.05, 0.2)
# Where no candidate in the estimate's order helps, try the same tables' options in the order of
# where their pieces land: each on one of the lightest ranks without the table (``_candidates``'
# ``packed_order``). Off: the search as it was before (tests of other mechanisms).
PACKED_ORDER = True


def evaluations(n_shards: int) -> int:
    return int(min(MAX_EVALUATIONS, max(MIN_EVALUATIONS, SHARD_BUDGET // max(n_shards, 1))))


def tier_prices(ctx: PlanContext, cache_fraction: float) -> dict[tuple[int, float],
                                                                  OptionPrices]:
    """Every table's options priced in every tier: below the compute tier with the plan's cache
    fraction and without a cache (a shard whose cache the compute tier cannot hold may still
    fit without one). Keyed by (tier, cache fraction)."""
    c = cache_fraction
    settings = [(t, 0.0 if t == ctx.ct else c) for t in ctx.avail]
    settings += [(t, 0.0) for t in ctx.avail if t != ctx.ct and c > 0]
    return _priced(ctx, settings)


def cache_prices(ctx: PlanContext, cache_fraction: float) -> dict[tuple[int, float],
                                                                   OptionPrices]:
    """Where the plan has no cache and the user left the cache to the planner (the
    ``cache_fraction`` option unset): every table's options priced below the compute tier with
    each of ``NO_CACHE_TRIES`` (tried when nothing else helps). Empty otherwise."""
    if cache_fraction > 0 or ctx.opts.cache_fraction is not None:
        return {}
    return _priced(ctx, [(t, cf) for t in ctx.avail if t != ctx.ct for cf in NO_CACHE_TRIES])


def _priced(ctx: PlanContext, settings: list[tuple[int, float]]) -> dict[tuple[int, float],
                                                                          OptionPrices]:
    return {(t, cf): price_options(ctx, np.full(ctx.n, t), np.full(ctx.n, cf))
            for t, cf in settings}


def reoption(ctx: PlanContext, tiers: TierAssignment, best: Solution, choice: np.ndarray,
             piece: float, prices: dict[tuple[int, float], OptionPrices],
             place: Callable[[Solution, np.ndarray, TierAssignment, list[int]], Solution],
             patient: bool = False, cached: dict[tuple[int, float], OptionPrices] | None = None
             ) -> tuple[Solution, np.ndarray, TierAssignment]:
    budget = evaluations(int(best.layout.rank.size))
    tried: set[bytes] = {choice.tobytes() + tiers.tier.tobytes() + tiers.cache.tobytes()}

    def attempt(changes, best, choice, tiers):
        """The plan with ``changes`` ((table, option, tier, cache) each) placed; None if tried
        already or it does not pack."""
        new, tier, cache = choice.copy(), tiers.tier.copy(), tiers.cache.copy()
        for tab, j, t, cf in changes:
            new[tab], tier[tab], cache[tab] = j, t, cf
        key = new.tobytes() + tier.tobytes() + cache.tobytes()
        if key in tried:
            return None
        tried.add(key)
        cand = TierAssignment(tier, tiers.cache_fraction, cache)
        try:
            return place(best, new, cand, [c[0] for c in changes]), new, cand
        except PlannerError:
            return ()

    while budget > 0:
        if best.load.max() <= STOP * piece:
            break
        rnd = _Round(best, choice, tiers, attempt)
        cands = _candidates(ctx, prices, tiers, best, choice)
        rnd.singles(cands, budget, patient)
        if rnd.improved is None and PACKED_ORDER:
            # the same tables, the options whose pieces best fill the lightest ranks first
            rnd.singles(_candidates(ctx, prices, tiers, best, choice, packed_order=True),
                        budget, patient, fresh=True)
        if rnd.improved is None and patient:
            # two tables at once: the best candidates of the two first tables together (a
            # table's pieces may fit a tier only once another table leaves it)
            firsts: dict[int, list] = {}
            for c in cands:
                if len(firsts.setdefault(c[1], [])) < PAIR_CANDIDATES:
                    firsts[c[1]].append(c[1:])
            tabs = list(firsts)[:2]
            if len(tabs) == 2:
                for a in firsts[tabs[0]]:
                    for b in firsts[tabs[1]]:
                        if rnd.n < budget:
                            rnd.trial([a, b])
        if rnd.improved is None:
            # the table that fills the memory of ranks below the mean, finer or lower
            rnd.singles(_candidates(ctx, prices, tiers, best, choice, hog=True), budget, True)
        if rnd.improved is None and cached:
            # a plan without a cache: the tables on the slowest rank below, with a small one
            rnd.singles(_candidates(ctx, cached, tiers, best, choice), budget, True)
        budget -= rnd.n
        if rnd.improved is None:
            break
        best, choice, tiers = rnd.improved
    return best, choice, tiers


class _Round:
    """One round of the search: the candidates placed so far (``n``) and the best of them that
    beat the round's starting plan (``improved``: (plan, choice, tiers), or None)."""

    def __init__(self, best: Solution, choice: np.ndarray, tiers: TierAssignment,
                 attempt: Callable) -> None:
        self.best, self.choice, self.tiers, self.attempt = best, choice, tiers, attempt
        self.n = 0
        self.improved: tuple[Solution, np.ndarray, TierAssignment] | None = None

    def singles(self, cands: list[tuple[float, int, int, int, float]], budget: int,
                patient: bool, fresh: bool = False) -> None:
        """Each candidate alone, most promising first, until ``budget`` placements or
        ``PLACED_PER_ROUND`` of them in the round (``fresh``: in this call; ``patient``: and
        one has helped)."""
        n0 = self.n if fresh else 0
        for _, tab, j, t, cf in cands:
            if self.n >= budget or (self.n - n0 >= PLACED_PER_ROUND
                                    and (self.improved is not None or not patient)):
                break
            self.trial([(tab, j, t, cf)])

    def trial(self, changes: list[tuple[int, int, int, float]]) -> None:
        out = self.attempt(changes, self.best, self.choice, self.tiers)
        if out is None:  # tried already
            return
        self.n += 1
        if out and better(out[0], self.best) and (self.improved is None
                                                  or better(out[0], self.improved[0])):
            self.improved = out


def _candidates(ctx: PlanContext, prices: dict[tuple[int, float], OptionPrices],
                tiers: TierAssignment, sol: Solution, choice: np.ndarray,
                hog: bool = False, packed_order: bool = False
                ) -> list[tuple[float, int, int, int, float]]:
    """(estimated maximum, table, option, tier, cache fraction) for every other option, tier
    and cache (that one rank can hold) of the tables with the costliest shards on the slowest
    rank (``hog``: of ``_memory_hog``'s table instead), best first, only those estimated below
    the maximum."""
    lay = sol.layout
    W = ctx.W
    load = sol.load
    r = int(np.argmax(load))
    spans = np.zeros(ctx.n, dtype=bool)
    piece = np.zeros(ctx.n)  # largest shard of each table's group
    spread = np.zeros(ctx.n)  # per-rank load of tables spanning every rank
    for tab, s, e in lay.groups:
        spans[tab] = e - s >= W
        c = lay.cost_of(slice(s, e))
        piece[tab] = c.max()
        if spans[tab]:
            spread[tab] = c.sum() / W
    dp_load = float(load.sum() - lay.cost.sum()) / W  # replicated tables, on every rank
    floor = dp_load + spread.sum()
    total = float(load.sum())
    top_pieces = np.sort(np.where(spans, 0.0, piece))[::-1][:2]
    if top_pieces.size < 2:
        top_pieces = np.concatenate([top_pieces, np.zeros(2 - top_pieces.size)])
    on_r = np.flatnonzero(lay.rank == r)
    order = on_r[np.lexsort((on_r, -lay.cost_of(on_r)))]
    tabs: list[int] = []
    for s in order:
        tab = int(lay.table[s])
        if tab not in tabs:
            tabs.append(tab)
        if len(tabs) >= TABLES_PER_ROUND:
            break
    if hog:
        tab = _memory_hog(ctx, sol, tabs)
        tabs = [] if tab is None else [tab]
    g = ctx.grid
    out = []
    for tab in tabs:
        c0, t0, cf0 = int(choice[tab]), int(tiers.tier[tab]), float(tiers.cache[tab])
        mine = lay.table == tab
        if packed_order:  # the ranks' loads without this table, lightest first
            without = load.copy()
            np.subtract.at(without, lay.rank[mine], lay.cost_of(mine))
            lightest = np.sort(without)
        # the largest non-spanning piece of the other tables
        other = top_pieces[1] if not spans[tab] and piece[tab] >= top_pieces[0] else top_pieces[0]
        old_total = float(lay.cost_of(mine).sum())
        pinned = int(ctx.tables.pinned[tab])
        for (t, cf), pr in prices.items():
            if pinned >= 0 and t != pinned:
                continue
            oc = pr.costs
            for j in np.flatnonzero(pr.fit[tab]):
                j = int(j)
                if j == c0 and t == t0 and cf == cf0:
                    continue
                new_total = total - old_total + oc.total[tab, j]
                new_spans = g.n_shards[tab, j] >= W
                fl = floor - spread[tab] + (oc.total[tab, j] / W if new_spans else 0.0)
                top = max(other, 0.0 if new_spans else oc.max[tab, j])
                est = max(new_total / W, fl + top)
                if est < load[r] * (1 - 1e-9):
                    key = (est, 0.0)
                    if packed_order:  # each new piece on one of the lightest ranks
                        n = int(g.n_shards[tab, j])
                        packed = (lightest[-1] + oc.total[tab, j] / W if new_spans
                                  else max(lightest[-1], lightest[n - 1] + oc.max[tab, j]))
                        key = (max(est, packed), est)
                    out.append((*key, float(oc.total[tab, j]), tab, j, t, cf))
    out.sort()
    # one option per table, sharding type, tier and cache (the least estimate, then total)
    seen: set[tuple[int, int, int, float]] = set()
    best = []
    for est, _, _, tab, j, t, cf in out:
        key = (tab, int(g.kind[j]), t, cf)
        if key not in seen:
            seen.add(key)
            best.append((est, tab, j, t, cf))
    return best


def _memory_hog(ctx: PlanContext, sol: Solution, tabs: list[int]) -> int | None:
    """The table whose shards fill the compute tier of ranks left below the mean (their memory
    is full, so no placement can give them more work): the largest compute-tier shard on the
    lightest such rank, if it is not in ``tabs`` already. A finer option or a lower tier for
    it frees those ranks for the load of the others."""
    lay, load = sol.layout, sol.load
    ct = ctx.ct
    if lay.rank.size == 0 or ctx.budget[ct] <= 0:
        return None
    r = int(np.argmax(load))
    on_r = lay.rank == r
    # full: less room left than the smallest shard of the slowest rank needs there
    room = lay.need[on_r, ct].min() if on_r.any() else 0.0
    full = (sol.free[ct] < room) & (load < load.mean())
    if not full.any():
        return None
    q = int(np.flatnonzero(full)[np.argmin(load[full])])
    on_q = np.flatnonzero(lay.rank == q)
    if on_q.size == 0:
        return None
    tab = int(lay.table[on_q[np.argmax(lay.need[on_q, ct])]])
    return None if tab in tabs else tab


def choice_of(ctx: PlanContext, sol: Solution) -> np.ndarray:
    """The option column per table that ``sol``'s layout was cut from (replicated tables: the
    data-parallel column)."""
    g = ctx.grid
    col = {(int(kind), int(k)): j for j, (kind, k) in enumerate(zip(g.kind, g.k))}
    choice = np.full(ctx.n, ctx.dp_col, dtype=np.int64)
    lay = sol.layout
    for tab, s, _ in lay.groups:
        choice[tab] = col[(int(lay.kind[s]), int(lay.k[s]))]
    return choice


def largest_piece(ctx: PlanContext, cache_fraction: float) -> float:
    """Seconds some rank holds in any plan from pieces alone (``bounds.piece_bound``, without
    its every-table-at-once term: that term is often within ``STOP`` of plans that the search
    can still lower by a fraction of a percent, and stopping there saves little time)."""
    return piece_bound(ctx.tables, ctx.grid, ctx.model, ctx.W, ctx.ct,
                       {a: float(ctx.budget[a]) for a in ctx.avail}, cache_fraction,
                       ctx.opts.column_granularity, at_once=False)[0]
