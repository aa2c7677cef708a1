"""Stage 6c: pack the final plan's shards again against a target maximum (MULTIFIT).

In: the ``PlanContext`` and a placed ``Solution`` (not modified).
Out: ``repack`` -> the better of that solution and the same shards (same options, tiers and
caches) placed anew, then searched (``local_search.improve``).

Placement and local search put the largest shards first on the least loaded rank (LPT) and
then move one or two shards at a time; where every rank holds two or three pieces of 0.3-0.9 of
the mean, that can end well above a packing of the same pieces that exists. Here the maximum is
a target ``T``, halved between the mean and the plan's maximum (``ROUNDS`` times): the shards,
largest group first, are packed into ranks of capacity ``T``: each onto the fullest rank that
still has room for it (best fit) or onto the first (first fit; both are tried), with room in
every tier, no two shards of a table on one rank, a host-bound group's shards on one host (best
fit: the host they leave least slack on). The lowest ``T`` that packs is searched and kept if it
is better. Groups spanning every rank and replicated tables stay where they are. Deterministic.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .context import PlanContext
from .local_search import improve
from .shards import Solution, better, summarize

ROUNDS = 10
# Targets within this share of the lower end are not tried (nothing worth a placement).
GAIN = 1e-3


def repack(ctx: PlanContext, sol: Solution) -> Solution:
    lay = sol.layout
    W = ctx.W
    if W < 2 or lay.rank.size == 0:
        return sol
    movable = [gi for gi, (_, s, e) in enumerate(lay.groups) if e - s < W]
    if not movable:
        return sol
    top = np.array([lay.cost[s:e].max() for _, s, e in (lay.groups[g] for g in movable)])
    order = [movable[i] for i in np.lexsort((np.arange(len(movable)), -top))]
    best = sol
    for first_fit in (False, True):
        lo, hi = float(max(sol.load.mean(), top.max())), float(sol.load.max())
        packed = None
        for _ in range(ROUNDS):
            if hi <= lo * (1 + GAIN):
                break
            target = (lo + hi) / 2
            got = _pack(ctx, sol, order, target, first_fit)
            if got is None:
                lo = target
            else:
                hi, packed = target, got
        if packed is not None:
            packed = improve(ctx, packed, groups=ctx.W > ctx.Lw)
            if better(packed, best):
                best = packed
    return best


def _pack(ctx: PlanContext, sol: Solution, order: list[int], target: float,
          first_fit: bool) -> Solution | None:
    """The groups ``order`` taken off their ranks and packed again under ``target``; None
    where one does not fit."""
    lay = sol.layout
    load, free, occ = sol.load.copy(), sol.free.copy(), sol.occ.copy()
    rank = lay.rank.copy()
    for gi in order:
        tab, s, e = lay.groups[gi]
        np.add.at(load, rank[s:e], -lay.cost[s:e])
        np.add.at(free.T, rank[s:e], lay.need[s:e])
        np.add.at(occ[tab], rank[s:e], -1)
    for gi in order:
        tab, s, e = lay.groups[gi]
        shards = s + np.lexsort((np.arange(e - s), -lay.cost[s:e]))
        if lay.host_bound[s]:
            ranks = _host_group(ctx, lay, shards, load, free, target, first_fit)
        else:
            ranks = _spread_group(lay, shards, occ[tab] > 0, load, free, target, first_fit)
        if ranks is None:
            return None
        # (the shards of one group are on distinct ranks: none sees another's load)
        np.add.at(load, ranks, lay.cost[shards])
        np.add.at(free.T, ranks, -lay.need[shards])
        rank[shards] = ranks
        occ[tab, ranks] += 1
    new = replace(lay, rank=rank)
    return summarize(ctx, new, sol.dp_tables, sol.dp_compute, sol.dp_comms, sol.dp_need,
                     sol.dp_storage, sol.cache_fraction, free, occ)


def _spread_group(lay, shards: np.ndarray, taken: np.ndarray, load: np.ndarray,
                  free: np.ndarray, target: float, first_fit: bool) -> np.ndarray | None:
    """A rank for each shard (largest first) with room under ``target``, no two on one rank
    and none on a rank holding the table already (``taken``), or None."""
    taken = taken.copy()
    ranks = np.empty(shards.size, dtype=np.int64)
    for i, x in enumerate(shards):
        ok = ~taken & (load + lay.cost[x] <= target)
        ok &= np.all(free >= lay.need[x][:, None] - 1e-6, axis=0)
        cand = np.flatnonzero(ok)
        if cand.size == 0:
            return None
        q = int(cand[0] if first_fit else cand[np.argmax(load[cand])])
        ranks[i] = q
        taken[q] = True
    return ranks


def _host_group(ctx: PlanContext, lay, shards: np.ndarray, load: np.ndarray, free: np.ndarray,
                target: float, first_fit: bool) -> np.ndarray | None:
    """Ranks on one host for a host-bound group's shards (largest first), or None."""
    Lw = ctx.Lw
    best: tuple[float, np.ndarray] | None = None
    for h in range(ctx.W // Lw):
        ranks = np.arange(h * Lw, (h + 1) * Lw)
        ld, fr = load[ranks].copy(), free[:, ranks].copy()
        used = np.zeros(Lw, dtype=bool)
        got = np.empty(shards.size, dtype=np.int64)
        for i, x in enumerate(shards):
            ok = ~used & (ld + lay.cost[x] <= target)
            ok &= np.all(fr >= lay.need[x][:, None] - 1e-6, axis=0)
            cand = np.flatnonzero(ok)
            if cand.size == 0:
                break
            j = int(cand[0] if first_fit else cand[np.argmax(ld[cand])])
            used[j] = True
            ld[j] += lay.cost[x]
            fr[:, j] -= lay.need[x]
            got[i] = ranks[j]
        else:
            if first_fit:
                return got
            slack = float((target - ld[used]).sum())
            if best is None or slack < best[0]:
                best = (slack, got)
    return None if best is None else best[1]
