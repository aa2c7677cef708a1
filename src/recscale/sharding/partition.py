"""Choose a sharding type per table, memory tiers, and a rank for every shard.

The steps (``solve``):

1. data-parallel for tiny tables whose replication costs less in total than any sharded option;
2. memory tiers, globally: tables sorted by heat (ids looked up per stored byte) fill the compute
   tier, the rest spill to DDR then SSD with a cache of a fraction ``c`` of their rows in the
   compute tier; ``c`` is picked among a few candidates by estimated lookup time; each tier is
   filled to at most ``TIER_FILLS[0]`` of its usable bytes in aggregate;
3. sharding type per table: the option with the least total cost whose largest shard costs at most
   ``split_fraction`` x the mean rank cost (splitting dominant tables), preferring shards within
   ``pack_fraction`` of one rank's tier;
4. placement, largest group first (by cost against the mean and by memory share of a rank): each
   group goes to the ranks with the lowest max(cost share, memory share) that have room in every
   tier; host-bound groups (table_row_wise, table_column_wise) pick the best host. A group that fits
   nowhere loses its cache, then moves one tier down;
5. local search on the most loaded rank: best single move, else best swap with a shard on a light
   rank, else re-partition it with a light rank by 2-way largest differencing (Karmarkar-Karp);
   stops when the maximum cannot drop;
6. steps 3-5 run from several starts (each ``split_fraction`` against the mean of all load and of
   the load placement can still move, plus all tables whole); the two best are refined by splitting
   the costliest table on the ranks above the mean and re-placing while the maximum drops;
7. if no start packs, everything is retried with a lower aggregate fill (more spilled).

Baselines (``strategy``): "greedy" and "round_robin" place whole tables (row-wise only for tables
too large for one rank) by LPT or in table order, with the same cost model, tiers and capacities.

Loops run over tables, shard groups or search steps; per-rank work is vectorised with numpy.
Ties break on the lowest index, so the result depends only on the inputs.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from .cost import CW, DP, RW, TIER_INDEX, TW, TWCW, TWRW, CostModel, column_splits, row_blocks
from .enumerate import OptionGrid, TableArrays, enumerate_options
from .topology import Topology
from .types import PRECISION_BYTES, TIERS, PlannerError, PlannerOptions

CACHE_CANDIDATES = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5)
# Tiers are filled to at most this share of their usable bytes in aggregate, leaving room for the
# per-rank packing of shards of different sizes; if packing still fails, planning is retried with
# the next, lower fill (more spilled to lower tiers).
TIER_FILLS = (0.95, 0.85, 0.7)
INF = np.inf


def _gb(x: float) -> str:
    return f"{x / 1e9:,.2f} GB"


@dataclass
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


@dataclass
class OptionCosts:
    """(tables, options) arrays: largest shard cost, total cost, widest shard's bytes in its tier
    and in the compute tier, and all shards' I/O bytes."""

    max: np.ndarray
    total: np.ndarray
    wide_storage: np.ndarray
    wide_ct: np.ndarray
    total_io: np.ndarray


@dataclass
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
    free: np.ndarray | None = None  # (3, W) usable bytes left per tier and rank
    occ: np.ndarray | None = None  # (tables, W) shards of each table on each rank

    @property
    def load(self) -> np.ndarray:
        return self.compute + self.comms


