"""The planning driver: ``solve`` chains the stages, each a module with explicit inputs and results.

In: the tables (``TableArrays``), the topology, the per-rank batch and the ``PlannerOptions``.
Out: a ``Solution`` (``shards.py``): every shard with its rank, tier and cache, the replicated
tables, per-rank cost and memory. ``planner.plan_sharding`` turns it into a ``ShardingPlan``.

The stages, in order (``context.py`` holds what they all read: ``PlanContext`` and option costs):

1. ``tiering.choose_data_parallel``: data-parallel for tiny tables whose replication costs less in
   total than any sharded option ("greedy"/"round_robin": only tables that allow nothing else);
2. ``tiering.assign_tiers``: memory tiers, globally: tables sorted by heat (ids looked up per stored
   byte) fill the compute tier, the rest spill to DDR then SSD with a cache of a fraction ``c`` of
   their rows in the compute tier; each tier is filled to at most ``TIER_FILLS[0]`` of its usable
   bytes in aggregate. Tiers are assigned twice: the second time with the I/O buffers of the
   options ``select`` picks for the first assignment;
3. ``proposals.select``: the sharding option per table: the least total cost whose largest shard
   costs at most ``split_fraction`` x the mean rank cost, preferring shards within
   ``pack_fraction`` of one rank's tier; ``shards.build_layout`` cuts the chosen options into
   shards;
4. ``placement.place``: a rank for every shard, largest group first, on the ranks with the lowest
   max(cost share, memory share) that have room in every tier; a group that fits nowhere loses
   its cache, then moves one tier down;
5. ``local_search.improve``: moves, swaps and Karmarkar-Karp re-partitions on the most loaded rank
   while its cost drops;
6. steps 3-5 run from several starts (each ``split_fraction`` against the mean of all load and of
   the load placement can still move, plus all tables whole); ``proposals.split_dominant`` refines
   the two best by splitting the costliest table on the ranks above the mean and re-placing while
   the maximum drops; with at most ``ROCKS_TABLES_PER_RANK`` sharded tables per rank, the
   ``ROCKS`` pools of starts (``proposals.rocks_and_sand``: every piece near a rank or small,
   against a target from the bound; coarse sand, fine, then finest beside a little coarser) are
   searched each on its own (steps 6-7) where its best start is as good as the others', and
   the best end kept;
7. on more than one host, the best plan's host-bound groups (table_row_wise, table_column_wise)
   are moved whole between hosts or swapped (``local_search.improve(groups=True)``); on more
   than one rank, ``option_search.reoption`` then tries other options and tiers, coarser as
   well as finer, for the tables on the slowest rank (a table row-wise over every rank puts a
   floor under every rank that only a coarser option lifts), placing the most promising and
   keeping what lowers the maximum, until the slowest rank is within 1% of the bound's piece
   (never below the cheapest total over the ranks) or nothing helps (a budget of placements by
   the plan's size), twice (each candidate placed from scratch; or also around the other
   shards) and the better kept; if it changed the plan, ``split_dominant`` splits what it left
   lumpy; ``repack.repack`` packs the same shards again against a target maximum (MULTIFIT:
   first and best fit, largest first, the target halved between the mean and the maximum)
   and keeps that if it is lower; the end is searched once more with swaps against the
   shards of every rank (``improve(wide=True)``: where memory is full, the lightest ranks
   often hold nothing the slowest can trade, a medium rank's slightly lighter piece can); then
   ``_promote`` decides tier and splitting together: the costliest shard on the slowest rank that
   sits below the compute tier and cannot spread over every rank (say a hot table that placement
   demoted to SSD as a host-bound group) has its table moved one tier up, tables of that tier
   spread over every rank move one tier down to make room, and steps 3-7 run once more on those
   tiers; the better plan is kept;
8. if no start packs, everything is retried with a lower aggregate fill (more spilled), and if
   none packs at any fill, from starts of small pieces (``proposals.small_pieces``);
9. tiers and splitting together, on plans of at most ``CACHE_SHARDS`` shards with tables spilled
   whose slowest rank is above ``CACHE_UNEVEN`` x the mean:
   the next ``CACHE_TRIES`` cache fractions by estimate (``tiering.tier_choices``) are planned
   too (steps 3-7 without ``_promote`` or the packed option search) and the fastest plan kept
   (``_other_caches``): the estimate counts lookup time in total and cannot see that a large
   cache leaves the compute tier too full per rank for a hot table;
10. ``descent.descend`` on the final plan ("balanced" only): where several ranks sit near the
   slowest, so that no single change makes it faster, the load above a target (1.05 x the
   mean, at least the largest piece) is lowered one table's option, tier or cache at a time,
   never raising the maximum;
11. where the plan is still not within 1.05 of its mean ("balanced", with the rock pools of
   step 6), the pools step 6 passed over are searched (steps 6-7) and descended, one at a time
   until one ends within 1.05, and the best plan kept (``_rocks_left``): a rock start can place
   worse than the others and still end better, once the search moves apart the host-bound
   rocks that placement piled up;
12. where it is still not, on at most ``exact.CELLS`` (piece, rank) pairs, every table's option
   and every piece's rank are chosen at once by CP-SAT, the plan as its hint, a slow tier at
   the plan's cache fraction and then at any (``exact.exact``).

Baselines (``strategy``): "greedy" and "round_robin" place whole tables (row-wise only for tables
too large for one rank) by LPT or in table order, with the same cost model, tiers and capacities,
and skip the search (steps 5-6).

Loops run over tables, shard groups or search steps; per-rank work is vectorised with numpy.
Ties break on the lowest index, so the result depends only on the inputs.
"""

