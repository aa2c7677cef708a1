"""Stage 5: local search that lowers the slowest rank of a placed plan.

In: the ``PlanContext`` and a ``Solution`` (``placement.place``; not modified).
Out: ``improve`` -> a ``Solution`` whose maximum rank cost is no higher (shards moved between
ranks; sharding types, tiers and caches unchanged).

Each step works on the most loaded rank: the best single move of one of its shards to a rank with
room (and no shard of the same table), else the best swap with a shard on one of the lightest
ranks (``wide``: with any cheaper shard of any rank, up to ``WIDE_SHARDS`` of them), else a
2-way re-partition of its shards and a light rank's by largest differencing (Karmarkar-Karp),
else (with ``groups``, on more than one host) a host-bound group of the rank moved whole to
another host or swapped with a host-bound group of another host (``_move_group``). It stops
when none lowers the maximum, or after ``max_improve_iters`` steps (0: 8 x world_size + 200).
Shards of groups spanning every rank never move; host-bound shards move between hosts only as
a whole group.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from .context import INF, PlanContext
from .shards import Layout, Solution, summarize


def improve(ctx: PlanContext, sol: Solution, groups: bool = False, wide: bool = False) -> Solution:
    W = ctx.W
    if W < 2 or sol.layout.rank.size == 0:
        return sol
    lay = replace(sol.layout, rank=sol.layout.rank.copy())
    load = sol.load.copy()
    free, occ = sol.free.copy(), sol.occ.copy()
    cost = lay.cost
    sizes = np.zeros(lay.rank.size, dtype=np.int64)
    for _, s, e in lay.groups:
        sizes[s:e] = e - s
    movable = sizes < W
    iters = ctx.opts.max_improve_iters or (8 * W + 200)
    host_of = ctx.host_of
    hosts = W // ctx.Lw
    idx_all = np.arange(lay.rank.size)
    for _ in range(iters):
        r = int(np.argmax(load))
        Lr = load[r]
        tol = 1e-9 * Lr
        on_r = idx_all[(lay.rank == r) & movable]
        if on_r.size == 0:
            break
        on_r = on_r[np.lexsort((on_r, -cost[on_r]))][:64]
        c = cost[on_r]
        tab = lay.table[on_r]
        need = lay.need[on_r]
        # single move
        ok = np.all(free[None, :, :] >= need[:, :, None] - 1e-6, axis=1)
        ok &= occ[tab] == 0
        hb = lay.host_bound[on_r]
        ok &= ~hb[:, None] | (host_of[None, :] == host_of[r])
        pair = np.maximum(Lr - c[:, None], load[None, :] + c[:, None])
        pair = np.where(ok, pair, INF)
        a = int(np.argmin(pair))
        if pair.flat[a] < Lr - tol:
            si, q = divmod(a, W)
            _move(lay, int(on_r[si]), q, load, free, occ)
            continue
        # swap with a shard on one of the lightest ranks (``wide``: on any rank, lighter than
        # the costliest of ``r``'s, since only those can lower it)
        light = np.argsort(load, kind="stable")[: min(8, W - 1)]
        light = light[light != r]
        if wide:
            on_l = idx_all[(lay.rank != r) & movable & (cost < c[0])]
        else:
            on_l = idx_all[np.isin(lay.rank, light) & movable]
        if on_l.size:
            on_l = on_l[np.lexsort((on_l, -cost[on_l]))][:WIDE_SHARDS if wide else 256]
            if _best_swap(ctx, lay, on_r, on_l, r, load, free, occ, tol):
                continue
        if _kk_pair(ctx, lay, r, light[:4], load, free, occ, movable, tol):
            continue
        if groups and hosts > 1 and _move_group(ctx, lay, r, load, free, occ, tol):
            continue
        break
    return summarize(ctx, lay, sol.dp_tables, sol.dp_compute, sol.dp_comms, sol.dp_need,
                     sol.dp_storage, sol.cache_fraction, free, occ)


# Shards of other ranks a wide swap weighs against the slowest rank's (the costliest first).
WIDE_SHARDS = 4096


class _SameSize(NamedTuple):
    """The host-bound groups of one size, in the layout's order: table, host, and per group its
    shards sorted by rank (ranks, shard indices, costs, bytes per tier)."""

    tab: np.ndarray  # (G,)
    host: np.ndarray  # (G,)
    rb: np.ndarray  # (G, k)
    sb: np.ndarray  # (G, k)
    cb: np.ndarray  # (G, k)
    nb: np.ndarray  # (G, k, 3)


def _groups_of_size(lay: Layout, hb_groups, k: int, host_of) -> _SameSize | None:
    same = [(tab, s) for tab, s, e in hb_groups if e - s == k]
    if not same:
        return None
    starts = np.array([s for _, s in same])
    idx = starts[:, None] + np.arange(k)[None, :]
    order = np.argsort(lay.rank[idx], axis=1, kind="stable")
    sb = np.take_along_axis(idx, order, axis=1)
    rb = lay.rank[sb]
    return _SameSize(np.array([t for t, _ in same]), host_of[rb[:, 0]], rb, sb,
                     lay.cost_of(sb), lay.need[sb])


def _move(lay: Layout, s: int, q: int, load: np.ndarray, free: np.ndarray,
          occ: np.ndarray) -> None:
    r = int(lay.rank[s])
    c = lay.compute[s] + lay.comms[s]
    load[r] -= c
    load[q] += c
    free[:, r] += lay.need[s]
    free[:, q] -= lay.need[s]
    occ[lay.table[s], r] -= 1
    occ[lay.table[s], q] += 1
    lay.rank[s] = q


def _best_swap(ctx: PlanContext, lay: Layout, on_r, on_l, r, load, free, occ, tol) -> bool:
    cost = lay.cost
    cs, ct_ = cost[on_r], cost[on_l]
    q = lay.rank[on_l]
    delta = cs[:, None] - ct_[None, :]
    Lr = load[r]
    pair = np.maximum(Lr - delta, load[q][None, :] + delta)
    ts, tt = lay.table[on_r], lay.table[on_l]
    ok = delta > 0
    ok &= ts[:, None] != tt[None, :]
    ok &= occ[ts[:, None], q[None, :]] == 0
    ok &= (occ[tt, r] == 0)[None, :]
    hs, hl = lay.host_bound[on_r], lay.host_bound[on_l]
    same_host = ctx.host_of[q] == ctx.host_of[r]
    ok &= (~hs[:, None] | same_host[None, :]) & (~hl | same_host)[None, :]
    ns, nl = lay.need[on_r], lay.need[on_l]
    dn = ns[:, None, :] - nl[None, :, :]  # bytes leaving r, arriving at q
    ok &= np.all(free[:, r][None, None, :] + dn >= -1e-6, axis=2)
    ok &= np.all(free[:, q].T[None, :, :] - dn >= -1e-6, axis=2)
    pair = np.where(ok, pair, INF)
    a = int(np.argmin(pair))
    if not pair.flat[a] < Lr - tol:
        return False
    i, j = divmod(a, on_l.size)
    s, t = int(on_r[i]), int(on_l[j])
    qq = int(lay.rank[t])
    _move(lay, s, qq, load, free, occ)
    _move(lay, t, r, load, free, occ)
    return True


def _kk_pair(ctx: PlanContext, lay: Layout, r, partners, load, free, occ, movable, tol) -> bool:
    cost = lay.cost
    Lr = load[r]
    for q in partners:
        q = int(q)
        if q == r:
            continue
        cand = np.flatnonzero(((lay.rank == r) | (lay.rank == q)) & movable)
        if cand.size < 2:
            continue
        tabs = lay.table[cand]
        both = (occ[tabs, r] > 0) & (occ[tabs, q] > 0)
        if ctx.host_of[q] != ctx.host_of[r]:
            both |= lay.host_bound[cand]
        items = cand[~both]
        if items.size < 2:
            continue
        fixed_r = Lr - cost[items[lay.rank[items] == r]].sum()
        fixed_q = load[q] - cost[items[lay.rank[items] == q]].sum()
        to_r = _ldm_two_way(cost[items], fixed_r, fixed_q)
        new_r = fixed_r + cost[items][to_r].sum()
        new_q = fixed_q + cost[items][~to_r].sum()
        if max(new_r, new_q) >= Lr - tol:
            continue
        dest = np.where(to_r, r, q)
        moving = items[lay.rank[items] != dest]
        dn = np.zeros((3,))
        dq = np.zeros((3,))
        for s in moving:
            if lay.rank[s] == r:
                dn += lay.need[s]
                dq -= lay.need[s]
            else:
                dn -= lay.need[s]
                dq += lay.need[s]
        if (free[:, r] + dn < -1e-6).any() or (free[:, q] + dq < -1e-6).any():
            continue
        for s in moving:
            _move(lay, int(s), int(dest[np.flatnonzero(items == s)[0]]), load, free, occ)
        return True
    return False


def _ldm_two_way(values: np.ndarray, fixed_a: float, fixed_b: float) -> np.ndarray:
    """Largest differencing (Karmarkar-Karp) 2-way partition with two fixed loads that must end on
    different sides. Returns a bool array: True = on the side of ``fixed_a``."""
    heap: list[tuple[float, int, list[int], list[int]]] = []
    d = fixed_a - fixed_b
    heap.append((-abs(d), -1, [-1] if d >= 0 else [-2], [-2] if d >= 0 else [-1]))
    for i in np.lexsort((np.arange(len(values)), -values)):
        heap.append((-float(values[i]), int(i), [int(i)], []))
    heapq.heapify(heap)
    counter = len(values)
    while len(heap) > 1:
        d1, _, a1, b1 = heapq.heappop(heap)
        d2, _, a2, b2 = heapq.heappop(heap)
        counter += 1
        heapq.heappush(heap, (d1 - d2, counter, a1 + b2, b1 + a2))
    _, _, a, b = heap[0]
    side_a = a if -1 in a else b
    out = np.zeros(len(values), dtype=bool)
    out[[i for i in side_a if i >= 0]] = True
    return out


def _moves(free: np.ndarray, load: np.ndarray, alive: np.ndarray, h: int, Lw: int,
           sa: np.ndarray, ca: np.ndarray, na: np.ndarray, left_max: float
           ) -> tuple[float, list[tuple[int, int]]] | None:
    """The best move of a host-bound group (shards ``sa``, costs ``ca``, needs ``na``, from
    host ``h``) to one of the hosts ``alive``: every host filled at once, greedy by cost onto
    its lightest rank with room; (the highest load it leaves, the moves) for the first host with
    the least, or None if the group fits on none."""
    H = alive.size
    alive = alive.copy()
    alive[h] = False
    if not alive.any():
        return None
    hosts = np.arange(H)
    ld = load.reshape(H, Lw).copy()
    f = free.reshape(3, H, Lw).copy()
    used = np.zeros((H, Lw), dtype=bool)
    got = np.zeros((H, sa.size), dtype=np.int64)
    order = np.lexsort((np.arange(sa.size), -ca))
    for i in order:
        ok = ~used & (f >= na[i][:, None, None] - 1e-6).all(axis=0)
        alive &= ok.any(axis=1)
        if not alive.any():
            return None
        j = np.where(ok, ld, np.inf).argmin(axis=1)  # the first of the lightest with room
        j = np.where(alive, j, 0)
        used[hosts, j] |= alive
        ld[hosts, j] += np.where(alive, ca[i], 0.0)
        f[:, hosts, j] -= np.where(alive, na[i][:, None], 0.0)
        got[:, i] = hosts * Lw + j
    worst = np.where(alive, np.maximum(left_max, ld.max(axis=1)), np.inf)
    h2 = int(worst.argmin())
    return float(worst[h2]), [(int(sa[i]), int(got[h2, i])) for i in order]


def _move_group(ctx: PlanContext, lay: Layout, r: int, load, free, occ, tol) -> bool:
    """Lower rank ``r`` by moving one of its host-bound groups (table_row_wise,
    table_column_wise) whole to another host, or by swapping it with a host-bound group of
    another host with as many shards. The host-level counterpart of the rank moves: the groups
    of one host's hot tables, placed by memory, can leave that host's every rank above the rest.
    Moves: the group's costliest shard to the destination's lightest rank with room (in
    every tier). Swaps: the i-th shard (by rank) of one group takes the rank of the other's i-th.
    The best candidate by the highest load it leaves on the ranks involved is applied if that
    is below ``load[r]``; returns whether one was."""
    Lw = ctx.Lw
    host_of = ctx.host_of
    Lr = load[r]
    hb_groups = [(tab, s, e) for tab, s, e in lay.groups if lay.host_bound[s]]
    mine = [g for g in hb_groups if (lay.rank[g[1]:g[2]] == r).any()]
    if not mine:
        return False
    best: tuple[float, list[tuple[int, int]]] | None = None
    by_size: dict[int, _SameSize | None] = {}
    host_max = load.reshape(-1, Lw).max(axis=1)  # nothing moves until the best is applied
    for tab, s, e in mine:
        h = int(host_of[lay.rank[s]])
        ra = np.sort(lay.rank[s:e])
        sa = s + np.argsort(lay.rank[s:e], kind="stable")
        ca, na = lay.cost_of(sa), lay.need[sa]
        # moves: to every other host, greedy by cost onto its lightest ranks with room (a
        # move's worst load is at least the group's ranks' after it leaves and the destination
        # host's heaviest rank now: where either is no better than the best so far, skip it)
        left_max = float((load[ra] - ca).max())
        bar = Lr - tol if best is None else min(Lr - tol, best[0])
        if left_max < bar:
            got = _moves(free, load, host_max < bar, h, Lw, sa, ca, na, left_max)
            if got is not None and got[0] < bar:
                best = got
        # swaps with a host-bound group of another host with as many shards (all at once;
        # the first of the least worst loads, as one by one in the groups' order)
        k = e - s
        if k not in by_size:
            by_size[k] = _groups_of_size(lay, hb_groups, k, host_of)
        g = by_size[k]
        if g is None:
            continue
        ok = (g.host != h) & ~(occ[g.tab][:, ra] > 0).any(axis=1) & ~(occ[tab][g.rb] > 0).any(axis=1)
        fa, fb = free.T[ra], free.T[g.rb]  # (k, 3), (G, k, 3)
        ok &= np.all(fa[None] + (na[None] - g.nb) >= -1e-6, axis=(1, 2))
        ok &= np.all(fb + (g.nb - na[None]) >= -1e-6, axis=(1, 2))
        worst = np.maximum(((load[ra] - ca)[None] + g.cb).max(axis=1),
                           ((load[g.rb] - g.cb) + ca[None]).max(axis=1))
        bar = Lr - tol if best is None else min(Lr - tol, best[0])
        ok &= worst < bar
        if ok.any():
            j = int(np.flatnonzero(ok)[np.argmin(worst[ok])])
            best = (float(worst[j]), [(int(x), int(q)) for x, q in zip(sa, g.rb[j])]
                    + [(int(x), int(q)) for x, q in zip(g.sb[j], ra)])
    if best is None:
        return False
    moves = best[1]
    # apply in two steps (all out, then all in) so a swap never sees a half-moved state
    for sh, _ in moves:
        q0 = int(lay.rank[sh])
        c = lay.compute[sh] + lay.comms[sh]
        load[q0] -= c
        free[:, q0] += lay.need[sh]
        occ[lay.table[sh], q0] -= 1
    for sh, q in moves:
        c = lay.compute[sh] + lay.comms[sh]
        load[q] += c
        free[:, q] -= lay.need[sh]
        occ[lay.table[sh], q] += 1
        lay.rank[sh] = q
    return True