class Partitioner:
    """State of one planning run; see the module docstring for the steps."""

    def __init__(self, tables: TableArrays, topo: Topology, batch_size: int,
                 opts: PlannerOptions) -> None:
        self.t = tables
        self.topo = topo
        self.opts = opts
        self.model = CostModel(topo, batch_size, opts)
        self.grid: OptionGrid = enumerate_options(tables, topo, opts)
        self.W = topo.world_size
        self.Lw = topo.local_world_size
        self.ct = TIER_INDEX[topo.compute_tier]
        self.avail = [TIER_INDEX[t] for t in topo.tiers]
        cap = np.array([topo.capacity(t) for t in TIERS])
        self.capacity = cap
        self.budget = cap * opts.memory_fraction  # per rank
        self.host_of = np.arange(self.W) // self.Lw
        self.n = len(tables.N)
        self.dp_col = int(np.flatnonzero(self.grid.kind == DP)[0])
        self.fill = TIER_FILLS[0]
        # set by select(): I/O bytes of the chosen options, the option costs and the mask used
        self.last_io = 0.0
        self.last_costs: OptionCosts | None = None
        self.last_base: np.ndarray | None = None

    # --- option costs ----------------------------------------------------------------------------
    def option_costs(self, tier: np.ndarray, cache: np.ndarray) -> OptionCosts:
        g, t, m = self.grid, self.t, self.model
        shape = (self.n, g.m)
        mx, tot, wst, wct, tio = (np.empty(shape) for _ in range(5))
        for j in range(g.m):
            kind, k = int(g.kind[j]), int(g.k[j])
            tj = np.full(self.n, self.ct) if kind == DP else tier
            cj = np.zeros(self.n) if kind == DP else cache
            w = m.shards(kind, t.N, t.L, t.F, g.wide_rows[:, j], g.wide_cols[:, j], k, tj, cj)
            a = m.shards(kind, t.N, t.L, t.F, g.mean_rows[:, j], g.mean_cols[:, j], k, tj, cj)
            mx[:, j] = w.total
            tot[:, j] = a.total * g.n_shards[:, j]
            wst[:, j] = w.storage
            wct[:, j] = w.cache + w.io
            tio[:, j] = a.io * g.n_shards[:, j]
        return OptionCosts(mx, tot, wst, wct, tio)

    def fits(self, tier: np.ndarray, wst: np.ndarray, wct: np.ndarray, frac: float) -> np.ndarray:
        """(n, m): the widest shard fits ``frac`` of one rank's tier (and the compute tier)."""
        b = self.budget
        tb = b[tier][:, None]
        in_ct = (tier == self.ct)[:, None]
        same = wst + wct <= frac * b[self.ct]
        split = (wst <= frac * tb) & (wct <= frac * b[self.ct])
        valid = self.grid.valid & (tb > 0)
        return valid & np.where(in_ct, same, split)

    # --- 1. data parallel --------------------------------------------------------------------------
    def choose_data_parallel(self) -> np.ndarray:
        ct = np.full(self.n, self.ct)
        oc = self.option_costs(ct, np.zeros(self.n))
        tot, wst, wct = oc.total, oc.wide_storage, oc.wide_ct
        g = self.grid
        dp = self.dp_col
        others = g.valid.copy()
        others[:, dp] = False
        best_other = np.where(others, tot, INF).min(axis=1)
        per_rank = wst[:, dp] + wct[:, dp]
        only_dp = g.valid[:, dp] & ~others.any(axis=1)
        cand = (g.valid[:, dp] & (tot[:, dp] <= best_other) & (self.W > 1)
                & (per_rank <= self.opts.data_parallel_max_fraction * self.budget[self.ct])
                & ((self.t.pinned < 0) | (self.t.pinned == self.ct)))
        chosen = only_dp.copy()
        limit = 0.1 * self.budget[self.ct] - per_rank[only_dp].sum()
        order = np.lexsort((np.arange(self.n), per_rank))
        used = 0.0
        for i in order:
            if cand[i] and not chosen[i] and used + per_rank[i] <= limit:
                chosen[i] = True
                used += per_rank[i]
        return chosen

    def only_data_parallel(self) -> np.ndarray:
        """Tables whose constraints allow nothing but data-parallel."""
        g = self.grid
        return g.valid[:, self.dp_col] & ~np.delete(g.valid, self.dp_col, axis=1).any(axis=1)

    # --- 2. tiers -----------------------------------------------------------------------------------
    def assign_tiers(self, is_dp: np.ndarray,
                     io_bytes: float | None = None) -> tuple[np.ndarray, float]:
        """Tier per table and the cache fraction. ``io_bytes``: compute-tier I/O buffers of all
        sharded tables (default: as if every table were table-wise)."""
        t, m, g = self.t, self.model, self.grid
        W = self.W
        storage = m.storage_bytes(t.N, t.D)
        ct_tier = np.full(self.n, self.ct)
        tw = m.shards(TW, t.N, t.L, t.F, t.N, t.D, 1, ct_tier, 0.0)
        dp = m.shards(DP, t.N, t.L, t.F, t.N, t.D, W, ct_tier, 0.0)
        others = g.valid.copy()
        others[:, self.dp_col] = False
        wst = m.storage_bytes(g.wide_rows, g.wide_cols)
        min_shard = np.where(others, wst, INF).min(axis=1)
        vec = m.B * W * t.F
        lookup = vec * t.L * (3 * t.D * m.wb + 2 * (m.opt_row + m.opt_elem * t.D))
        heat = vec * t.L * t.D / storage
        io = tw.io[~is_dp].sum() if io_bytes is None else io_bytes
        reserved = io + W * (dp.storage + dp.io)[is_dp].sum()
        totals = self.budget * W * self.fill
        totals[self.ct] -= reserved
        sharded = np.flatnonzero(~is_dp)
        pinned = [i for i in sharded if t.pinned[i] >= 0]
        free_ = [i for i in sharded[np.lexsort((sharded, -heat[sharded]))] if t.pinned[i] < 0]
        tot_bytes = storage[sharded].sum()
        tier = np.full(self.n, self.ct, dtype=np.int64)

        for i in pinned:
            p = int(t.pinned[i])
            if self.budget[p] <= 0:
                self._raise_tier_missing(i, p, storage[i])
            if min_shard[i] > self.budget[p]:
                self._raise_too_big(i, storage[i], min_shard[i], p)

        candidates = CACHE_CANDIDATES if self.opts.cache_fraction is None else (
            0.0, self.opts.cache_fraction)
        best = None
        first_failure = None
        cache_overflow = None
        for c in candidates:
            rem = totals.copy()
            if c > 0:
                rem[self.ct] = (rem[self.ct] - c * tot_bytes) / (1 - c)
                if rem[self.ct] < 0:
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
                    for tt in self.avail:
                        if rem[tt] >= storage[i] and min_shard[i] <= self.budget[tt]:
                            tier_c[i] = tt
                            rem[tt] -= storage[i]
                            break
                    else:
                        ok = False
                        if first_failure is None:
                            first_failure = (i, max(0.0, float(sum(rem[a] for a in self.avail))))
                        break
            if not ok:
                continue
            spilled = (tier_c != self.ct) & ~is_dp
            if not spilled.any():
                return tier_c, 0.0
            spb = m.seconds_per_byte(tier_c, np.where(spilled, c, 0.0))
            est = float((lookup * spb)[~is_dp].sum())
            if c == 0 and self.opts.cache_fraction:
                continue  # the user asked for a cache fraction; 0 was only a feasibility probe
            if best is None or est < best[0]:
                best = (est, c, tier_c)
        if best is None and self.opts.cache_fraction and cache_overflow is not None:
            c = self.opts.cache_fraction
            need = c * tot_bytes
            have = totals[self.ct]
            sug = ["a smaller cache_fraction (or null to let the planner choose)", "more ranks"]
            raise PlannerError(
                f"cache_fraction={c} needs {_gb(need)} of {TIERS[self.ct]} for the caches of "
                f"{_gb(tot_bytes)} of tables but only {_gb(have)} is usable there on {W} ranks; "
                "to fit, use " + " or ".join(sug),
                table=None, bytes_needed=need, capacity=have, suggestions=sug)
        if best is None:
            i, remaining = first_failure if first_failure else (int(np.argmax(storage)), 0.0)
            self._raise_capacity(int(i), storage, is_dp, remaining)
        return best[2], best[1]

    # --- errors -------------------------------------------------------------------------------------
    def _suggestions(self, need_total: float) -> list[str]:
        topo, opts = self.topo, self.opts
        per_rank = float(sum(self.budget[a] for a in self.avail))
        s = []
        if per_rank > 0:
            ranks = int(np.ceil(need_total / per_rank))
            ranks = int(np.ceil(ranks / self.Lw) * self.Lw)
            if ranks > self.W:
                s.append(f"more ranks (>= {ranks} at {_gb(per_rank)} usable per rank)")
        missing = [t for t in TIERS if topo.capacity(t) <= 0 and TIERS.index(t) > 0]
        if missing:
            s.append(f"a lower tier ({', '.join(missing)}) on the topology")
        if opts.weight_precision == "fp32":
            half = need_total * self._fp16_ratio()
            enough = half <= per_rank * self.W * self.fill
            s.append(f"fp16 weights (weight_precision='fp16': {_gb(half)} in all, which "
                     + ("would fit)" if enough else "alone is still too much)"))
        if opts.optimizer in ("adam", "exact_adagrad"):
            s.append("an optimizer with less state (exact_rowwise_adagrad)")
        return s

    def _fp16_ratio(self) -> float:
        m = self.model
        t = self.t
        full = m.storage_bytes(t.N, t.D).sum()
        half = (t.N * (t.D * (PRECISION_BYTES["fp16"] + m.opt_elem) + m.opt_row)).sum()
        return float(half / full) if full else 1.0

    def _raise_capacity(self, i: int, storage: np.ndarray, is_dp: np.ndarray,
                        remaining: float) -> None:
        name = self.t.names[i]
        total = float(storage[~is_dp].sum())
        cap = float(sum(self.budget[a] for a in self.avail) * self.W)
        sug = self._suggestions(total)
        raise PlannerError(
            f"table {name!r} ({_gb(storage[i])}, weights + {self.opts.optimizer} state in "
            f"{self.opts.weight_precision}) does not fit: only {_gb(remaining)} left of "
            f"{_gb(cap)} usable ({'+'.join(TIERS[a] for a in self.avail)}, "
            f"memory_fraction={self.opts.memory_fraction}) on {self.W} ranks for {_gb(total)} of "
            f"tables; to fit, use " + "; or ".join(sug),
            table=name, bytes_needed=float(storage[i]), capacity=remaining, suggestions=sug)

    def _raise_tier_missing(self, i: int, p: int, nbytes: float) -> None:
        name = self.t.names[i]
        sug = [f"pin it to one of {', '.join(TIERS[a] for a in self.avail)}", "remove the pin"]
        raise PlannerError(
            f"table {name!r} ({_gb(nbytes)}) is pinned to tier {TIERS[p]!r}, which has capacity 0 "
            f"on topology {self.topo.name!r}; to fit, " + " or ".join(sug),
            table=name, bytes_needed=float(nbytes), capacity=0.0, suggestions=sug)

    def _raise_too_big(self, i: int, nbytes: float, shard: float, p: int) -> None:
        name = self.t.names[i]
        cap = float(self.budget[p])
        sug = []
        if cap > 0:
            ranks = int(np.ceil(nbytes / cap / self.Lw) * self.Lw)
            sug.append(f"more ranks (>= {ranks}) or row-wise sharding allowed")
        lower = [TIERS[a] for a in self.avail if a > p]
        if lower:
            sug.append(f"a lower tier ({', '.join(lower)})")
        if self.opts.weight_precision == "fp32":
            sug.append("fp16 weights (weight_precision='fp16')")
        raise PlannerError(
            f"table {name!r} ({_gb(nbytes)}) cannot fit tier {TIERS[p]!r}: its smallest allowed "
            f"shard needs {_gb(shard)} but one rank has {_gb(cap)} usable; to fit, use "
            + "; or ".join(sug),
            table=name, bytes_needed=float(nbytes), capacity=cap, suggestions=sug)

    # --- 3. sharding type ---------------------------------------------------------------------------
    def select(self, tier: np.ndarray, cache: np.ndarray, is_dp: np.ndarray,
               split_fraction: float, movable_only: bool = False,
               baseline: bool = False) -> np.ndarray:
        """Option per table: the least total cost whose largest shard is at most
        ``split_fraction`` x the mean rank cost (with ``movable_only``: counting only shards that
        do not span every rank, i.e. the load that placement can still balance)."""
        oc = self.option_costs(tier, cache)
        mx, tot, wst, wct = oc.max, oc.total, oc.wide_storage, oc.wide_ct
        g = self.grid
        non_dp = np.ones(g.m, dtype=bool)
        non_dp[self.dp_col] = False
        fit = self.fits(tier, wst, wct, 1.0) & non_dp
        pref = self.fits(tier, wst, wct, self.opts.pack_fraction) & non_dp
        base = np.where(pref.any(axis=1)[:, None], pref,
                        np.where(fit.any(axis=1)[:, None], fit, g.valid & non_dp))
        if self.opts.strategy != "balanced" or baseline:
            choice = self._baseline_choice(np.where(pref.any(axis=1)[:, None], pref, fit))
        else:
            choice = self._argmin_tie(np.where(base, tot, INF), np.where(base, mx, INF))
            dp_total = 0.0 if movable_only else tot[is_dp, self.dp_col].sum()
            spans = g.n_shards >= self.W
            rows = np.arange(self.n)
            for _ in range(3):
                counted = ~is_dp & ~(movable_only & spans[rows, choice])
                mean = (tot[rows, choice][counted].sum() + dp_total) / self.W
                cap = split_fraction * mean
                elig = base & (mx <= cap * (1 + 1e-12))
                has = elig.any(axis=1)
                by_total = self._argmin_tie(np.where(elig, tot, INF), np.where(elig, mx, INF))
                by_max = self._argmin_tie(np.where(base, mx, INF), np.where(base, tot, INF))
                new = np.where(has, by_total, by_max)
                if np.array_equal(new, choice):
                    break
                choice = new
        choice = np.where(is_dp, self.dp_col, choice)
        self.last_io = float(oc.total_io[np.arange(self.n), choice][~is_dp].sum())
        self.last_costs, self.last_base = oc, base
        no_option = ~g.valid[np.arange(self.n), choice]
        if no_option.any():
            i = int(np.flatnonzero(no_option)[0])
            raise PlannerError(
                f"table {self.t.names[i]!r}: no sharding type among "
                f"{self._allowed_names(i)} applies (column-wise needs embedding_dim a multiple of "
                f"column_granularity={self.opts.column_granularity}); allow another sharding type",
                table=self.t.names[i], suggestions=("allow another sharding type",))
        return choice

    def _allowed_names(self, i: int) -> list[str]:
        from .types import SHARDING_TYPES

        return [SHARDING_TYPES[k] for k in np.flatnonzero(self.t.allowed[i])]

    @staticmethod
    def _argmin_tie(primary: np.ndarray, secondary: np.ndarray) -> np.ndarray:
        best = primary.min(axis=1, keepdims=True)
        near = primary <= best * (1 + 1e-9)
        return np.argmin(np.where(near, secondary, INF), axis=1)

    def _baseline_choice(self, fit: np.ndarray) -> np.ndarray:
        """Table-wise where a whole table fits one rank (within ``pack_fraction`` of its tier if
        possible), else row-wise, else the first option that fits."""
        g = self.grid
        tw = int(np.flatnonzero(g.kind == TW)[0])
        rw = int(np.flatnonzero(g.kind == RW)[0])
        first_fit = np.argmax(fit, axis=1)
        first_valid = np.argmax(g.valid & (g.kind != DP)[None, :], axis=1)
        return np.where(fit[:, tw], tw, np.where(fit[:, rw], rw,
                                                 np.where(fit.any(axis=1), first_fit, first_valid)))

    # --- shards ---------------------------------------------------------------------------------------
    def build_layout(self, choice: np.ndarray, tier: np.ndarray, cache: np.ndarray) -> Layout:
        t, g, opts = self.t, self.grid, self.opts
        cols = {k: [] for k in ("table", "kind", "ro", "rl", "co", "cl", "k")}
        groups = []
        start = 0
        for i in range(self.n):
            j = int(choice[i])
            kind = int(g.kind[j])
            if kind == DP:
                continue
            k = int(g.k[j])
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
                cols["table"].append(i)
                cols["kind"].append(kind)
                cols["ro"].append(ro)
                cols["rl"].append(rl)
                cols["co"].append(co)
                cols["cl"].append(cl)
                cols["k"].append(k)
            groups.append((i, start, start + len(geo)))
            start += len(geo)
        arr = {k: np.array(v, dtype=np.int64) for k, v in cols.items()}
        S = start
        lay = Layout(
            table=arr["table"], kind=arr["kind"], row_off=arr["ro"], row_len=arr["rl"],
            col_off=arr["co"], col_len=arr["cl"], k=arr["k"],
            tier=tier[arr["table"]] if S else np.zeros(0, dtype=np.int64),
            cache=cache[arr["table"]] if S else np.zeros(0),
            compute=np.zeros(S), comms=np.zeros(S), need=np.zeros((S, 3)),
            storage=np.zeros(S), extra=np.zeros(S),
            host_bound=np.isin(arr["kind"], (TWRW, TWCW)), rank=np.full(S, -1, dtype=np.int64),
            groups=groups,
        )
        for kind in np.unique(lay.kind):
            self._cost_shards(lay, np.flatnonzero(lay.kind == kind))
        return lay

    def _cost_shards(self, lay: Layout, idx: np.ndarray) -> None:
        if idx.size == 0:
            return
        t = self.t
        kind = int(lay.kind[idx[0]])
        tab = lay.table[idx]
        sc = self.model.shards(kind, t.N[tab], t.L[tab], t.F[tab], lay.row_len[idx],
                               lay.col_len[idx], lay.k[idx], lay.tier[idx], lay.cache[idx])
        lay.compute[idx] = sc.compute
        lay.comms[idx] = sc.comms
        need = np.zeros((idx.size, 3))
        need[np.arange(idx.size), lay.tier[idx]] += sc.storage
        need[:, self.ct] += sc.cache + sc.io
        lay.need[idx] = need
        lay.storage[idx] = sc.storage
        lay.extra[idx] = sc.cache + sc.io

    # --- 4. placement ------------------------------------------------------------------------------------
    def place(self, lay: Layout, is_dp: np.ndarray, cache_fraction: float) -> Solution:
        W = self.W
        t = self.t
        compute = np.zeros(W)
        comms = np.zeros(W)
        free = np.repeat(self.budget[:, None], W, axis=1)
        dp_idx = np.flatnonzero(is_dp)
        ct = np.full(dp_idx.size, self.ct)
        dpc = self.model.shards(DP, t.N[dp_idx], t.L[dp_idx], t.F[dp_idx], t.N[dp_idx],
                                t.D[dp_idx], W, ct, 0.0)
        dp_need = np.zeros((dp_idx.size, 3))
        dp_need[:, self.ct] = dpc.storage + dpc.io
        compute += dpc.compute.sum()
        comms += dpc.comms.sum()
        free -= dp_need.sum(axis=0)[:, None]
        if (free < -1e-6).any():
            i = int(dp_idx[np.argmax(dp_need[:, self.ct])])
            raise PlannerError(
                f"data-parallel tables need {_gb(dp_need.sum())} per rank, more than the "
                f"{_gb(self.budget[self.ct])} usable in {TIERS[self.ct]}; largest is "
                f"{t.names[i]!r}; to fit, allow table_wise/row_wise for it",
                table=t.names[i], bytes_needed=float(dp_need.sum()),
                capacity=float(self.budget[self.ct]), suggestions=("allow table_wise/row_wise",))
        load = compute + comms
        occ = np.zeros((self.n, W), dtype=np.int32)
        cost = lay.cost
        ng = len(lay.groups)
        starts = np.array([s for _, s, _ in lay.groups], dtype=np.int64)
        # groups spanning every rank have only one placement (up to order): place them first
        full = np.array([e - s >= W for _, s, e in lay.groups], dtype=bool)
        if self.opts.strategy == "round_robin":
            order = list(np.lexsort((np.arange(ng), ~full)))
        elif ng:
            # Largest first, measuring a group by its costliest shard against the mean rank load
            # and by its largest memory share of one rank's tier (vector bin-packing order).
            gcost = np.maximum.reduceat(cost, starts)
            mean = (cost.sum() + load.sum()) / W
            with np.errstate(divide="ignore", invalid="ignore"):
                share = np.where(self.budget > 0, lay.need / self.budget, 0.0).max(axis=1)
            gmem = np.maximum.reduceat(share, starts)
            key = np.maximum(gcost / max(mean, 1e-30), gmem)
            if self.opts.strategy == "greedy":
                key = gcost
            order = list(np.lexsort((np.arange(ng), -key, ~full)))
        else:
            order = []
        mean = max((cost.sum() + load.sum()) / W, 1e-30)
        has = self.budget > 0
        strategy = self.opts.strategy
        pointer = 0
        for gi in order:
            tab, s, e = lay.groups[gi]
            while True:
                cmax = lay.cost[s:e].max()
                need = lay.need[s:e].max(axis=0)
                if strategy == "round_robin":
                    prio = ((np.arange(W) - pointer) % W).astype(float)
                elif strategy == "greedy":
                    prio = load + cmax
                else:
                    # vector scheduling: the larger of the rank's cost and memory shares after
                    # adding the shard, so memory-heavy shards go where memory is free
                    used = (self.budget[has, None] - free[has] + need[has, None])
                    mem = (used / self.budget[has, None]).max(axis=0) if has.any() else 0.0
                    prio = np.maximum((load + cmax) / mean, mem)
                ranks = self._place_group(lay, s, e, prio, free, need)
                if ranks is not None:
                    break
                self._demote(lay, s, e, free, cache_fraction)
            lay.rank[s:e] = ranks
            c = lay.cost[s:e]
            np.add.at(load, ranks, c)
            np.add.at(free.T, ranks, -lay.need[s:e])
            occ[tab, ranks] += 1
            pointer = (int(ranks[0]) + 1) % W
        sol = self._finish(lay, dp_idx, dpc.compute, dpc.comms, dp_need, dpc.storage,
                           cache_fraction)
        sol.free, sol.occ = free, occ
        return sol

    def _place_group(self, lay, s, e, prio, free, need):
        """Ranks for shards s..e (largest shard on the best rank), or None if they do not fit."""
        W = self.W
        k = e - s
        cost = lay.cost[s:e]
        ok = np.all(free >= need[:, None] - 1e-6, axis=0)
        desc = np.lexsort((np.arange(k), -cost))
        ranks = np.empty(k, dtype=np.int64)
        if not lay.host_bound[s]:
            cand = np.flatnonzero(ok)
            if cand.size < k:
                return None
            ranks[desc] = cand[np.lexsort((cand, prio[cand]))[:k]]
            return ranks
        Lw = self.Lw
        H = W // Lw
        okh = ok.reshape(H, Lw)
        enough = okh.sum(axis=1) >= k
        if k > Lw or not enough.any():
            return None
        p = np.where(okh, prio.reshape(H, Lw), INF)
        order = np.argsort(p, axis=1, kind="stable")[:, :k]
        chosen = np.take_along_axis(p, order, axis=1)
        score = chosen[:, 0] if self.opts.strategy == "round_robin" else chosen.max(axis=1)
        h = int(np.argmin(np.where(enough, score, INF)))
        ranks[desc] = h * Lw + order[h]
        return ranks

    def _demote(self, lay: Layout, s: int, e: int, free: np.ndarray, cache_fraction: float) -> None:
        """Make shards s..e easier to place: drop their cache, else move them one tier down."""
        cur = int(lay.tier[s])
        if cur != self.ct and lay.cache[s] > 0:
            lay.cache[s:e] = 0.0
        else:
            lower = [a for a in self.avail if a > cur]
            if not lower:
                self._raise_unplaceable(lay, s, e, free)
            lay.tier[s:e] = lower[0]
            lay.cache[s:e] = cache_fraction
        self._cost_shards(lay, np.arange(s, e))

    def _raise_unplaceable(self, lay: Layout, s: int, e: int, free: np.ndarray) -> None:
        tab = int(lay.table[s])
        name = self.t.names[tab]
        need = lay.need[s:e].max(axis=0)
        k = e - s
        # the tier that blocks: where fewer than k ranks have room
        short = [a for a in range(3) if need[a] > 0 and (free[a] >= need[a] - 1e-6).sum() < k]
        a = short[0] if short else int(lay.tier[s])
        what = "cache + I/O buffers" if a == self.ct and a != int(lay.tier[s]) else "shard"
        room = float(np.sort(free[a])[::-1][min(k, self.W) - 1])
        sug = [f"more ranks (> {self.W})"]
        if self.opts.weight_precision == "fp32":
            sug.append("fp16 weights (weight_precision='fp16')")
        missing = [t for t in TIERS[1:] if self.topo.capacity(t) <= 0]
        if missing:
            sug.append(f"a lower tier ({', '.join(missing)})")
        if self.opts.cache_fraction:
            sug.append("a smaller cache_fraction")
        raise PlannerError(
            f"table {name!r}: its {k} shard(s) need {_gb(need[a])} each ({what}) in tier "
            f"{TIERS[a]!r} but only {min(k, self.W)} rank(s) with {_gb(room)} free remain after "
            f"placing larger shards (capacity {_gb(self.capacity[a])} per rank, memory_fraction="
            f"{self.opts.memory_fraction}); to fit, use " + "; or ".join(sug),
            table=name, bytes_needed=float(need[a]), capacity=room, suggestions=sug)

    def _finish(self, lay, dp_idx, dp_compute, dp_comms, dp_need, dp_storage,
                cache_fraction) -> Solution:
        W = self.W
        compute = np.bincount(lay.rank, weights=lay.compute, minlength=W) + dp_compute.sum()
        comms = np.bincount(lay.rank, weights=lay.comms, minlength=W) + dp_comms.sum()
        memory = np.zeros((3, W))
        for tt in range(3):
            memory[tt] = np.bincount(lay.rank, weights=lay.need[:, tt], minlength=W)
        memory += dp_need.sum(axis=0)[:, None]
        kinds = np.full(self.n, DP, dtype=np.int64)
        for tab, s, _ in lay.groups:
            kinds[tab] = lay.kind[s]
        return Solution(layout=lay, dp_tables=dp_idx, dp_compute=dp_compute, dp_comms=dp_comms,
                        dp_need=dp_need, dp_storage=dp_storage, dp_tier=self.ct, kinds=kinds,
                        cache_fraction=cache_fraction, compute=compute, comms=comms, memory=memory)

    # --- 5. local search ---------------------------------------------------------------------------
    def improve(self, sol: Solution) -> Solution:
        lay = sol.layout
        W = self.W
        if W < 2 or lay.rank.size == 0:
            return sol
        load = sol.load.copy()
        free, occ = sol.free, sol.occ
        cost = lay.cost
        sizes = np.zeros(lay.rank.size, dtype=np.int64)
        for _, s, e in lay.groups:
            sizes[s:e] = e - s
        movable = sizes < W
        iters = self.opts.max_improve_iters or (8 * W + 200)
        host_of = self.host_of
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
                self._move(lay, int(on_r[si]), q, load, free, occ)
                continue
            # swap with a shard on one of the lightest ranks
            light = np.argsort(load, kind="stable")[: min(8, W - 1)]
            light = light[light != r]
            on_l = idx_all[np.isin(lay.rank, light) & movable]
            if on_l.size:
                on_l = on_l[np.lexsort((on_l, -cost[on_l]))][:256]
                if self._best_swap(lay, on_r, on_l, r, load, free, occ, tol):
                    continue
            if self._kk_pair(lay, r, light[:4], load, free, occ, movable, tol):
                continue
            break
        out = self._finish(lay, sol.dp_tables, sol.dp_compute, sol.dp_comms, sol.dp_need,
                           sol.dp_storage, sol.cache_fraction)
        out.free, out.occ = free, occ
        return out

    def _move(self, lay, s, q, load, free, occ):
        r = int(lay.rank[s])
        c = lay.compute[s] + lay.comms[s]
        load[r] -= c
        load[q] += c
        free[:, r] += lay.need[s]
        free[:, q] -= lay.need[s]
        occ[lay.table[s], r] -= 1
        occ[lay.table[s], q] += 1
        lay.rank[s] = q

    def _best_swap(self, lay, on_r, on_l, r, load, free, occ, tol) -> bool:
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
        same_host = self.host_of[q] == self.host_of[r]
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
        self._move(lay, s, qq, load, free, occ)
        self._move(lay, t, r, load, free, occ)
        return True

    def _kk_pair(self, lay, r, partners, load, free, occ, movable, tol) -> bool:
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
            if self.host_of[q] != self.host_of[r]:
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
                self._move(lay, int(s), int(dest[np.flatnonzero(items == s)[0]]), load, free, occ)
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


