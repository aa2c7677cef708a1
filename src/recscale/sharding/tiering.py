"""Stages 1-2: which tables are replicated (data-parallel), and the memory tier of every table.

In: the ``PlanContext``; for tiers also the data-parallel mask, the aggregate ``fill`` (share of
each tier's usable bytes that may be filled) and optionally the compute-tier I/O bytes of the
options chosen so far.
Out: ``choose_data_parallel`` / ``only_data_parallel``: a bool mask over tables;
``assign_tiers``: ``TierAssignment`` (tier index per table, the cache fraction, and the cache
fraction per table: 0 for tables in the compute tier). Raises ``PlannerError`` naming the table
and what would make it fit when the tables cannot fit the tiers at all.

Tiers are assigned globally: tables sorted by heat (ids looked up per stored byte) fill the compute
tier, the rest spill to the next tiers, each with a cache of a fraction ``c`` of their rows in the
compute tier; ``c`` is picked among ``CACHE_CANDIDATES`` by estimated lookup time (or set by the
``cache_fraction`` option).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .context import INF, PlanContext, gb, option_costs
from .cost import DP, TW
from .types import PRECISION_BYTES, TIERS, PlannerError

CACHE_CANDIDATES = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5)


def cache_candidates(opts) -> tuple[float, ...]:
    """The cache fractions a plan's slow-tier tables may take: ``CACHE_CANDIDATES``, or none
    and the one the options set."""
    return CACHE_CANDIDATES if opts.cache_fraction is None else (0.0, opts.cache_fraction)


class TierAssignment(NamedTuple):
    tier: np.ndarray  # (tables,) tier index
    cache_fraction: float  # of the spilled tables' rows, cached in the compute tier
    cache: np.ndarray  # (tables,) cache fraction per table (0 in the compute tier)


def choose_data_parallel(ctx: PlanContext) -> np.ndarray:
    """Tables to replicate: those that allow nothing else, plus tiny tables whose replication
    costs less in total than any sharded option (smallest first, up to 10% of a rank's compute
    tier in all)."""
    ct = np.full(ctx.n, ctx.ct)
    oc = option_costs(ctx, ct, np.zeros(ctx.n))
    tot, wst, wct = oc.total, oc.wide_storage, oc.wide_ct
    g = ctx.grid
    dp = ctx.dp_col
    others = g.valid.copy()
    others[:, dp] = False
    best_other = np.where(others, tot, INF).min(axis=1)
    per_rank = wst[:, dp] + wct[:, dp]
    only_dp = g.valid[:, dp] & ~others.any(axis=1)
    cand = (g.valid[:, dp] & (tot[:, dp] <= best_other) & (ctx.W > 1)
            & (per_rank <= ctx.opts.data_parallel_max_fraction * ctx.budget[ctx.ct])
            & ((ctx.tables.pinned < 0) | (ctx.tables.pinned == ctx.ct)))
    chosen = only_dp.copy()
    limit = 0.1 * ctx.budget[ctx.ct] - per_rank[only_dp].sum()
    order = np.lexsort((np.arange(ctx.n), per_rank))
    used = 0.0
    for i in order:
        if cand[i] and not chosen[i] and used + per_rank[i] <= limit:
            chosen[i] = True
            used += per_rank[i]
    return chosen


def only_data_parallel(ctx: PlanContext) -> np.ndarray:
    """Tables whose constraints allow nothing but data-parallel."""
    g = ctx.grid
    return g.valid[:, ctx.dp_col] & ~np.delete(g.valid, ctx.dp_col, axis=1).any(axis=1)


def assign_tiers(ctx: PlanContext, is_dp: np.ndarray, fill: float,
                 io_bytes: float | None = None) -> TierAssignment:
    """Tier per table and the cache fraction. ``io_bytes``: compute-tier I/O buffers of all
    sharded tables (default: as if every table were table-wise)."""
    return tier_choices(ctx, is_dp, fill, io_bytes)[0]


def tier_choices(ctx: PlanContext, is_dp: np.ndarray, fill: float,
                 io_bytes: float | None = None) -> list[TierAssignment]:
    """Every cache fraction's tier assignment that fits, least estimated lookup time first
    (``assign_tiers`` takes the first; the estimate is a total, blind to how evenly each
    packs, so the planner may try the others)."""
    t, m, g = ctx.tables, ctx.model, ctx.grid
    W = ctx.W
    storage = m.storage_bytes(t.N, t.D)
    ct_tier = np.full(ctx.n, ctx.ct)
    tw = m.shards(TW, t.N, t.L, t.F, t.N, t.D, 1, ct_tier, 0.0, t.U)
    dp = m.shards(DP, t.N, t.L, t.F, t.N, t.D, W, ct_tier, 0.0, t.U)
    others = g.valid.copy()
    others[:, ctx.dp_col] = False
    wst = m.storage_bytes(g.wide_rows, g.wide_cols)
    min_shard = np.where(others, wst, INF).min(axis=1)
    vec = m.B * W * t.F
    lookup = vec * t.L * (3 * t.D * m.wb + 2 * (m.opt_row + m.opt_elem * t.D))
    heat = vec * t.L * t.D / storage
    io = tw.io[~is_dp].sum() if io_bytes is None else io_bytes
    reserved = io + W * (dp.storage + dp.io)[is_dp].sum()
    totals = ctx.budget * W * fill
    totals[ctx.ct] -= reserved
    sharded = np.flatnonzero(~is_dp)
    pinned = [i for i in sharded if t.pinned[i] >= 0]
    free_ = [i for i in sharded[np.lexsort((sharded, -heat[sharded]))] if t.pinned[i] < 0]
    tot_bytes = storage[sharded].sum()
    tier = np.full(ctx.n, ctx.ct, dtype=np.int64)

    for i in pinned:
        p = int(t.pinned[i])
        if ctx.budget[p] <= 0:
            _raise_tier_missing(ctx, i, p, storage[i])
        if min_shard[i] > ctx.budget[p]:
            _raise_too_big(ctx, i, storage[i], min_shard[i], p)

    opts = ctx.opts
    candidates = cache_candidates(opts)
    fits: list[tuple[float, float, np.ndarray]] = []
    first_failure = None
    cache_overflow = None
    for c in candidates:
        rem = totals.copy()
        if c > 0:
            rem[ctx.ct] = (rem[ctx.ct] - c * tot_bytes) / (1 - c)
            if rem[ctx.ct] < 0:
                cache_overflow = c  # the caches alone would overflow the compute tier
                continue
        tier_c = tier.copy()
        ok = True
        for i in pinned:
            p = int(t.pinned[i])
            tier_c[i] = p
            rem[p] -= storage[i]
            if rem[p] < 0:
                ok = False
                first_failure = first_failure or (i, rem[p] + storage[i])
                break
        if ok:
            for i in free_:
                for tt in ctx.avail:
                    if rem[tt] >= storage[i] and min_shard[i] <= ctx.budget[tt]:
                        tier_c[i] = tt
                        rem[tt] -= storage[i]
                        break
                else:
                    ok = False
                    if first_failure is None:
                        first_failure = (i, max(0.0, float(sum(rem[a] for a in ctx.avail))))
                    break
        if not ok:
            continue
        spilled = (tier_c != ctx.ct) & ~is_dp
        if not spilled.any():
            return [_assignment(ctx, tier_c, 0.0)]
        spb = m.seconds_per_byte(tier_c, np.where(spilled, c, 0.0))
        est = float((lookup * spb)[~is_dp].sum())
        if c == 0 and opts.cache_fraction:
            continue  # the user asked for a cache fraction; 0 was only a feasibility probe
        fits.append((est, c, tier_c))
    if not fits and opts.cache_fraction and cache_overflow is not None:
        c = opts.cache_fraction
        need = c * tot_bytes
        have = totals[ctx.ct]
        sug = ["a smaller cache_fraction (or null to let the planner choose)", "more ranks"]
        raise PlannerError(
            f"cache_fraction={c} needs {gb(need)} of {TIERS[ctx.ct]} for the caches of "
            f"{gb(tot_bytes)} of tables but only {gb(have)} is usable there on {W} ranks; "
            "to fit, use " + " or ".join(sug),
            table=None, bytes_needed=need, capacity=have, suggestions=sug)
    if not fits:
        i, remaining = first_failure if first_failure else (int(np.argmax(storage)), 0.0)
        _raise_capacity(ctx, int(i), storage, is_dp, remaining, fill, reserved)
    order = sorted(range(len(fits)), key=lambda k: (fits[k][0], k))  # ties: the candidate order
    return [_assignment(ctx, fits[k][2], fits[k][1]) for k in order]


def _assignment(ctx: PlanContext, tier: np.ndarray, c: float) -> TierAssignment:
    return TierAssignment(tier, c, np.where(tier != ctx.ct, c, 0.0))


# --- errors -------------------------------------------------------------------------------------------
def _suggestions(ctx: PlanContext, need_total: float, fill: float) -> list[str]:
    topo, opts = ctx.topo, ctx.opts
    per_rank = float(sum(ctx.budget[a] for a in ctx.avail))
    s = []
    if per_rank > 0:
        ranks = int(np.ceil(need_total / per_rank))
        ranks = int(np.ceil(ranks / ctx.Lw) * ctx.Lw)
        if ranks > ctx.W:
            s.append(f"more ranks (>= {ranks} at {gb(per_rank)} usable per rank)")
    missing = [t for t in TIERS if topo.capacity(t) <= 0 and TIERS.index(t) > 0]
    if missing:
        s.append(f"a lower tier ({', '.join(missing)}) on the topology")
    if opts.weight_precision == "fp32":
        half = need_total * _fp16_ratio(ctx)
        enough = half <= per_rank * ctx.W * fill
        s.append(f"fp16 weights (weight_precision='fp16': {gb(half)} in all, which "
                 + ("would fit)" if enough else "alone is still too much)"))
    if opts.optimizer in ("adam", "exact_adagrad"):
        s.append("an optimizer with less state (exact_rowwise_adagrad)")
    return s


def _fp16_ratio(ctx: PlanContext) -> float:
    m = ctx.model
    t = ctx.tables
    full = m.storage_bytes(t.N, t.D).sum()
    half = (t.N * (t.D * (PRECISION_BYTES["fp16"] + m.opt_elem) + m.opt_row)).sum()
    return float(half / full) if full else 1.0


def _raise_capacity(ctx: PlanContext, i: int, storage: np.ndarray, is_dp: np.ndarray,
                    remaining: float, fill: float, reserved: float = 0.0) -> None:
    name = ctx.tables.names[i]
    opts = ctx.opts
    total = float(storage[~is_dp].sum())
    cap = float(sum(ctx.budget[a] for a in ctx.avail) * ctx.W)
    sug = _suggestions(ctx, total, fill)
    # the compute tier's lookup buffers (and replicated tables) come first: say how much
    held = (f", {gb(reserved)} of it held in {TIERS[ctx.ct]} for the lookups' input/output "
            "buffers and replicated tables" if reserved > 0 else "")
    raise PlannerError(
        f"table {name!r} ({gb(storage[i])}, weights + {opts.optimizer} state in "
        f"{opts.weight_precision}) does not fit: only {gb(remaining)} left of "
        f"{gb(cap)} usable ({'+'.join(TIERS[a] for a in ctx.avail)}, "
        f"memory_fraction={opts.memory_fraction}{held}) on {ctx.W} ranks for {gb(total)} of "
        f"tables; to fit, use " + "; or ".join(sug),
        table=name, bytes_needed=float(storage[i]), capacity=remaining, suggestions=sug)


def _raise_tier_missing(ctx: PlanContext, i: int, p: int, nbytes: float) -> None:
    name = ctx.tables.names[i]
    sug = [f"pin it to one of {', '.join(TIERS[a] for a in ctx.avail)}", "remove the pin"]
    raise PlannerError(
        f"table {name!r} ({gb(nbytes)}) is pinned to tier {TIERS[p]!r}, which has capacity 0 "
        f"on topology {ctx.topo.name!r}; to fit, " + " or ".join(sug),
        table=name, bytes_needed=float(nbytes), capacity=0.0, suggestions=sug)


def _raise_too_big(ctx: PlanContext, i: int, nbytes: float, shard: float, p: int) -> None:
    name = ctx.tables.names[i]
    cap = float(ctx.budget[p])
    sug = []
    if cap > 0:
        ranks = int(np.ceil(nbytes / cap / ctx.Lw) * ctx.Lw)
        sug.append(f"more ranks (>= {ranks}) or row-wise sharding allowed")
    lower = [TIERS[a] for a in ctx.avail if a > p]
    if lower:
        sug.append(f"a lower tier ({', '.join(lower)})")
    if ctx.opts.weight_precision == "fp32":
        sug.append("fp16 weights (weight_precision='fp16')")
    raise PlannerError(
        f"table {name!r} ({gb(nbytes)}) cannot fit tier {TIERS[p]!r}: its smallest allowed "
        f"shard needs {gb(shard)} but one rank has {gb(cap)} usable; to fit, use "
        + "; or ".join(sug),
        table=name, bytes_needed=float(nbytes), capacity=cap, suggestions=sug)
