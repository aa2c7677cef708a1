"""The shards of a proposal (``Layout``) and a placed plan's per-rank totals (``Solution``).

In: the ``PlanContext``, the option chosen per table (``proposals.select``), and the tables' tiers
and cache fractions.
Out: ``build_layout`` -> ``Layout``: every non-replicated shard as arrays (geometry, tier, cache,
cost, bytes per tier), ranks unset (-1); ``summarize`` -> ``Solution``: a placed layout with the
data-parallel tables, per-rank cost and memory, free bytes and shards per (table, rank);
``better(a, b)``: the ordering of solutions every stage uses (lower maximum, then evener).
``cost_shards`` re-costs shards in place after a stage changed their tier or cache (placement
works on its own copy of a layout); ``replace_table`` swaps one table's shards in a placed
layout for unplaced shards of another option or tier.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .context import PlanContext
from .cost import CW, DP, RW, TWCW, TWRW, column_splits, row_blocks


@dataclass(frozen=True, eq=False)
class Layout:
    """Every non-replicated shard, as arrays; the shards of one table are contiguous."""

    table: np.ndarray
    kind: np.ndarray
    row_off: np.ndarray
    row_len: np.ndarray
    col_off: np.ndarray
    col_len: np.ndarray
    k: np.ndarray
    tier: np.ndarray
    cache: np.ndarray
    compute: np.ndarray
    comms: np.ndarray
    need: np.ndarray  # (S, 3) bytes per tier
    storage: np.ndarray  # weights + optimizer state, in the shard's tier
    extra: np.ndarray  # cache + I/O buffers, in the compute tier
    host_bound: np.ndarray  # bool: all shards of the table stay in one host
    rank: np.ndarray
    groups: list[tuple[int, int, int]]  # (table, start, end)

    @property
    def cost(self) -> np.ndarray:
        return self.compute + self.comms

    def cost_of(self, idx) -> np.ndarray:
        """``cost[idx]`` without costing every other shard (a slice or an index array)."""
        return self.compute[idx] + self.comms[idx]

    def copy(self) -> Layout:
        """A copy whose arrays a stage may change without touching this one."""
        return Layout(**{f.name: (getattr(self, f.name).copy() if f.name != "groups"
                                  else self.groups) for f in fields(self)})


@dataclass(frozen=True, eq=False)
class Solution:
    layout: Layout
    dp_tables: np.ndarray  # table indices replicated on every rank
    dp_compute: np.ndarray  # per DP table, per rank seconds
    dp_comms: np.ndarray
    dp_need: np.ndarray  # (n_dp, 3)
    dp_storage: np.ndarray
    dp_tier: int
    kinds: np.ndarray  # sharding type per table
    cache_fraction: float
    compute: np.ndarray  # per rank
    comms: np.ndarray
    memory: np.ndarray  # (3, W)
    free: np.ndarray  # (3, W) usable bytes left per tier and rank
    occ: np.ndarray  # (tables, W) shards of each table on each rank

    @property
    def load(self) -> np.ndarray:
        return self.compute + self.comms


_FIELDS = ("table", "kind", "row_off", "row_len", "col_off", "col_len", "k", "tier", "cache",
           "compute", "comms", "need", "storage", "extra")
_FLOAT = ("cache", "compute", "comms", "need", "storage", "extra")


def build_layout(ctx: PlanContext, choice: np.ndarray, tier: np.ndarray,
                 cache: np.ndarray) -> Layout:
    """The shards of ``choice`` (an option column per table) in the tables' ``tier`` and with
    their ``cache`` fraction, unplaced. A table's shards depend on its (option, tier, cache)
    alone, so each is cut and costed once per planning run (``ctx.groups``) and reused."""
    memo = ctx.groups
    is_dp = (ctx.grid.kind == DP).tolist()
    keys = [(i, j, ti, cf) for i, j, ti, cf in zip(range(ctx.n), choice.tolist(), tier.tolist(),
                                                    cache.tolist()) if not is_dp[j]]
    missing = [key for key in keys if key not in memo]
    if missing:
        _cut(ctx, missing)
    parts = [memo[key] for key in keys]
    groups, start = [], 0
    for (i, *_), part in zip(keys, parts):
        groups.append((i, start, start + part[0].size))
        start += part[0].size
    if parts:
        cols = {f: np.concatenate([p[n] for p in parts]) for n, f in enumerate(_FIELDS)}
    else:  # every table replicated
        cols = {f: np.zeros((0, 3) if f == "need" else 0, dtype=float if f in _FLOAT else np.int64)
                for f in _FIELDS}
    return Layout(**cols, host_bound=np.isin(cols["kind"], (TWRW, TWCW)),
                  rank=np.full(start, -1, dtype=np.int64), groups=groups)


def _cut(ctx: PlanContext, keys: list[tuple[int, int, int, float]]) -> None:
    """Cut and cost the shards of each (table, option, tier, cache) of ``keys`` (costed per
    sharding type in one go) into ``ctx.groups``: per key, the arrays of ``_FIELDS``."""
    t, g, opts = ctx.tables, ctx.grid, ctx.opts
    cols: dict[str, list] = {f: [] for f in _FIELDS[:9]}
    sizes = []
    for i, j, ti, cf in keys:
        kind, k = int(g.kind[j]), int(g.k[j])
        N, D = int(t.N[i]), int(t.D[i])
        if kind in (RW, TWRW):
            geo = [(ro, rl, 0, D) for ro, rl in row_blocks(N, k)]
        elif kind in (CW, TWCW):
            widths = column_splits(D, k, opts.column_granularity)
            offs = np.concatenate([[0], np.cumsum(widths)[:-1]])
            geo = [(0, N, int(o), int(w)) for o, w in zip(offs, widths)]
        else:
            geo = [(0, N, 0, D)]
        for ro, rl, co, cl in geo:
            for f, v in zip(_FIELDS[:9], (i, kind, ro, rl, co, cl, k, ti, cf)):
                cols[f].append(v)
        sizes.append(len(geo))
    S = sum(sizes)
    arr = {f: np.array(v, dtype=float if f == "cache" else np.int64) for f, v in cols.items()}
    lay = Layout(**arr, compute=np.zeros(S), comms=np.zeros(S), need=np.zeros((S, 3)),
                 storage=np.zeros(S), extra=np.zeros(S), host_bound=np.zeros(S, dtype=bool),
                 rank=np.zeros(S, dtype=np.int64), groups=[])
    for kind in np.unique(lay.kind):
        cost_shards(ctx, lay, np.flatnonzero(lay.kind == kind))
    whole = [getattr(lay, f) for f in _FIELDS]
    for a in whole:
        a.setflags(write=False)  # layouts copy them (``np.concatenate``); nothing writes here
    start = 0
    for key, size in zip(keys, sizes):
        ctx.groups[key] = tuple(a[start:start + size] for a in whole)
        start += size


def replace_table(ctx: PlanContext, lay: Layout, tab: int, option: int, tier: np.ndarray,
                  cache: np.ndarray) -> Layout:
    """``lay`` with table ``tab``'s shards cut anew by ``option`` in ``tier[tab]`` (unplaced, at the
    end); every other shard keeps its rank. A data-parallel ``option`` just drops the table."""
    one = np.full(ctx.n, ctx.dp_col, dtype=np.int64)
    one[tab] = option
    new = build_layout(ctx, one, tier, cache)
    keep = lay.table != tab
    idx = np.flatnonzero(keep)
    remap = np.cumsum(keep) - 1
    groups = [(t, int(remap[s]), int(remap[e - 1]) + 1) for t, s, e in lay.groups if t != tab]
    base = idx.size
    groups += [(t, s + base, e + base) for t, s, e in new.groups]
    parts = {}
    for f in fields(Layout):
        if f.name == "groups":
            continue
        parts[f.name] = np.concatenate([getattr(lay, f.name)[idx], getattr(new, f.name)])
    return Layout(**parts, groups=groups)


def cost_shards(ctx: PlanContext, lay: Layout, idx: np.ndarray) -> None:
    """(Re)compute the costs and bytes of shards ``idx`` (all of one kind) from their tier and
    cache, in place."""
    if idx.size == 0:
        return
    t = ctx.tables
    kind = int(lay.kind[idx[0]])
    tab = lay.table[idx]
    sc = ctx.model.shards(kind, t.N[tab], t.L[tab], t.F[tab], lay.row_len[idx],
                          lay.col_len[idx], lay.k[idx], lay.tier[idx], lay.cache[idx], t.U[tab])
    lay.compute[idx] = sc.compute
    lay.comms[idx] = sc.comms
    need = np.zeros((idx.size, 3))
    need[np.arange(idx.size), lay.tier[idx]] += sc.storage
    need[:, ctx.ct] += sc.cache + sc.io
    lay.need[idx] = need
    lay.storage[idx] = sc.storage
    lay.extra[idx] = sc.cache + sc.io


def summarize(ctx: PlanContext, lay: Layout, dp_idx: np.ndarray, dp_compute: np.ndarray,
              dp_comms: np.ndarray, dp_need: np.ndarray, dp_storage: np.ndarray,
              cache_fraction: float, free: np.ndarray, occ: np.ndarray) -> Solution:
    """The ``Solution`` of a placed layout (every ``lay.rank`` set) and the replicated tables."""
    W = ctx.W
    compute = np.bincount(lay.rank, weights=lay.compute, minlength=W) + dp_compute.sum()
    comms = np.bincount(lay.rank, weights=lay.comms, minlength=W) + dp_comms.sum()
    memory = np.zeros((3, W))
    for tt in range(3):
        memory[tt] = np.bincount(lay.rank, weights=lay.need[:, tt], minlength=W)
    memory += dp_need.sum(axis=0)[:, None]
    kinds = np.full(ctx.n, DP, dtype=np.int64)
    for tab, s, _ in lay.groups:
        kinds[tab] = lay.kind[s]
    return Solution(layout=lay, dp_tables=dp_idx, dp_compute=dp_compute, dp_comms=dp_comms,
                    dp_need=dp_need, dp_storage=dp_storage, dp_tier=ctx.ct, kinds=kinds,
                    cache_fraction=cache_fraction, compute=compute, comms=comms, memory=memory,
                    free=free, occ=occ)


def better(a: Solution, b: Solution, rel: float = 1e-9) -> bool:
    """``a`` has a lower maximum rank cost than ``b``, or the same maximum and less spread."""
    ma, mb = a.load.max(), b.load.max()
    if ma < mb * (1 - rel):
        return True
    if ma > mb * (1 + rel):
        return False
    return ma / max(a.load.mean(), 1e-300) < mb / max(b.load.mean(), 1e-300) * (1 - rel)


def best_of(sols: list[Solution]) -> Solution:
    """The first of the best (``better``) of ``sols``."""
    best = sols[0]
    for sol in sols[1:]:
        if better(sol, best):
            best = sol
    return best