def solve(tables: TableArrays, topo: Topology, batch_size: int, opts: PlannerOptions) -> Solution:
    p = Partitioner(tables, topo, batch_size, opts)
    if opts.strategy == "balanced":
        is_dp = p.choose_data_parallel()
    else:
        is_dp = p.only_data_parallel()
    first_error: PlannerError | None = None
    for fill in TIER_FILLS:
        p.fill = fill
        try:
            tier, c = _tiers(p, is_dp)
        except PlannerError:
            if first_error is not None:
                raise first_error from None
            raise
        try:
            return _partition(p, is_dp, tier, c)
        except PlannerError as exc:
            first_error = first_error or exc
    assert first_error is not None
    raise first_error


def _tiers(p: Partitioner, is_dp: np.ndarray) -> tuple[np.ndarray, float]:
    tier, c = p.assign_tiers(is_dp)
    # Re-tier once with the I/O buffers of the options actually chosen (row-wise shards keep
    # partial sums of the global batch, far more than a table-wise estimate).
    io = 0.0
    for f in _fractions(p.opts):
        p.select(tier, np.where(tier != p.ct, c, 0.0), is_dp, f)
        io = max(io, p.last_io)
    return p.assign_tiers(is_dp, io)


def _fractions(opts: PlannerOptions) -> tuple[float, ...]:
    return opts.split_fractions if opts.strategy == "balanced" else (1.0,)


