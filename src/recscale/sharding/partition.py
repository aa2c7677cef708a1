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
   the maximum drops;
7. if no start packs, everything is retried with a lower aggregate fill (more spilled).

Baselines (``strategy``): "greedy" and "round_robin" place whole tables (row-wise only for tables
too large for one rank) by LPT or in table order, with the same cost model, tiers and capacities,
and skip the search (steps 5-6).

Loops run over tables, shard groups or search steps; per-rank work is vectorised with numpy.
Ties break on the lowest index, so the result depends only on the inputs.
"""

from __future__ import annotations

import numpy as np

from .context import PlanContext
from .enumerate import TableArrays
from .local_search import improve
from .placement import place
from .proposals import price_options, select, split_dominant
from .shards import Solution, better, build_layout
from .tiering import TierAssignment, assign_tiers, choose_data_parallel, only_data_parallel
from .topology import Topology
from .types import PlannerError, PlannerOptions

# Tiers are filled to at most this share of their usable bytes in aggregate, leaving room for the
# per-rank packing of shards of different sizes; if packing still fails, planning is retried with
# the next, lower fill (more spilled to lower tiers).
TIER_FILLS = (0.95, 0.85, 0.7)


def solve(tables: TableArrays, topo: Topology, batch_size_per_rank: int,
          opts: PlannerOptions) -> Solution:
    ctx = PlanContext.build(tables, topo, batch_size_per_rank, opts)
    if opts.strategy == "balanced":
        is_dp = choose_data_parallel(ctx)
    else:
        is_dp = only_data_parallel(ctx)
    first_error: PlannerError | None = None
    for fill in TIER_FILLS:
        try:
            tiers = _tiers(ctx, is_dp, fill)
        except PlannerError:
            if first_error is not None:
                raise first_error from None
            raise
        try:
            return _partition(ctx, is_dp, tiers)
        except PlannerError as exc:
            first_error = first_error or exc
    assert first_error is not None
    raise first_error


def _tiers(ctx: PlanContext, is_dp: np.ndarray, fill: float) -> TierAssignment:
    first = assign_tiers(ctx, is_dp, fill)
    # Re-tier once with the I/O buffers of the options actually chosen (row-wise shards keep
    # partial sums of the global batch, far more than a table-wise estimate).
    prices = price_options(ctx, first.tier, first.cache)
    io = 0.0
    for f in _fractions(ctx.opts):
        io = max(io, select(ctx, prices, is_dp, f).io_bytes)
    return assign_tiers(ctx, is_dp, fill, io)


def _fractions(opts: PlannerOptions) -> tuple[float, ...]:
    return opts.split_fractions if opts.strategy == "balanced" else (1.0,)


def _partition(ctx: PlanContext, is_dp: np.ndarray, tiers: TierAssignment) -> Solution:
    prices = price_options(ctx, tiers.tier, tiers.cache)
    results: list[tuple[Solution, np.ndarray]] = []
    tried: list[np.ndarray] = []
    error: PlannerError | None = None
    balanced = ctx.opts.strategy == "balanced"
    trials: list[tuple[float, bool | None]] = [(f, False) for f in _fractions(ctx.opts)]
    if balanced and ctx.W > 1:
        # also: split against the load placement can still move, and whole tables (the
        # table-wise start, so the search never ends above the greedy baseline)
        trials += [(f, True) for f in _fractions(ctx.opts)] + [(1.0, None)]
    only_dp = only_data_parallel(ctx)
    for f, movable in trials:
        dp = is_dp
        if movable is None:
            dp = only_dp
            choice = select(ctx, prices, dp, f, baseline=True).choice
        else:
            choice = select(ctx, prices, is_dp, f, movable).choice
        if any(np.array_equal(choice, ch) for ch in tried):
            continue
        tried.append(choice)
        try:
            results.append((_place(ctx, choice, dp, tiers), choice))
        except PlannerError as exc:  # this start does not pack; others may
            error = error or exc
    if not results:
        assert error is not None
        raise error
    # best first (lowest maximum; among equal maxima the evener plan; then the earlier start)
    order = list(range(len(results)))
    for i in range(1, len(order)):  # insertion sort with the tolerant comparison
        j = i
        while j > 0 and better(results[order[j]][0], results[order[j - 1]][0]):
            order[j - 1], order[j] = order[j], order[j - 1]
            j -= 1
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
    return best


def _place(ctx: PlanContext, choice: np.ndarray, is_dp: np.ndarray,
           tiers: TierAssignment) -> Solution:
    """Stages 3b-5 for one proposal: its shards, placed, then (balanced only) searched."""
    lay = build_layout(ctx, choice, tiers.tier, tiers.cache)
    sol = place(ctx, lay, is_dp, tiers.cache_fraction)
    return improve(ctx, sol) if ctx.opts.strategy == "balanced" else sol