from __future__ import annotations

import numpy as np

from .context import PlanContext
from .descent import BALANCE, descend
from .exact import exact
from .local_search import improve
from .option_grid import TableArrays
from .option_search import cache_prices, choice_of, largest_piece, reoption, tier_prices
from .proposals import (
    OptionPrices,
    price_options,
    rocks_and_sand,
    select,
    small_pieces,
    split_dominant,
)
from .rank_placement import place
from .repack import repack
from .shards import Solution, best_of, better, build_layout, replace_table
from .tiering import (
    TierAssignment,
    assign_tiers,
    choose_data_parallel,
    only_data_parallel,
    tier_choices,
)
from .topology import Topology
from .types import PlannerError, PlannerOptions

# Plans of at most this many shards search their options with every placement packed again
# (``repack`` in each evaluation: a fraction of a second each there, seconds on larger plans).
REPACK_SHARDS = 600
# Tiers are filled to at most this share of their usable bytes in aggregate, leaving room for the
# per-rank packing of shards of different sizes; if packing still fails, planning is retried with
# the next, lower fill (more spilled to lower tiers).
TIER_FILLS = (0.95, 0.85, 0.7)
# Starts whose pieces are rocks or sand (``proposals.rocks_and_sand``): (target over the bound's
# least target, the share of the target from which a piece is a rock, the share up to which it
# is sand). Each pool of starts is searched on its own (coarse sand, then fine sand: where rocks
# are nearly a rank each, sand of a fifth of one cannot even the ranks out; then the finest
# beside a little coarser: the search refines a pool's two best starts, so which starts share a
# pool decides where it ends).
ROCKS = (((1.0, 0.6, 0.2), (1.06, 0.75, 0.2)), ((1.0, 0.6, 0.05), (1.06, 0.75, 0.05)),
         ((1.0, 0.6, 0.05), (1.0, 0.6, 0.1)))
# ... where there are at most this many sharded tables per rank (with more, pieces even out).
ROCKS_TABLES_PER_RANK = 3
# Where no start packs at any fill: starts whose pieces hold at most these shares of a rank's
# bytes (``proposals.small_pieces``; 0: every table in its smallest pieces), at each fill.
SMALL_PIECES = (0.5, 0.25, 0.1, 0.0)
# Where the plan is still not within ``BALANCE`` of its mean at the end, the pools the search
# passed over (their best start worse than the others') are searched too (``_rocks_left``).
ROCKS_WHILE_UNEVEN = True
# Small plans still not within ``BALANCE``: options and ranks chosen again at once (``exact``).
EXACT = True
# Plans of at most this many shards, with tables spilled below the compute tier, are also planned
# with the ``CACHE_TRIES`` next cache fractions' tier assignments (``_other_caches``).
CACHE_SHARDS = 600
CACHE_TRIES = 3
CACHE_UNEVEN = 1.01  # ... when the first plan's slowest rank is above this x the mean
CACHE_RETIER, CACHE_PACKED = 0, False
# Rounds of ``_promote`` (a slow-tier table that cannot spread, one tier up; tables that spread
# over every rank, down) after the search, each a full search on the new tiers.
RETIER_ROUNDS = 1
# The option search's end polished by swaps with shards on every rank (``improve(wide=True)``).
WIDE_SWAPS = True
# The final plan's load above the balance target lowered table by table (``descent.descend``).
DESCENT = True


