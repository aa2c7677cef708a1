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
from .shards import Layout, Solution, better, summarize

ROUNDS = 10
# Targets within this share of the lower end are not tried (nothing worth a placement).
GAIN = 1e-3


def repack(ctx: PlanContext, sol: Solution,
           fits: tuple[bool, ...] = (False, True)) -> Solution:
    lay = sol.layout
    W = ctx.W
    if W < 2 or lay.rank.size == 0:
        return sol
    movable = [gi for gi, (_, s, e) in enumerate(lay.groups) if e - s < W]
    if not movable:
        return sol
    top = np.array([lay.cost_of(slice(s, e)).max() for _, s, e in (lay.groups[g] for g in movable)])
    order = [movable[i] for i in np.lexsort((np.arange(len(movable)), -top))]
    prep = _prepare(lay, order)  # the same for every target
    best = sol
    for first_fit in fits:
        lo, hi = float(max(sol.load.mean(), top.max())), float(sol.load.max())
        packed = None
        for _ in range(ROUNDS):
            if hi <= lo * (1 + GAIN):
                break
            target = (lo + hi) / 2
            got = _pack(ctx, sol, order, target, first_fit, prep)
            if got is None:
                lo = target
            else:
                hi, packed = target, got
        if packed is not None:
            packed = improve(ctx, packed, groups=ctx.W > ctx.Lw)
            if better(packed, best):
                best = packed
    return best


def _prepare(lay: Layout, order: list[int]) -> tuple[list[np.ndarray], list[list[int]]]:
    """The groups ``order``'s shards, largest first, and the tiers each shard needs room in."""
    cost = lay.cost
    shards = [s + np.lexsort((np.arange(e - s), -cost[s:e]))
              for _, s, e in (lay.groups[g] for g in order)]
    return shards, [np.flatnonzero(row).tolist() for row in lay.need > 0]


def _pack(ctx: PlanContext, sol: Solution, order: list[int], target: float, first_fit: bool,
          prep: tuple[list[np.ndarray], list[list[int]]] | None = None) -> Solution | None:
    """The groups ``order`` taken off their ranks and packed again under ``target``; None
    where one does not fit. ``prep``: ``_prepare(layout, order)``, where known."""
    lay = sol.layout
    shards, tiers = prep if prep is not None else _prepare(lay, order)
    cost, need = lay.cost, lay.need
    load, free, occ = sol.load.copy(), sol.free.copy(), sol.occ.copy()
    rank = lay.rank.copy()
    moved = np.concatenate([np.arange(lay.groups[gi][1], lay.groups[gi][2]) for gi in order])
    np.add.at(load, rank[moved], -cost[moved])
    np.add.at(free.T, rank[moved], need[moved])
    np.add.at(occ, (lay.table[moved], rank[moved]), -1)
    for gi, sh in zip(order, shards):
        tab, s, _ = lay.groups[gi]
        if lay.host_bound[s]:
            ranks = _host_group(ctx, cost, need, tiers, sh, load, free, target, first_fit)
        else:
            ranks = _spread_group(cost, need, tiers, sh, occ[tab] > 0, load, free, target,
                                  first_fit)
        if ranks is None:
            return None
        # the shards of one group are on distinct ranks: plain indexed updates suffice
        load[ranks] += cost[sh]
        free[:, ranks] -= need[sh].T
        rank[sh] = ranks
        occ[tab, ranks] += 1
    new = replace(lay, rank=rank)
    return summarize(ctx, new, sol.dp_tables, sol.dp_compute, sol.dp_comms, sol.dp_need,
                     sol.dp_storage, sol.cache_fraction, free, occ)


def _spread_group(cost: np.ndarray, need: np.ndarray, tiers: list[list[int]], shards: np.ndarray,
                  taken: np.ndarray,
                  load: np.ndarray, free: np.ndarray, target: float,
                  first_fit: bool) -> np.ndarray | None:
    """A rank for each shard (largest first) with room under ``target``, no two on one rank
    and none on a rank holding the table already (``taken``), or None. (``_host_group`` with
    one host of every rank does the same; this one-dimensional form is half the time on the
    search's hot path.)"""
    taken = taken.copy()
    ranks = np.empty(shards.size, dtype=np.int64)
    for i, x in enumerate(shards):
        ok = ~taken & (load + cost[x] <= target)
        for t in tiers[x]:
            ok &= free[t] >= need[x, t] - 1e-6
        cand = np.flatnonzero(ok)
        if cand.size == 0:
            return None
        q = int(cand[0] if first_fit else cand[np.argmax(load[cand])])
        ranks[i] = q
        taken[q] = True
    return ranks


def _host_group(ctx: PlanContext, cost: np.ndarray, need: np.ndarray, tiers: list[list[int]],
                shards: np.ndarray,
                load: np.ndarray, free: np.ndarray, target: float,
                first_fit: bool) -> np.ndarray | None:
    """Ranks on one host for a host-bound group's shards (largest first), or None: every host
    is filled at once (hosts x ranks arrays); the first host that takes them all (first fit) or
    the one they leave least slack on (best fit)."""
    Lw = ctx.Lw
    H = ctx.W // Lw
    ld = load.reshape(H, Lw).copy()
    fr = free.reshape(3, H, Lw).copy()
    used = np.zeros((H, Lw), dtype=bool)
    alive = np.ones(H, dtype=bool)
    got = np.zeros((H, shards.size), dtype=np.int64)
    hosts = np.arange(H)
    for i, x in enumerate(shards):
        ok = ~used & (ld + cost[x] <= target)
        for t in tiers[x]:
            ok &= fr[t] >= need[x, t] - 1e-6
        alive &= ok.any(axis=1)
        if not alive.any():
            return None
        if first_fit:
            j = np.argmax(ok, axis=1)
        else:
            j = np.argmax(np.where(ok, ld, -np.inf), axis=1)
        j = np.where(alive, j, 0)
        used[hosts, j] |= alive
        ld[hosts, j] += np.where(alive, cost[x], 0.0)
        fr[:, hosts, j] -= np.where(alive, need[x][:, None], 0.0)
        got[:, i] = hosts * Lw + j
    if first_fit:
        h = int(np.argmax(alive))
    else:
        slack = np.where(used, target - ld, 0.0).sum(axis=1)
        h = int(np.argmin(np.where(alive, slack, np.inf)))
    return got[h]
