"""Stage 4: a rank for every shard, largest group first, demoting what does not fit.

In: the ``PlanContext``, a ``Layout`` (``shards.build_layout``; not modified), the data-parallel
mask and the cache fraction that a shard moved to a lower tier gets. Shards whose rank is set
already (``shards.replace_table``: one table's option changed in a placed plan) stay there; the
others are placed around them.
Out: ``place`` -> ``Solution`` with every shard's rank set (on a copy of the layout, whose tiers,
caches and costs may differ where shards were demoted). Raises ``PlannerError`` naming the table
when a shard group fits nowhere even in the lowest tier, or when the replicated tables alone
overflow the compute tier.

Order: groups spanning every rank first, then by the larger of a group's costliest shard against
the mean rank load and its largest memory share of one rank's tier (vector bin-packing); "greedy"
orders by cost and places by least load (LPT), "round_robin" keeps table order and takes ranks in
turn. Each group goes to the ranks with the lowest max(cost share, memory share) that have room in
every tier; host-bound groups (table_row_wise, table_column_wise) take the best host. A group that
fits nowhere loses its cache, then moves one tier down, and is tried again.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .context import INF, PlanContext, gb
from .cost import DP
from .shards import Layout, Solution, cost_shards, summarize
from .types import TIERS, PlannerError


def place(ctx: PlanContext, layout: Layout, is_dp: np.ndarray, cache_fraction: float) -> Solution:
    lay = layout.copy()
    W = ctx.W
    t = ctx.tables
    opts = ctx.opts
    budget = ctx.budget
    compute = np.zeros(W)
    comms = np.zeros(W)
    free = np.repeat(budget[:, None], W, axis=1)
    dp_idx = np.flatnonzero(is_dp)
    ct = np.full(dp_idx.size, ctx.ct)
    dpc = ctx.model.shards(DP, t.N[dp_idx], t.L[dp_idx], t.F[dp_idx], t.N[dp_idx],
                           t.D[dp_idx], W, ct, 0.0, t.U[dp_idx])
    dp_need = np.zeros((dp_idx.size, 3))
    dp_need[:, ctx.ct] = dpc.storage + dpc.io
    compute += dpc.compute.sum()
    comms += dpc.comms.sum()
    free -= dp_need.sum(axis=0)[:, None]
    if (free < -1e-6).any():
        i = int(dp_idx[np.argmax(dp_need[:, ctx.ct])])
        raise PlannerError(
            f"data-parallel tables need {gb(dp_need.sum())} per rank, more than the "
            f"{gb(budget[ctx.ct])} usable in {TIERS[ctx.ct]}; largest is "
            f"{t.names[i]!r}; to fit, allow table_wise/row_wise for it",
            table=t.names[i], bytes_needed=float(dp_need.sum()),
            capacity=float(budget[ctx.ct]), suggestions=("allow table_wise/row_wise",))
    load = compute + comms
    occ = np.zeros((ctx.n, W), dtype=np.int32)
    cost = lay.cost
    ng = len(lay.groups)
    starts = np.array([s for _, s, _ in lay.groups], dtype=np.int64)
    # shards already placed (a layout where one table's option changed) stay where they are
    placed = lay.rank >= 0
    if placed.any():
        np.add.at(load, lay.rank[placed], cost[placed])
        np.add.at(free.T, lay.rank[placed], -lay.need[placed])
        np.add.at(occ, (lay.table[placed], lay.rank[placed]), 1)
    # groups spanning every rank have only one placement (up to order): place them first
    full = np.array([e - s >= W for _, s, e in lay.groups], dtype=bool)
    if opts.strategy == "round_robin":
        order = list(np.lexsort((np.arange(ng), ~full)))
    elif ng:
        # Largest first, measuring a group by its costliest shard against the mean rank load
        # and by its largest memory share of one rank's tier (vector bin-packing order).
        gcost = np.maximum.reduceat(cost, starts)
        mean = (cost[~placed].sum() + load.sum()) / W
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(budget > 0, lay.need / budget, 0.0).max(axis=1)
        gmem = np.maximum.reduceat(share, starts)
        key = np.maximum(gcost / max(mean, 1e-30), gmem)
        if opts.strategy == "greedy":
            key = gcost
        order = list(np.lexsort((np.arange(ng), -key, ~full)))
    else:
        order = []
    order = [gi for gi in order if lay.rank[starts[gi]] < 0]
    mean = max((cost[~placed].sum() + load.sum()) / W, 1e-30)
    has = budget > 0
    bh = budget[has, None]
    every = bool(has.all())  # then ``free`` itself, not the copy ``free[has]``
    strategy = opts.strategy

    def vector(cmax: float, need: np.ndarray) -> np.ndarray:
        """Vector scheduling: the larger of each rank's cost and memory shares after adding a
        shard costing ``cmax`` and needing ``need``, so memory-heavy shards go where memory
        is free."""
        used = bh - (free if every else free[has]) + (need[:, None] if every else need[has, None])
        mem = (used / bh).max(axis=0) if bh.size else 0.0
        return np.maximum((load + cmax) / mean, mem)

    # one-shard groups off a host's bounds are most of a large mix: they take the short path
    short = strategy == "balanced"
    pointer = 0
    for gi in order:
        tab, s, e = lay.groups[gi]
        if short and e - s == 1 and not lay.host_bound[s]:
            q = _place_one(ctx, lay, s, free, vector, cache_fraction)
            lay.rank[s] = q
            load[q] += lay.compute[s] + lay.comms[s]
            free[:, q] -= lay.need[s]
            occ[tab, q] += 1
            continue
        while True:
            cmax = lay.cost_of(slice(s, e)).max()
            need = lay.need[s:e].max(axis=0)
            if strategy == "round_robin":
                prio = ((np.arange(W) - pointer) % W).astype(float)
            elif strategy == "greedy":
                prio = load + cmax
            else:
                prio = vector(cmax, need)
            ranks = _place_group(ctx, lay, s, e, prio, free, need)
            if ranks is not None:
                break
            _demote(ctx, lay, s, e, free, cache_fraction)
        lay.rank[s:e] = ranks
        # a group's shards are on distinct ranks: plain fancy-index updates add each once
        load[ranks] += lay.cost_of(slice(s, e))
        free[:, ranks] -= lay.need[s:e].T
        occ[tab, ranks] += 1
        pointer = (int(ranks[0]) + 1) % W
    return summarize(ctx, lay, dp_idx, dpc.compute, dpc.comms, dp_need, dpc.storage,
                     cache_fraction, free, occ)


def _place_one(ctx: PlanContext, lay: Layout, s: int, free: np.ndarray,
               vector: Callable[[float, np.ndarray], np.ndarray], cache_fraction: float) -> int:
    """The rank for shard s alone (balanced order, priority ``vector``), demoting it until one
    has room: the same choice as ``place``'s loop with ``_place_group``, in fewer array
    operations."""
    while True:
        need = lay.need[s]
        prio = vector(lay.compute[s] + lay.comms[s], need)
        ok = (free >= need[:, None] - 1e-6).all(axis=0)
        q = int(np.where(ok, prio, INF).argmin())
        if ok[q]:
            return q
        _demote(ctx, lay, s, s + 1, free, cache_fraction)


def _place_group(ctx: PlanContext, lay: Layout, s: int, e: int, prio: np.ndarray,
                 free: np.ndarray, need: np.ndarray) -> np.ndarray | None:
    """Ranks for shards s..e (largest shard on the best rank), or None if they do not fit."""
    W = ctx.W
    k = e - s
    cost = lay.cost_of(slice(s, e))
    ok = (free >= need[:, None] - 1e-6).all(axis=0)
    ranks = np.empty(k, dtype=np.int64)
    if k == 1 and not lay.host_bound[s]:  # the lowest priority with room, the lowest rank
        q = int(np.where(ok, prio, INF).argmin())
        if not ok[q]:
            return None
        ranks[0] = q
        return ranks
    desc = np.argsort(-cost, kind="stable")  # largest first, in index order among equals
    if not lay.host_bound[s]:
        cand = np.flatnonzero(ok)
        if cand.size < k:
            return None
        ranks[desc] = cand[np.argsort(prio[cand], kind="stable")[:k]]  # cand ascends
        return ranks
    Lw = ctx.Lw
    H = W // Lw
    okh = ok.reshape(H, Lw)
    enough = okh.sum(axis=1) >= k
    if k > Lw or not enough.any():
        return None
    p = np.where(okh, prio.reshape(H, Lw), INF)
    order = np.argsort(p, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(p, order, axis=1)
    score = chosen[:, 0] if ctx.opts.strategy == "round_robin" else chosen.max(axis=1)
    h = int(np.argmin(np.where(enough, score, INF)))
    ranks[desc] = h * Lw + order[h]
    return ranks


def _demote(ctx: PlanContext, lay: Layout, s: int, e: int, free: np.ndarray,
            cache_fraction: float) -> None:
    """Make shards s..e easier to place: drop their cache, else move them one tier down."""
    cur = int(lay.tier[s])
    if cur != ctx.ct and lay.cache[s] > 0:
        lay.cache[s:e] = 0.0
    else:
        lower = [a for a in ctx.avail if a > cur]
        if not lower:
            _raise_unplaceable(ctx, lay, s, e, free)
        lay.tier[s:e] = lower[0]
        lay.cache[s:e] = cache_fraction
    cost_shards(ctx, lay, np.arange(s, e))


def _raise_unplaceable(ctx: PlanContext, lay: Layout, s: int, e: int, free: np.ndarray) -> None:
    tab = int(lay.table[s])
    name = ctx.tables.names[tab]
    opts = ctx.opts
    need = lay.need[s:e].max(axis=0)
    k = e - s
    # the tier that blocks: where fewer than k ranks have room
    short = [a for a in range(3) if need[a] > 0 and (free[a] >= need[a] - 1e-6).sum() < k]
    a = short[0] if short else int(lay.tier[s])
    what = "cache + I/O buffers" if a == ctx.ct and a != int(lay.tier[s]) else "shard"
    room = float(np.sort(free[a])[::-1][min(k, ctx.W) - 1])
    # the whole mix's demand on that tier: placed so far, plus every shard still to place
    usable = float(ctx.budget[a]) * ctx.W
    demand = usable - float(free[a].sum()) + float(lay.need[lay.rank < 0, a].sum())
    sug = [f"more ranks (> {ctx.W})"]
    if opts.weight_precision == "fp32":
        sug.append("fp16 weights (weight_precision='fp16')")
    missing = [t for t in TIERS[1:] if ctx.topo.capacity(t) <= 0]
    if missing:
        sug.append(f"a lower tier ({', '.join(missing)}) on the topology")
    if opts.cache_fraction:
        sug.append("a smaller cache_fraction")
    raise PlannerError(
        f"table {name!r}: its {k} shard(s) need {gb(need[a])} each ({what}) in tier "
        f"{TIERS[a]!r} but only {min(k, ctx.W)} rank(s) with {gb(room)} free remain after "
        f"placing larger shards (capacity {gb(ctx.capacity[a])} per rank, memory_fraction="
        f"{opts.memory_fraction}); all shards need {gb(demand)} of the {gb(usable)} usable in "
        f"{TIERS[a]!r} on {ctx.W} ranks ({demand / usable:.0%}); to fit, use "
        + "; or ".join(sug),
        table=name, bytes_needed=float(need[a]), capacity=room, suggestions=sug)