def solve(tables: TableArrays, topo: Topology, batch_size_per_rank: int,
          opts: PlannerOptions) -> Solution:
    ctx = PlanContext.build(tables, topo, batch_size_per_rank, opts)
    if opts.strategy == "balanced":
        is_dp = choose_data_parallel(ctx)
    else:
        is_dp = only_data_parallel(ctx)
    first_error: PlannerError | None = None
    # where no start packs at any fill, starts of small pieces (the easiest to pack) at each
    for small in (False, True) if opts.strategy == "balanced" and SMALL_PIECES else (False,):
        for fill in TIER_FILLS:
            try:
                choices = _tiers(ctx, is_dp, fill)
            except PlannerError:
                if first_error is None:
                    raise
                break  # no lower fill assigns tiers
            try:
                best = _partition(ctx, is_dp, choices[0], small=small)
            except PlannerError as exc:
                first_error = first_error or exc
                continue
            if (opts.strategy == "balanced" and best.layout.rank.size <= CACHE_SHARDS
                    and best.load.max() > CACHE_UNEVEN * best.load.mean()):
                # a balanced plan's maximum is its mean, which the estimate already minimised
                best = _other_caches(ctx, is_dp, best, choices[1:CACHE_TRIES + 1])
            if opts.strategy == "balanced" and DESCENT:
                best = _descend(ctx, best)
            if opts.strategy == "balanced" and ROCKS_WHILE_UNEVEN and not _even(best):
                best = _rocks_left(ctx, is_dp, choices[0], best)
            if opts.strategy == "balanced" and EXACT:
                best = exact(ctx, best)
            return best
    assert first_error is not None
    raise first_error


def _tiers(ctx: PlanContext, is_dp: np.ndarray, fill: float) -> list[TierAssignment]:
    """The tier assignments to plan, the estimated best first (``tiering.tier_choices``)."""
    first = assign_tiers(ctx, is_dp, fill)
    # Re-tier once with the I/O buffers of the options actually chosen (row-wise shards keep
    # partial sums of the global batch, far more than a table-wise estimate).
    prices = price_options(ctx, first.tier, first.cache)
    io = 0.0
    for f in _fractions(ctx.opts):
        io = max(io, select(ctx, prices, is_dp, f).io_bytes)
    return tier_choices(ctx, is_dp, fill, io)


def _other_caches(ctx: PlanContext, is_dp: np.ndarray, best: Solution,
                  choices: list[TierAssignment]) -> Solution:
    """Tier and split decisions together: the next cache fractions' assignments (fewer or more
    tables spilled, smaller or larger caches), each planned in full, the best plan kept. The
    estimate that ranks them counts lookup time in total; a large cache can leave the compute
    tier too full to pack per rank, so placement demotes and the plan is lumpier than its
    estimate."""
    for tiers in choices:
        try:
            sol = _partition(ctx, is_dp, tiers, CACHE_RETIER, CACHE_PACKED)
        except PlannerError:
            continue
        if better(sol, best):
            best = sol
    return best


def _fractions(opts: PlannerOptions) -> tuple[float, ...]:
    return opts.split_fractions if opts.strategy == "balanced" else (1.0,)


