"""The fast tier of the tiered embedding store: ``TieredEmbeddingBags``, an ``EmbeddingCollection``
whose tables live, whole, on a slow tier (``store.SlowTierStore``, DDR or SSD), with a cache of
``cache_fraction`` x rows per table:

- **slots**: an fbgemm table-batched embedding (``FusedEmbeddingBags``) of ``cache_rows`` slots
  per table. Per batch the ids are mapped to slots (a dense id -> slot index); the misses of each
  table are read from the slow tier in one batched read into free or evicted slots, evicted dirty
  rows having been written back first; then fbgemm's own fused forward and backward+update run on
  the slots. The update math is fbgemm's, and fbgemm's CPU kernels do not depend on which slot a
  row sits in (each row's update only sees its own occurrences, in batch order), so the trained
  tables are bitwise those of the all-in-memory module (tests/unit/test_tiered.py).
- **eviction**: LRU (exact: a queue of slots by last use, rebuilt lazily, skipping rows used
  since) or LFU (lookup counts per id, kept for every row; ties by last use; counts are snapshot
  when the queue is rebuilt and rows used since then are kept). Rows of the batch in flight are
  never evicted.
- **prefetch**: ``prefetch(next_sparse)`` names the next batch; the following ``forward`` (after
  its own rows are in place) loads the next batch's misses on a background thread while the
  current batch computes, without evicting the current batch's rows.
- **checkpoints**: ``flush()`` writes every dirty row back (and syncs the file);
  ``split_weights()`` / ``split_optimizer_states()`` (and so ``shards()``) flush, empty the
  cache and return views of the whole slow-tier table (memmap-backed for SSD), so a checkpoint
  reads them and a restore copies into them (then ``flush()`` makes an SSD restore durable), as
  with the in-memory module.

Which tables go here, and groups of tables on different tiers: ``recscale.embedding.placement``.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from recscale.config import ConfigError
from recscale.data.batch import SparseFeatures
from recscale.embedding.api import LocalCollection
from recscale.embedding.store import SlowTierStore
from recscale.embedding.tbe import EmbeddingOptimizerConfig, FusedEmbeddingBags, InitSlice
from recscale.embedding.tier_config import TierConfig

# floats of fused-optimizer state per row, stored after the row's weights
_STATE_WIDTH = {"exact_sgd": lambda d: 0, "exact_rowwise_adagrad": lambda d: 1,
                "exact_adagrad": lambda d: d}


class CacheTooSmallError(ValueError):
    """A batch needs more distinct rows of a table than its cache holds."""


def _same_ids(a: SparseFeatures, b: SparseFeatures) -> bool:
    if a.values is b.values and a.lengths is b.lengths:
        return True
    return (a.values.shape == b.values.shape and a.lengths.shape == b.lengths.shape
            and torch.equal(a.lengths, b.lengths) and torch.equal(a.values, b.values))


def _cleanup(store: SlowTierStore, directory: str | None, pool_box: list) -> None:
    for pool in pool_box:
        pool.shutdown(wait=True)
    store.close()
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


# --------------------------------------------------------------------------------------------
class TieredEmbeddingBags(LocalCollection):
    """Sum-pooled embedding bags whose tables live on a slow tier behind a fast-tier cache.

    Same inputs and outputs as ``FusedEmbeddingBags`` plus ``config`` (``TierConfig``),
    ``cache_fractions`` (per table; default ``config.cache_fraction`` or 0.2),
    ``init_slices`` (initial weights as slices of ``table_init``, generated block by block so a
    table larger than memory never is in memory), ``store_dir`` (where the SSD files go; default a
    fresh directory under ``config.scratch_dir``, removed on ``close()``) and ``resume`` (open the
    store already in ``store_dir``, replaying its journal, instead of initialising one).
    """

    def __init__(
        self,
        rows: Sequence[int],
        dims: Sequence[int],
        optimizer: EmbeddingOptimizerConfig,
        device: torch.device | str = "cpu",
        seed: int = 0,
        table_ids: Sequence[int] | None = None,
        initial_weights: Sequence[torch.Tensor] | None = None,
        config: TierConfig | None = None,
        cache_fractions: Sequence[float] | None = None,
        init_slices: Sequence[InitSlice] | None = None,
        store_dir: str | None = None,
        resume: bool = False,
        store_prefix: str = "tiered-",
    ):
        super().__init__()
        config = config or TierConfig()
        config.validate("tiers")
        if len(rows) != len(dims) or not rows:
            raise ValueError(f"rows ({len(rows)}) and dims ({len(dims)}) must be equal, non-empty lists")
        self.config = config
        self.rows = tuple(int(r) for r in rows)
        self.dims = tuple(int(d) for d in dims)
        self.optimizer_config = optimizer
        T = len(self.rows)
        self.num_tables = T
        if cache_fractions is None:
            c = 0.2 if config.cache_fraction is None else config.cache_fraction
            cache_fractions = [c] * T
        if len(cache_fractions) != T:
            raise ValueError(f"cache_fractions has {len(cache_fractions)} entries for {T} tables")
        for t, c in enumerate(cache_fractions):
            if not 0 <= c <= 1:
                raise ConfigError(f"cache_fractions[{t}]={c!r} is not allowed: expected a "
                                  "number in [0, 1]")
        self.cache_rows = tuple(
            min(r, max(math.ceil(c * r), config.min_cache_rows))
            for r, c in zip(self.rows, cache_fractions))
        self.state_widths = tuple(_STATE_WIDTH[optimizer.name](d) for d in self.dims)
        self.widths = tuple(d + s for d, s in zip(self.dims, self.state_widths))
        self.tier = config.tier

        # fast tier: fbgemm's fused module over the cache slots (contents loaded on demand)
        self.cache = FusedEmbeddingBags(
            self.cache_rows, self.dims, optimizer, device=device,
            initial_weights=[torch.zeros(1, 1).expand(c, d)
                             for c, d in zip(self.cache_rows, self.dims)])
        self.device = torch.device(device)
        # views without autograd's version counter: the background prefetch writes other slots
        # of these tensors while the current batch's graph (which saved them) is alive
        self._cw = [w.data for w in self.cache.split_weights()]
        states = self.cache.split_optimizer_states()
        self._cs = [[s.data for s in st] for st in states] if states else [[] for _ in range(T)]

        # slow tier
        owned = None
        if self.tier == "ssd" and store_dir is None:
            if resume:
                raise ValueError("resume=True needs the store_dir to open")
            base = config.scratch_dir or tempfile.gettempdir()
            os.makedirs(base, exist_ok=True)
            store_dir = owned = tempfile.mkdtemp(prefix=store_prefix, dir=base)
        self.store = SlowTierStore(self.tier, self.rows, self.widths, store_dir, config.fsync,
                                   create=not resume)
        if not resume:
            self._initialise(seed, table_ids, initial_weights, init_slices)

        # bookkeeping (CPU): dense id -> slot map over all tables' ids, per-slot state
        self._key_off = torch.tensor([0, *np.cumsum(self.rows)], dtype=torch.int64)
        self._slot_off = torch.tensor([0, *np.cumsum(self.cache_rows)], dtype=torch.int64)
        self._rows_t = torch.tensor(self.rows, dtype=torch.int64)
        S = int(self._slot_off[-1])
        self.slot_of = torch.full((int(self._key_off[-1]),), -1, dtype=torch.int32)
        self.key_of_slot = torch.full((S,), -1, dtype=torch.int64)
        self.stamp = torch.full((S,), -1, dtype=torch.int64)
        self.dirty = torch.zeros(S, dtype=torch.bool)
        self.freq = (torch.zeros(int(self._key_off[-1]), dtype=torch.int32)
                     if config.policy == "lfu" else None)
        self._filled = [0] * T
        self._queue: list = [None] * T
        self._qstamp: list = [None] * T
        self._qpos = [0] * T
        self.clock = 0
        self._next: SparseFeatures | None = None
        self._prefetched: tuple[SparseFeatures, int] | None = None
        self._future: Future | None = None
        self._pool_box: list[ThreadPoolExecutor] = []
        self._stats = dict.fromkeys(
            ("lookups", "hits", "rows_read", "rows_written", "evictions", "sync_miss_rows",
             "prefetch_rows", "prefetch_skipped", "prefetch_seconds", "prefetch_wait_seconds",
             "load_seconds"), 0)
        self._finalizer = weakref.finalize(self, _cleanup, self.store, owned, self._pool_box)

    # --- construction helpers ------------------------------------------------------------------
    def _initialise(self, seed, table_ids, initial_weights, init_slices) -> None:
        table_ids = list(range(self.num_tables)) if table_ids is None else list(table_ids)
        for t in range(self.num_tables):
            tab, d = self.store.tables[t], self.dims[t]
            if initial_weights is not None:
                tab[:, :d] = initial_weights[t]
                continue
            sl = (init_slices[t] if init_slices is not None
                  else InitSlice(table_ids[t], self.rows[t], d))
            for r0, block in sl.blocks(seed, self.rows[t], d):
                tab[r0: r0 + block.shape[0], :d] = block
        self.store.sync()

    # --- the cache -----------------------------------------------------------------------------
    def _victims(self, t: int, need: int, protect_from: int, clock: int) -> torch.Tensor | None:
        """``need`` slots of table t to (re)fill: free ones first, then the policy's victims among
        slots last used before ``protect_from``. None if there are not enough."""
        base, C = int(self._slot_off[t]), self.cache_rows[t]
        nf = self._filled[t]
        take = min(need, C - nf)
        parts = []
        if take:
            parts.append(torch.arange(base + nf, base + nf + take))
        rest = need - take
        if rest:
            got = self._scan(t, rest, protect_from, clock)
            if got is None:
                return None
            parts.append(got)
        self._filled[t] = nf + take
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        self.stamp[out] = clock
        return out

    def _scan(self, t: int, need: int, protect_from: int, clock: int) -> torch.Tensor | None:
        out, old, rebuilt = [], [], False
        while need:
            q = self._queue[t]
            if q is None or self._qpos[t] >= q.numel():
                if rebuilt:
                    break
                self._rebuild(t, protect_from)
                rebuilt = True
                continue
            pos = self._qpos[t]
            chunk = q[pos: pos + max(4 * need, 1024)]
            st = self.stamp[chunk]
            ok = (st == self._qstamp[t][pos: pos + chunk.numel()]) & (st < protect_from)
            idx = ok.nonzero().squeeze(1)
            if idx.numel() >= need:
                idx = idx[:need]
                self._qpos[t] = pos + int(idx[-1]) + 1
            else:
                self._qpos[t] = pos + chunk.numel()
            got = chunk[idx]
            old.append(st[idx])
            self.stamp[got] = clock  # taken: out of any queue rebuilt below
            out.append(got)
            need -= got.numel()
        if need:  # not enough: nothing is taken (the slots keep their rows and last use)
            for got, st in zip(out, old):
                self.stamp[got] = st
            self._queue[t] = None
            return None
        return torch.cat(out) if len(out) > 1 else out[0]

    def _rebuild(self, t: int, protect_from: int) -> None:
        """Queue of table t's evictable slots, least valuable first, with their last-use stamps."""
        a, b = int(self._slot_off[t]), int(self._slot_off[t + 1])
        st = self.stamp[a:b]
        keys = self.key_of_slot[a:b]
        cand = ((st < protect_from) & (keys >= 0)).nonzero().squeeze(1)
        st = st[cand]
        if self.freq is not None:
            prio = self.freq[keys[cand]].to(torch.int64) * (1 << 32) + st
        else:
            prio = st
        order = torch.argsort(prio, stable=True)
        self._queue[t] = cand[order] + a
        self._qstamp[t] = st[order]
        self._qpos[t] = 0

    def _gather(self, t: int, slots: torch.Tensor) -> torch.Tensor:
        """Records [n, width] of cache slots (table-local) of table t."""
        n = slots.numel()
        s = slots.to(self.device)
        parts = [self._cw[t].index_select(0, s)]
        parts += [x.index_select(0, s).reshape(n, -1) for x in self._cs[t]]
        return torch.cat(parts, 1).cpu() if len(parts) > 1 else parts[0].cpu()

    def _scatter(self, t: int, slots: torch.Tensor, recs: torch.Tensor) -> None:
        d = self.dims[t]
        s = slots.to(self.device)
        recs = recs.to(self.device)
        self._cw[t].index_copy_(0, s, recs[:, :d])
        off = d
        for x in self._cs[t]:
            w = x[0].numel() if x.dim() > 1 else 1
            x.index_copy_(0, s, recs[:, off: off + w].reshape((-1,) + tuple(x.shape[1:])))
            off += w

    def _swap_in(self, victims: list[torch.Tensor], loads: list[tuple[int, torch.Tensor]]) -> None:
        """Write back the dirty rows the victims hold (one transaction), then read the missing
        rows (one batched read per table) into the victims' slots."""
        ev = torch.cat(victims)
        ek = self.key_of_slot[ev]
        had = ek >= 0
        wb = had & self.dirty[ev]
        if bool(wb.any()):
            wb_slots, wb_keys = ev[wb], ek[wb]
            tables = torch.searchsorted(self._slot_off, wb_slots, right=True) - 1
            counts = torch.bincount(tables, minlength=self.num_tables).tolist()
            entries, i = [], 0
            for t, n in enumerate(counts):
                if n:
                    s, k = wb_slots[i: i + n], wb_keys[i: i + n]
                    entries.append((t, k - self._key_off[t],
                                    self._gather(t, s - self._slot_off[t])))
                    i += n
            self.store.write(entries)
            self._stats["rows_written"] += int(wb.sum())
        self._stats["evictions"] += int(had.sum())
        self.slot_of[ek[had]] = -1
        self.dirty[ev] = False
        for (t, keys), v in zip(loads, victims):
            recs = self.store.read(t, keys - self._key_off[t])
            self._scatter(t, v - self._slot_off[t], recs)
            self.slot_of[keys] = v.to(torch.int32)
            self.key_of_slot[v] = keys
            self._stats["rows_read"] += keys.numel()

    def _admit(self, sparse: SparseFeatures, *, protect_from: int, clock: int, strict: bool,
               count: bool, mark_dirty: bool) -> torch.Tensor:
        """Bring the batch's rows into the cache. -> slot (table-local) of every id, -1 where a
        non-strict admission (prefetch) left a row out."""
        values = sparse.values.to("cpu", torch.int64)
        lengths = sparse.lengths.to("cpu")
        T = self.num_tables
        if lengths.shape[0] != T:
            raise ValueError(f"expected {T} features, got {lengths.shape[0]}")
        per_table = lengths.reshape(T, -1).sum(1)
        tid = torch.repeat_interleave(torch.arange(T), per_table)
        if values.numel():
            bad = (values < 0) | (values >= self._rows_t[tid])
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                t = int(tid[i])
                raise IndexError(f"table {t}: id {int(values[i])} is out of range "
                                 f"[0, {self.rows[t]})")
        keys = values + self._key_off[tid]
        slots = self.slot_of[keys].to(torch.int64)
        miss = slots < 0
        hit_slots = slots[~miss]
        self.stamp[hit_slots] = clock  # the batch's rows are not eviction candidates
        n_miss = int(miss.sum())
        if count:
            self._stats["lookups"] += values.numel()
            self._stats["hits"] += values.numel() - n_miss
            if self.freq is not None:
                self.freq.index_add_(0, keys, torch.ones_like(keys, dtype=torch.int32))
        if n_miss:
            uk = torch.unique(keys[miss])
            bounds = torch.searchsorted(uk, self._key_off).tolist()
            victims, loads = [], []
            for t in range(T):
                a, b = bounds[t], bounds[t + 1]
                if a == b:
                    continue
                v = self._victims(t, b - a, protect_from, clock)
                if v is None:
                    if strict:
                        self._raise_too_small(t, keys, tid)
                    self._stats["prefetch_skipped"] += b - a
                    continue
                victims.append(v)
                loads.append((t, uk[a:b]))
            if victims:
                self._swap_in(victims, loads)
                n_loaded = sum(k.numel() for _, k in loads)
                self._stats["prefetch_rows" if not strict else "sync_miss_rows"] += n_loaded
            slots = self.slot_of[keys].to(torch.int64)
        ok = slots >= 0
        if mark_dirty:
            self.dirty[slots[ok]] = True
        return torch.where(ok, slots - self._slot_off[tid], slots)

    def _raise_too_small(self, t: int, keys: torch.Tensor, tid: torch.Tensor) -> None:
        n = int(torch.unique(keys[tid == t]).numel())
        raise CacheTooSmallError(
            f"table {t} ({self.rows[t]} rows, tier {self.tier}): the batch looks up {n} distinct "
            f"ids but the cache holds {self.cache_rows[t]} rows; raise train.tiers.cache_fraction "
            f"or train.tiers.min_cache_rows, or lower the batch size")

    # --- prefetch -------------------------------------------------------------------------------
    def _join(self) -> None:
        fut, self._future = self._future, None
        if fut is not None:
            t0 = time.perf_counter()
            fut.result()
            self._stats["prefetch_wait_seconds"] += time.perf_counter() - t0

    def prefetch(self, sparse: SparseFeatures) -> None:
        """Name the next batch: the next ``forward`` loads its rows in the background."""
        self._next = sparse

    def _prefetch_work(self, sparse: SparseFeatures, current: int) -> None:
        t0 = time.perf_counter()
        self.clock += 1
        c = self.clock
        self._admit(sparse, protect_from=current, clock=c, strict=False, count=True,
                    mark_dirty=False)
        self._prefetched = (sparse, c)
        self._stats["prefetch_seconds"] += time.perf_counter() - t0

    # --- nn.Module interface -------------------------------------------------------------------
    def forward(self, sparse: SparseFeatures) -> torch.Tensor:
        """-> pooled embeddings [B, sum(dims)], as FusedEmbeddingBags."""
        self._join()
        pre, self._prefetched = self._prefetched, None
        if pre is not None and _same_ids(pre[0], sparse):  # the batch prefetched for it
            clock, count = pre[1], False
        else:
            self.clock += 1
            clock, count = self.clock, True
        t0 = time.perf_counter()
        local = self._admit(sparse, protect_from=clock, clock=clock, strict=True, count=count,
                            mark_dirty=self.training and torch.is_grad_enabled())
        self._stats["load_seconds"] += time.perf_counter() - t0
        nxt, self._next = self._next, None
        if nxt is not None and self.config.prefetch:
            if not self._pool_box:
                self._pool_box.append(ThreadPoolExecutor(1, thread_name_prefix="tiered-prefetch"))
            self._future = self._pool_box[0].submit(self._prefetch_work, nxt, clock)
        return self.cache(SparseFeatures(sparse.keys, local.to(sparse.values.device),
                                         sparse.lengths, sparse.weights))

    # --- checkpoints ----------------------------------------------------------------------------
    def flush(self) -> None:
        """Write every dirty cached row back to the slow tier (one transaction) and sync it."""
        self._join()
        d = self.dirty.nonzero().squeeze(1)
        if d.numel():
            keys = self.key_of_slot[d]
            tables = torch.searchsorted(self._slot_off, d, right=True) - 1
            entries = []
            for t in range(self.num_tables):
                m = tables == t
                if bool(m.any()):
                    entries.append((t, keys[m] - self._key_off[t],
                                    self._gather(t, d[m] - self._slot_off[t])))
            self.store.write(entries)
            self._stats["rows_written"] += d.numel()
            self.dirty[d] = False
        self.store.sync()

    def invalidate(self) -> None:
        """Empty the cache (after a flush nothing is lost): the next lookups read the slow tier,
        so what was copied into ``split_weights()`` views is what trains on."""
        self._join()
        if bool(self.dirty.any()):
            raise RuntimeError("invalidate() with dirty rows: flush() first")
        held = self.key_of_slot >= 0
        self.slot_of[self.key_of_slot[held]] = -1
        self.key_of_slot.fill_(-1)
        self._filled = [0] * self.num_tables
        self._queue = [None] * self.num_tables
        self._prefetched = None

    def split_weights(self) -> list[torch.Tensor]:
        """Views [rows, dim] of each whole table on the slow tier (after a flush; the cache is
        emptied, so copying into a view is what the next lookup sees)."""
        self.flush()
        self.invalidate()
        return [tab[:, :d] for tab, d in zip(self.store.tables, self.dims)]

    def split_optimizer_states(self) -> list[list[torch.Tensor]]:
        """Views of each table's optimizer state, shaped as FusedEmbeddingBags returns them
        ([] for exact_sgd)."""
        self.flush()
        self.invalidate()
        if not any(self.state_widths):
            return []
        out = []
        for tab, d, s in zip(self.store.tables, self.dims, self.state_widths):
            out.append([tab[:, d] if s == 1 else tab[:, d: d + s]])
        return out

    def close(self) -> None:
        """Stop the prefetch thread, close the files (and remove them if this module made them)."""
        self._join()
        self._finalizer()

    # --- reporting ------------------------------------------------------------------------------
    def tier_stats(self) -> dict[str, float]:
        """Cumulative counters: lookups, hit rate, rows and bytes read/written on the slow tier,
        prefetch seconds (background work) and the seconds a forward waited for it."""
        s = dict(self._stats)
        s["hit_rate"] = s["hits"] / s["lookups"] if s["lookups"] else float("nan")
        s[f"bytes_read.{self.tier}"] = self.store.bytes_read
        s[f"bytes_written.{self.tier}"] = self.store.bytes_written
        s["journal_bytes"] = self.store.journal_bytes
        return s

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held per tier: ``fast`` (cache slots, their optimizer state and the bookkeeping,
        all resident) and the slow tier's tables."""
        fast = sum(w.numel() * 4 for w in self._cw) + sum(
            x.numel() * 4 for st in self._cs for x in st)
        for x in (self.slot_of, self.key_of_slot, self.stamp, self.dirty, self.freq):
            if x is not None:
                fast += x.numel() * x.element_size()
        return {"fast": fast, self.tier: self.store.nbytes()}