def _partition(p: Partitioner, is_dp: np.ndarray, tier: np.ndarray, c: float) -> Solution:
    cache = np.where(tier != p.ct, c, 0.0)
    results: list[tuple[Solution, np.ndarray]] = []
    tried: list[np.ndarray] = []
    error: PlannerError | None = None
    trials: list[tuple[float, bool | None]] = [(f, False) for f in _fractions(p.opts)]
    if p.opts.strategy == "balanced" and p.W > 1:
        # also: split against the load placement can still move, and whole tables (the
        # table-wise start, so the search never ends above the greedy baseline)
        trials += [(f, True) for f in _fractions(p.opts)] + [(1.0, None)]
    only_dp = p.only_data_parallel()
    for f, movable in trials:
        dp = is_dp
        if movable is None:
            dp = only_dp
            choice = p.select(tier, cache, dp, f, baseline=True)
        else:
            choice = p.select(tier, cache, is_dp, f, movable)
        if any(np.array_equal(choice, ch) for ch in tried):
            continue
        tried.append(choice)
        try:
            results.append((_place(p, choice, dp, tier, cache, c), choice))
        except PlannerError as exc:  # this start does not pack; others may
            error = error or exc
    if not results:
        assert error is not None
        raise error
    # best first (lowest maximum; among equal maxima the evener plan; then the earlier start)
    order = list(range(len(results)))
    for i in range(1, len(order)):  # insertion sort with the tolerant comparison
        j = i
        while j > 0 and _better(results[order[j]][0], results[order[j - 1]][0]):
            order[j - 1], order[j] = order[j], order[j - 1]
            j -= 1
    best = results[order[0]][0]
    if p.opts.strategy == "balanced":
        # refine the two best starting points; keep the overall best
        for i in order[:2]:
            sol, choice = results[i]
            dp = choice == p.dp_col
            sol = _split_dominant(p, dp, tier, cache, c, sol, choice)
            if _better(sol, best):
                best = sol
    return best