def _partition(ctx: PlanContext, is_dp: np.ndarray, tiers: TierAssignment,
               retier: int = RETIER_ROUNDS, packed: bool = True,
               rocks_left: bool = False, small: bool = False) -> Solution | None:
    """Stages 3-7 on ``tiers``. ``rocks_left``: only the pools of rock starts that the first
    search passed over (their best start worse than the others'), searched until one ends
    within ``BALANCE`` of its mean; None where there are none. ``small``: only the starts of
    small pieces (``SMALL_PIECES``)."""
    balanced = ctx.opts.strategy == "balanced"
    few = int((~is_dp).sum()) <= ROCKS_TABLES_PER_RANK * ctx.W
    rocks = balanced and ctx.W > 1 and few and not small
    if rocks_left and not rocks:
        return None
    prices = price_options(ctx, tiers.tier, tiers.cache)
    results: list[tuple[Solution, np.ndarray]] = []
    tried: list[np.ndarray] = []
    error: PlannerError | None = None
    trials: list[tuple[float, bool | None]] = [] if small else [
        (f, False) for f in _fractions(ctx.opts)]
    if balanced and ctx.W > 1 and not small:
        # also: split against the load placement can still move, and whole tables (the
        # table-wise start, so the search never ends above the greedy baseline)
        trials += [(f, True) for f in _fractions(ctx.opts)] + [(1.0, None)]
    only_dp = only_data_parallel(ctx)
    starts = [(select(ctx, prices, only_dp, f, baseline=True).choice, only_dp)
              if movable is None else (select(ctx, prices, is_dp, f, movable).choice, is_dp)
              for f, movable in trials]
    # where nothing else packs: every table cut into pieces of at most a share of a rank's bytes
    starts += [(small_pieces(ctx, prices, is_dp, tiers.tier, share), is_dp)
               for share in (SMALL_PIECES if small else ())]
    for choice, dp in starts:
        if any(np.array_equal(choice, ch) for ch in tried):
            continue
        tried.append(choice)
        try:
            results.append((_place(ctx, choice, dp, tiers), choice))
        except PlannerError as exc:  # this start does not pack; others may
            error = error or exc
    pools: list[list[tuple[Solution, np.ndarray]]] = []
    for pool in ROCKS if rocks else ():
        rocky: list[tuple[Solution, np.ndarray]] = []
        for grow, rock, sand in pool:
            # rocks and sand: pieces near a rank each or small, none in between
            choice = rocks_and_sand(ctx, prices, is_dp, grow, rock, sand)
            if any(np.array_equal(choice, ch) for _, ch in rocky):
                continue
            # a start an earlier rocks pool placed joins this one too (placed once)
            placed = [r for p in pools for r in p if np.array_equal(r[1], choice)]
            if placed:
                rocky.append(placed[0])
                continue
            if any(np.array_equal(choice, ch) for ch in tried):
                continue
            tried.append(choice)
            try:
                rocky.append((_place(ctx, choice, is_dp, tiers), choice))
            except PlannerError as exc:
                error = error or exc
        pools.append(rocky)
    if not results and not any(pools):
        assert error is not None
        raise error
    # each kind of start searched on its own (the search is greedy, so the better start need
    # not end better); the rocks only where their best start is as good as the others' (or,
    # ``rocks_left``, only the others, until one ends within ``BALANCE`` of its mean)
    ends = []
    if results and not rocks_left:
        ends.append(_refine(ctx, tiers, prices, results, packed))
    for rocky in pools:
        if not rocky or (rocks_left and any(map(_even, ends))):
            continue
        passed_over = bool(results) and better(_first(results), _first(rocky))
        if passed_over == rocks_left:
            ends.append(_refine(ctx, tiers, prices, rocky, packed))
    if rocks_left:
        return best_of(ends) if ends else None
    if balanced and retier > 0 and ctx.W > ctx.Lw:
        # promoted from the first end (the others' starts only add ends to choose from)
        new_tiers = _promote(ctx, tiers, ends[0])
        if new_tiers is not None:
            try:
                ends.append(_partition(ctx, is_dp, new_tiers, retier - 1, packed))
            except PlannerError:
                pass
    return best_of(ends)


def _even(sol: Solution) -> bool:
    return bool(sol.load.max() <= BALANCE * sol.load.mean())


def _order(results: list[tuple[Solution, np.ndarray]]) -> list[int]:
    """Best first (lowest maximum; among equal maxima the evener plan; then the earlier start)."""
    order = list(range(len(results)))
    for i in range(1, len(order)):  # insertion sort with the tolerant comparison
        j = i
        while j > 0 and better(results[order[j]][0], results[order[j - 1]][0]):
            order[j - 1], order[j] = order[j], order[j - 1]
            j -= 1
    return order


def _first(results: list[tuple[Solution, np.ndarray]]) -> Solution:
    return results[_order(results)[0]][0]


def _refine(ctx: PlanContext, tiers: TierAssignment, prices: OptionPrices,
            results: list[tuple[Solution, np.ndarray]], packed: bool) -> Solution:
    """Stages 6-7 from the placed starts ``results`` ((plan, choice) each)."""
    balanced = ctx.opts.strategy == "balanced"
    order = _order(results)
    best = results[order[0]][0]
    if balanced:
        # refine the two best starting points; keep the overall best
        for i in order[:2]:
            sol, choice = results[i]
            dp = choice == ctx.dp_col
            sol = split_dominant(ctx, prices, sol, choice,
                                 lambda ch, dp=dp: _place(ctx, ch, dp, tiers))
            if better(sol, best):
                best = sol
    if balanced and ctx.W > ctx.Lw:
        # host-bound groups whole between hosts, on the final plan only (so every plan the
        # search compared is the one it compared before, and this can only lower the maximum)
        best = improve(ctx, best, groups=True)
    if balanced and ctx.W > 1:
        best = _reoption(ctx, tiers, best, packed)
    return best


def _reoption(ctx: PlanContext, tiers: TierAssignment, best: Solution,
              packed: bool = True) -> Solution:
    """Stage 6b (``option_search.reoption``) on the best plan: other options, finer or coarser,
    for the tables on the slowest rank. Two searches, the better kept (each greedy, so each can
    end where the other does not): every candidate placed from scratch as the starts were; and
    every candidate's shards placed around the others' (``shards.replace_table``), searched,
    beside the placement from scratch, trying further candidates while none has helped. On
    plans of at most ``REPACK_SHARDS`` shards both run once more with every candidate's
    placement packed again against a target (``repack``, first fit: the search then sees which
    options pack evenly). Each search's end is packed again (``repack``, both fits) and the
    best kept."""
    piece = largest_piece(ctx, tiers.cache_fraction)
    # the same for every search
    prices = (tier_prices(ctx, tiers.cache_fraction), cache_prices(ctx, tiers.cache_fraction))
    out = repack(ctx, _searches(ctx, tiers, best, piece, prices, False))
    if packed and best.layout.rank.size <= REPACK_SHARDS:
        alt = repack(ctx, _searches(ctx, tiers, best, piece, prices, True))
        if better(alt, out):
            out = alt
    if WIDE_SWAPS:
        # swaps of the slowest rank's shards with any rank's, not only the lightest: where
        # memory is full a lighter piece of a medium rank is the only one that can make room
        out = improve(ctx, out, wide=True)
        if ctx.W > ctx.Lw:
            out = improve(ctx, out, groups=True, wide=True)
    return out


def _searches(ctx: PlanContext, tiers: TierAssignment, best: Solution, piece: float,
              prices: tuple[dict, dict], pack: bool) -> Solution:
    choice = choice_of(ctx, best)
    dp = choice == ctx.dp_col
    groups = ctx.W > ctx.Lw

    def full(ch: np.ndarray, tiers: TierAssignment) -> Solution:
        sol = _place(ctx, ch, dp, tiers)
        sol = improve(ctx, sol, groups=True) if groups else sol
        return repack(ctx, sol, fits=(True,)) if pack else sol

    def around(sol: Solution, ch: np.ndarray, tiers: TierAssignment, tabs: list[int]) -> Solution:
        lay = sol.layout
        for tab in tabs:
            lay = replace_table(ctx, lay, tab, int(ch[tab]), tiers.tier, tiers.cache)
        new = improve(ctx, place(ctx, lay, dp, tiers.cache_fraction))
        new = improve(ctx, new, groups=True) if groups else new
        other = full(ch, tiers)
        return other if better(other, new) else new

    out = best
    for evaluate, patient in (((lambda s, ch, t, tab: full(ch, t)), False), (around, True)):
        sol, ch, new_tiers = reoption(ctx, tiers, best, choice, piece, prices[0], evaluate,
                                      patient, prices[1])
        if sol is not best:
            # coarser options leave lumpier pieces: split the ones on the ranks above the mean
            sol = split_dominant(ctx, price_options(ctx, new_tiers.tier, new_tiers.cache), sol,
                                 ch, lambda c, t=new_tiers: full(c, t))
        if better(sol, out):
            out = sol
    return out