def _better(a: Solution, b: Solution, rel: float = 1e-9) -> bool:
    """``a`` has a lower maximum rank cost than ``b``, or the same maximum and less spread."""
    ma, mb = a.load.max(), b.load.max()
    if ma < mb * (1 - rel):
        return True
    if ma > mb * (1 + rel):
        return False
    return ma / max(a.load.mean(), 1e-300) < mb / max(b.load.mean(), 1e-300) * (1 - rel)


def _place(p: Partitioner, choice, is_dp, tier, cache, c) -> Solution:
    lay = p.build_layout(choice, tier.copy(), cache.copy())
    sol = p.place(lay, is_dp, c)
    return p.improve(sol) if p.opts.strategy == "balanced" else sol


def _split_dominant(p: Partitioner, is_dp, tier, cache, c, best: Solution, choice,
                    rounds: int = 12, tol: float = 0.002) -> Solution:
    """While ranks stay above the mean, split the costliest splittable table on some of them,
    re-place, and keep the result if the slowest rank got faster (or, as fast, the spread got
    smaller). Per round four variants are
    tried: on every rank above the mean, the cheapest option with a smaller largest shard
    ("cheapest") or pieces no larger than the rank's excess over the mean ("excess", else the
    table's finest option); "excess" on the ranks in the upper half of the excess only ("top");
    "cheapest" on the slowest rank only ("single")."""
    oc, base = p.last_costs, p.last_base
    for _ in range(rounds):
        load = best.load
        mean = load.mean()
        if load.max() <= mean * (1 + tol):
            break
        round_best = None
        for variant in ("cheapest", "excess", "top", "single"):
            new = _split_choice(p, best, choice, oc, base, mean, tol, variant)
            if new is None:
                continue
            try:
                sol = _place(p, new, is_dp, tier, cache, c)
            except PlannerError:
                continue
            if round_best is None or _better(sol, round_best[0]):
                round_best = (sol, new)
        if round_best is None or not _better(round_best[0], best):
            break
        best, choice = round_best
    return best


def _split_choice(p, sol: Solution, choice, oc, base, mean, tol, variant):
    lay = sol.layout
    load = sol.load
    new = choice.copy()
    done: set[int] = set()
    # ranks to relieve: all above the mean, the upper half of the excess ("top"), or the slowest
    floor = mean * (1 + tol)
    if variant == "top":
        floor = max(floor, (load.max() + mean) / 2)
    for r in np.lexsort((np.arange(p.W), -load)):
        if load[r] <= floor or (variant == "single" and done):
            break
        on_r = np.flatnonzero(lay.rank == r)
        for s in on_r[np.lexsort((on_r, -lay.cost[on_r]))]:
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