def _rocks_left(ctx: PlanContext, is_dp: np.ndarray, tiers: TierAssignment,
                best: Solution) -> Solution:
    """Stage 11: where the plan is still not within ``BALANCE`` of its mean, the pools of
    rock starts the search passed over, each searched (and descended), the best plan kept. A
    rock start can place worse than the others and still end better: placement piles
    host-bound rocks on a few ranks, and the search moves them apart."""
    try:
        alt = _partition(ctx, is_dp, tiers, rocks_left=True)
    except PlannerError:
        return best
    if alt is None:
        return best
    alt = _descend(ctx, alt) if DESCENT else alt
    return alt if better(alt, best) else best


def _descend(ctx: PlanContext, sol: Solution) -> Solution:
    """Stage 6d (``descent.descend``) on the final plan: each change one table's shards cut
    anew and placed around the others', then searched."""
    if _even(sol):
        return sol  # nothing above the target (descend would stop at once): no prices needed
    cf = sol.cache_fraction
    dp = choice_of(ctx, sol) == ctx.dp_col

    def evaluate(s: Solution, tab: int, option: int, tier: np.ndarray,
                 cache: np.ndarray) -> Solution:
        new = improve(ctx, place(ctx, replace_table(ctx, s.layout, tab, option, tier, cache),
                                 dp, cf))
        return improve(ctx, new, groups=True) if ctx.W > ctx.Lw else new

    return descend(ctx, sol, largest_piece(ctx, cf), tier_prices(ctx, cf), evaluate)


def _promote(ctx: PlanContext, tiers: TierAssignment, sol: Solution) -> TierAssignment | None:
    """Tiers and splitting together: the tiers of ``sol`` (as placed, demotions included) with
    the table of the costliest shard on the slowest rank that sits below the compute tier and
    cannot spread over every rank (a table-wise, column-wise or host-bound group) one tier up,
    and, to make room there, tables of that tier whose groups span every rank one tier down
    (least added lookup seconds per byte first, until their bytes cover the promoted table's).
    Their added cost falls evenly on all ranks; the promoted table's saving falls on the slowest.
    None when there is no such table or not enough to demote."""
    lay = sol.layout
    W = ctx.W
    tier = tiers.tier.copy()
    span = np.zeros(ctx.n, dtype=bool)
    for tab, s, e in lay.groups:
        tier[tab] = lay.tier[s]
        span[tab] = e - s >= W
    r = int(np.argmax(sol.load))
    on_r = np.flatnonzero((lay.rank == r) & (lay.tier != ctx.ct) & ~span[lay.table])
    if on_r.size == 0:
        return None
    s = int(on_r[np.lexsort((on_r, -lay.cost_of(on_r)))][0])
    tab = int(lay.table[s])
    up = [a for a in ctx.avail if a < int(lay.tier[s])]
    if not up:
        return None
    to = up[-1]
    t, m = ctx.tables, ctx.model
    storage = m.storage_bytes(t.N, t.D)
    cand = np.flatnonzero((tier == to) & span & (t.pinned < 0))
    down = [a for a in ctx.avail if a > to]
    if cand.size == 0 or not down or int(t.pinned[tab]) >= 0:
        return None
    lookup = m.B * W * t.F * t.L * (3 * t.D * m.wb + 2 * (m.opt_row + m.opt_elem * t.D))
    c = tiers.cache_fraction
    added = lookup * (m.seconds_per_byte(np.full(ctx.n, down[0]), np.full(ctx.n, c))
                      - m.seconds_per_byte(np.full(ctx.n, to), np.full(ctx.n, c if to != ctx.ct
                                                                            else 0.0)))
    order = cand[np.lexsort((cand, added[cand] / storage[cand]))]
    freed = np.cumsum(storage[order])
    k = int(np.searchsorted(freed, storage[tab]))
    if k >= order.size:
        return None
    tier[order[: k + 1]] = down[0]
    tier[tab] = to
    return TierAssignment(tier, tiers.cache_fraction,
                          np.where(tier != ctx.ct, tiers.cache_fraction, 0.0))


def _place(ctx: PlanContext, choice: np.ndarray, is_dp: np.ndarray,
           tiers: TierAssignment) -> Solution:
    """Stages 3b-5 for one proposal: its shards, placed, then (balanced only) searched."""
    lay = build_layout(ctx, choice, tiers.tier, tiers.cache)
    sol = place(ctx, lay, is_dp, tiers.cache_fraction)
    return improve(ctx, sol) if ctx.opts.strategy == "balanced" else sol
