"""Multi-level embedding memory: tables on a slow tier (DDR or SSD) behind a software cache.

``TieredEmbeddingBags`` is a drop-in for ``FusedEmbeddingBags`` whose tables live, whole, on a slow
tier, with a fast-tier cache of ``cache_load_factor`` x rows per table:

- **slow tier** (``SlowTierStore``): per table one ``[rows, dim + state]`` float32 array of row
  records, the weights followed by the fused optimizer's state of that row (row-wise Adagrad: 1
  float; Adagrad: ``dim``; SGD: none), so one fancy-index read fetches a row's weights and state.
  ``ddr``: a host tensor. ``ssd``: a ``numpy.memmap`` file under ``scratch_dir``; every write-back
  goes first to a journal (one record per batch, with a CRC and a commit mark), then to the file,
  then the journal is truncated; opening replays a complete journal and drops an incomplete one,
  so a process killed mid write-back never leaves a torn row.
- **fast tier**: an fbgemm table-batched embedding (``FusedEmbeddingBags``) of ``cache_rows``
  slots per table. Per batch the ids are mapped to slots (a dense id -> slot index); the misses of
  each table are read from the slow tier in one batched read into free or evicted slots, evicted
  dirty rows having been written back first; then fbgemm's own fused forward and backward+update
  run on the slots. The update math is fbgemm's, and fbgemm's CPU kernels do not depend on which
  slot a row sits in (each row's update only sees its own occurrences, in batch order), so the
  trained tables are bitwise those of the all-in-memory module (tests/unit/test_tiered.py).
- **eviction**: LRU (exact: a queue of slots by last use, rebuilt lazily, skipping rows used
  since) or LFU (lookup counts per id, kept for every row; ties by last use; counts are snapshot
  when the queue is rebuilt and rows used since then are kept). Rows of the batch in flight are
  never evicted.
- **prefetch**: ``prefetch(next_sparse)`` names the next batch; the following ``forward`` (after
  its own rows are in place) loads the next batch's misses on a background thread while the
  current batch computes, without evicting the current batch's rows.
- **checkpoints**: ``flush()`` writes every dirty row back (and syncs the file);
  ``split_weights()`` / ``split_optimizer_states()`` flush, empty the cache and return views of
  the whole slow-tier table (memmap-backed for SSD), so a checkpoint reads them and a restore
  copies into them (then ``flush()`` makes an SSD restore durable), as with the in-memory module.

On CUDA a DDR-tier table uses fbgemm's own ``EmbeddingLocation.MANAGED_CACHING`` instead
(``managed_caching_bags``); the SSD tier runs this module on either device.
``build_embedding_bags`` makes one module for tables with different placements.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import struct
import tempfile
import time
import weakref
import zlib
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from recscale.config import ConfigError, Validated, check, check_choice
from recscale.data.batch import SparseFeatures
from recscale.embedding.tbe import (
    EmbeddingOptimizerConfig,
    FusedEmbeddingBags,
    table_init,
    table_init_chunks,
)

TIER_KINDS = ("ddr", "ssd")
POLICIES = ("lru", "lfu")
# A test hook (failpoint): "journal" kills the process after half of the next SSD journal record
# is written, "apply" after half of the next write-back is applied to the table file (mid-row).
FAILPOINT_ENV = "RECSCALE_TIERED_FAILPOINT"
_STATE_WIDTH = {"exact_sgd": lambda d: 0, "exact_rowwise_adagrad": lambda d: 1,
                "exact_adagrad": lambda d: d}


@dataclass(frozen=True)
class TierConfig(Validated):
    """Settings of the tiered embedding store (the ``train.tiers`` parameters).

    - ``tier``: slow tier of a module built directly (from a plan: each shard's tier).
    - ``cache_load_factor``: cached rows / table rows; null = the plan's cache fraction per shard
      (0.2 for a module built directly).
    - ``policy``: eviction, ``lru`` or ``lfu``.
    - ``scratch_dir``: where SSD-tier table files go ("" = the system temp directory).
    - ``min_cache_rows``: the cache holds at least this many rows per table (a plan may give a
      cache fraction of 0); capped at the table's rows.
    - ``prefetch``: load the next batch's rows on a background thread while a batch computes.
    - ``fsync``: fsync every SSD write-back (survives power loss, not only a killed process);
      ``flush()`` always syncs.
    - ``ram_budget_bytes``: host memory per rank for embeddings; the planner puts what does not
      fit on the SSD tier (``Topology.with_ram_budget``). null = the topology's memory.
    """

    tier: Literal["ddr", "ssd"] = "ssd"
    cache_load_factor: float | None = None
    policy: Literal["lru", "lfu"] = "lru"
    scratch_dir: str = ""
    min_cache_rows: int = 4096
    prefetch: bool = True
    fsync: bool = False
    ram_budget_bytes: int | None = None

    def validate(self, prefix: str = "train.tiers") -> None:
        check_choice(f"{prefix}.tier", self.tier, TIER_KINDS)
        check_choice(f"{prefix}.policy", self.policy, POLICIES)
        c = self.cache_load_factor
        check(c is None or (isinstance(c, (int, float)) and 0 < c <= 1),
              f"{prefix}.cache_load_factor", c, "null or a number in (0, 1]")
        check(isinstance(self.min_cache_rows, int) and self.min_cache_rows >= 1,
              f"{prefix}.min_cache_rows", self.min_cache_rows, "an integer >= 1")
        check(isinstance(self.scratch_dir, str), f"{prefix}.scratch_dir", self.scratch_dir,
              "a directory path ('' = the system temp directory)")
        b = self.ram_budget_bytes
        check(b is None or (isinstance(b, int) and b > 0), f"{prefix}.ram_budget_bytes", b,
              "null or a positive integer (bytes)")


class CacheTooSmallError(ValueError):
    """A batch needs more distinct rows of a table than its cache holds."""


@dataclass(frozen=True)
class InitSlice:
    """Initial weights of a table (or a shard of one): rows ``row_offset ..`` and columns
    ``col_offset ..`` of ``table_init(seed, table, full_rows, full_dim)``."""

    table: int
    full_rows: int
    full_dim: int
    row_offset: int = 0
    col_offset: int = 0

    def materialize(self, seed: int, rows: int, dim: int) -> torch.Tensor:
        full = table_init(seed, self.table, self.full_rows, self.full_dim)
        return full[self.row_offset: self.row_offset + rows, self.col_offset: self.col_offset + dim]

    def blocks(self, seed: int, rows: int, dim: int, chunk_rows: int = 16384):
        """(first row of the shard, block) pieces, never the whole table in memory."""
        lo, hi = self.row_offset, self.row_offset + rows
        r = 0
        for block in table_init_chunks(seed, self.table, self.full_rows, self.full_dim, chunk_rows):
            a, b = max(lo, r), min(hi, r + block.shape[0])
            if a < b:
                yield a - lo, block[a - r: b - r, self.col_offset: self.col_offset + dim]
            r += block.shape[0]
            if r >= hi:
                break


# --------------------------------------------------------------------------------------------
class SlowTierStore:
    """Row records of every table of one module on the slow tier (see the module docstring)."""

    _HEADER = struct.Struct("<4sIQ")  # magic, entries, payload bytes
    _ENTRY = struct.Struct("<II")  # table, rows
    _TRAILER = struct.Struct("<I4s")  # crc32 of the payload, commit mark

    def __init__(self, kind: str, rows: Sequence[int], widths: Sequence[int],
                 directory: str | None = None, fsync: bool = False, create: bool = True):
        check_choice("tier", kind, TIER_KINDS)
        self.kind, self.fsync = kind, fsync
        self.rows, self.widths = [int(r) for r in rows], [int(w) for w in widths]
        self.directory = directory
        self.bytes_read = self.bytes_written = self.journal_bytes = self.transactions = 0
        self.after_write = None  # test hook: called after each completed write-back
        self._mm: list[np.memmap] = []
        self._jfd = None
        if kind == "ddr":
            self.tables = [torch.zeros(r, w) for r, w in zip(self.rows, self.widths)]
            return
        if directory is None:
            raise ValueError("the ssd tier needs a directory")
        os.makedirs(directory, exist_ok=True)
        meta = {"version": 1, "rows": self.rows, "widths": self.widths, "dtype": "float32"}
        meta_path = os.path.join(directory, "meta.json")
        if create:
            with open(meta_path, "w") as f:
                json.dump(meta, f)
        else:
            if not os.path.exists(meta_path):
                raise FileNotFoundError(f"no tiered table store in {directory} (meta.json missing)")
            with open(meta_path) as f:
                found = json.load(f)
            for key in ("rows", "widths"):
                if found.get(key) != meta[key]:
                    raise ValueError(f"the store in {directory} has {key}={found.get(key)}, "
                                     f"this module expects {meta[key]}")
        mode = "w+" if create else "r+"
        for t, (r, w) in enumerate(zip(self.rows, self.widths)):
            self._mm.append(np.memmap(self._table_path(t), dtype=np.float32, mode=mode,
                                      shape=(r, w)))
        self.tables = [torch.from_numpy(m) for m in self._mm]
        self._jfd = os.open(os.path.join(directory, "journal"), os.O_RDWR | os.O_CREAT, 0o644)
        if not create:
            self.replayed = self._recover()

    def _table_path(self, t: int) -> str:
        return os.path.join(self.directory, f"table_{t}.f32")

    def nbytes(self) -> int:
        return sum(r * w * 4 for r, w in zip(self.rows, self.widths))

    # --- reads and writes ----------------------------------------------------------------------
    def read(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        """Records [n, width] of rows ``ids`` of table t: one batched (fancy-index) read."""
        out = self.tables[t].index_select(0, ids)
        self.bytes_read += out.numel() * 4
        return out

    def write(self, entries: list[tuple[int, torch.Tensor, torch.Tensor]]) -> None:
        """Write back (table, row ids, records) as one transaction (journaled on the SSD tier)."""
        entries = [(t, ids, recs) for t, ids, recs in entries if ids.numel()]
        if not entries:
            return
        failpoint = os.environ.get(FAILPOINT_ENV)
        if self.kind == "ssd":
            buf = self._encode(entries)
            if failpoint == "journal":
                os.pwrite(self._jfd, buf[: len(buf) // 2], 0)
                os.kill(os.getpid(), signal.SIGKILL)
            os.pwrite(self._jfd, buf, 0)
            if self.fsync:
                os.fsync(self._jfd)
            self.journal_bytes += len(buf)
        self._apply(entries, failpoint if self.kind == "ssd" else None)
        if self.kind == "ssd":
            if self.fsync:
                for t in {t for t, _, _ in entries}:
                    self._mm[t].flush()
            os.ftruncate(self._jfd, 0)
            if self.fsync:
                os.fsync(self._jfd)
        self.bytes_written += sum(recs.numel() * 4 for _, _, recs in entries)
        self.transactions += 1
        if self.after_write is not None:
            self.after_write(self)

    def _apply(self, entries, failpoint: str | None = None) -> None:
        if failpoint == "apply":  # half the rows, then half of the next row, then die
            total = sum(ids.numel() for _, ids, _ in entries)
            left = total // 2
            for t, ids, recs in entries:
                n = min(left, ids.numel())
                self.tables[t].index_copy_(0, ids[:n], recs[:n])
                left -= n
                if left == 0 and n < ids.numel():
                    w = recs.shape[1]
                    self.tables[t][int(ids[n]), : w // 2] = recs[n, : w // 2]
                    os.kill(os.getpid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        for t, ids, recs in entries:
            self.tables[t].index_copy_(0, ids, recs)

    def _encode(self, entries) -> bytes:
        parts = []
        for t, ids, recs in entries:
            parts.append(self._ENTRY.pack(t, ids.numel()))
            parts.append(ids.to(torch.int64).numpy().tobytes())
            parts.append(recs.contiguous().numpy().tobytes())
        payload = b"".join(parts)
        return (self._HEADER.pack(b"RSJ1", len(entries), len(payload)) + payload
                + self._TRAILER.pack(zlib.crc32(payload), b"DONE"))

    def _recover(self) -> str:
        """Replay a complete journal record, drop an incomplete one. -> what was done."""
        size = os.fstat(self._jfd).st_size
        if size == 0:
            return "clean"
        buf = os.pread(self._jfd, size, 0)
        ok = False
        if size >= self._HEADER.size + self._TRAILER.size:
            magic, n, plen = self._HEADER.unpack_from(buf, 0)
            end = self._HEADER.size + plen
            if magic == b"RSJ1" and size == end + self._TRAILER.size:
                crc, mark = self._TRAILER.unpack_from(buf, end)
                payload = buf[self._HEADER.size: end]
                ok = mark == b"DONE" and crc == zlib.crc32(payload)
        if ok:
            entries, off = [], 0
            for _ in range(n):
                t, k = self._ENTRY.unpack_from(payload, off)
                off += self._ENTRY.size
                ids = torch.from_numpy(np.frombuffer(payload, np.int64, k, off).copy())
                off += 8 * k
                w = self.widths[t]
                recs = torch.from_numpy(np.frombuffer(payload, np.float32, k * w, off).copy())
                off += 4 * k * w
                entries.append((t, ids, recs.view(k, w)))
            self._apply(entries)
            self.sync(truncate_journal=False)
        os.ftruncate(self._jfd, 0)
        os.fsync(self._jfd)
        return "replayed" if ok else "dropped"

    def sync(self, truncate_journal: bool = False) -> None:
        """Make the table files durable (msync)."""
        for m in self._mm:
            m.flush()
        if truncate_journal and self._jfd is not None:
            os.ftruncate(self._jfd, 0)
            os.fsync(self._jfd)

    def close(self) -> None:
        if self._jfd is not None:
            os.close(self._jfd)
            self._jfd = None
        self._mm, self.tables = [], []


def _copy_into_views(module, weights: Sequence[torch.Tensor],
                     states: Sequence[Sequence[torch.Tensor]] | None) -> None:
    """Copy whole tables (and optimizer states) into a module's full-table views."""
    with torch.no_grad():
        for view, w in zip(module.split_weights(), weights):
            view.copy_(w)
        for views, st in zip(module.split_optimizer_states(), states or []):
            for view, x in zip(views, st):
                view.copy_(x.view_as(view))


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
class TieredEmbeddingBags(nn.Module):
    """Sum-pooled embedding bags whose tables live on a slow tier behind a fast-tier cache.

    Same inputs and outputs as ``FusedEmbeddingBags`` plus ``config`` (``TierConfig``),
    ``cache_load_factors`` (per table; default ``config.cache_load_factor`` or 0.2),
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
        cache_load_factors: Sequence[float] | None = None,
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
        if cache_load_factors is None:
            c = 0.2 if config.cache_load_factor is None else config.cache_load_factor
            cache_load_factors = [c] * T
        if len(cache_load_factors) != T:
            raise ValueError(f"cache_load_factors has {len(cache_load_factors)} entries for {T} tables")
        for t, c in enumerate(cache_load_factors):
            if not 0 <= c <= 1:
                raise ConfigError(f"cache_load_factors[{t}]={c!r} is not allowed: expected a "
                                  "number in [0, 1]")
        self.cache_rows = tuple(
            min(r, max(math.ceil(c * r), config.min_cache_rows))
            for r, c in zip(self.rows, cache_load_factors))
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
            f"ids but the cache holds {self.cache_rows[t]} rows; raise train.tiers.cache_load_factor "
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
    @property
    def output_dim(self) -> int:
        return sum(self.dims)

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
                                         sparse.lengths))

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

    def load_state(self, weights: Sequence[torch.Tensor],
                   states: Sequence[Sequence[torch.Tensor]] | None = None) -> None:
        """Restore tables (and optimizer states) from a checkpoint, durably."""
        _copy_into_views(self, weights, states)
        self.store.sync()

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


def merge_tier_stats(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """Sum the counters of several modules; hit rate over all their lookups."""
    out: dict[str, float] = {}
    for p in parts:
        for k, v in p.items():
            if k != "hit_rate":
                out[k] = out.get(k, 0) + v
    if out:
        out["hit_rate"] = out["hits"] / out["lookups"] if out.get("lookups") else float("nan")
    return out


# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """Where one table lives: ``memory`` (the compute tier), ``managed`` (CUDA: fbgemm
    MANAGED_CACHING in host memory), ``ddr`` or ``ssd`` (TieredEmbeddingBags)."""

    kind: str = "memory"
    cache_load_factor: float = 0.0


def placement_for(tier: str, compute_tier: str, cache_fraction: float, device_type: str,
                  config: TierConfig | None = None) -> Placement:
    """A plan's shard tier -> how the runtime holds it. The compute tier is plain memory (HBM on
    a GPU; on the CPU the tables are in RAM either way); DDR on CUDA is fbgemm's MANAGED_CACHING;
    other slow tiers are the software cache. ``config.cache_load_factor`` overrides the plan's."""
    if tier == compute_tier:
        return Placement("memory")
    c = cache_fraction
    if config is not None and config.cache_load_factor is not None:
        c = config.cache_load_factor
    if device_type == "cuda" and tier == "ddr":
        return Placement("managed", c)
    return Placement(tier, c)


def managed_caching_bags(rows: Sequence[int], dims: Sequence[int],
                         optimizer: EmbeddingOptimizerConfig, cache_load_factor: float,
                         policy: str = "lru", device: torch.device | str = "cuda", seed: int = 0,
                         table_ids: Sequence[int] | None = None,
                         initial_weights: Sequence[torch.Tensor] | None = None
                         ) -> FusedEmbeddingBags:
    """CUDA only: tables in host memory (UVM) behind fbgemm's HBM cache of ``cache_load_factor`` x
    rows (EmbeddingLocation.MANAGED_CACHING; 0 = EmbeddingLocation.MANAGED, no cache),
    LRU or LFU. ``split_weights()`` flushes and empties the HBM cache first."""
    return FusedEmbeddingBags(rows, dims, optimizer, device=device, seed=seed, table_ids=table_ids,
                              initial_weights=initial_weights, cache_load_factor=cache_load_factor,
                              cache_policy=policy)


class MultiTierEmbeddingBags(nn.Module):
    """Tables with different placements behind the FusedEmbeddingBags interface: each group of
    tables is one module; the features are permuted to the groups (one fbgemm permute) and the
    pooled columns put back in table order (exact copies)."""

    def __init__(self, groups: Sequence[tuple[Sequence[int], nn.Module]], dims: Sequence[int]):
        super().__init__()
        self.dims = tuple(int(d) for d in dims)
        self.rows = None
        self.group_tables = [list(ts) for ts, _ in groups]
        self.groups = nn.ModuleList([m for _, m in groups])
        order = [t for ts in self.group_tables for t in ts]
        if sorted(order) != list(range(len(self.dims))):
            raise ValueError(f"groups must cover tables 0..{len(self.dims) - 1} once: {order}")
        self.register_buffer("_perm", torch.tensor(order, dtype=torch.int32), persistent=False)
        col0 = np.concatenate([[0], np.cumsum(self.dims)])
        cols = [c for t in order for c in range(col0[t], col0[t + 1])]
        inv = np.empty(len(cols), dtype=np.int64)
        inv[cols] = np.arange(len(cols))
        self.register_buffer("_cols", torch.from_numpy(inv), persistent=False)

    @property
    def output_dim(self) -> int:
        return sum(self.dims)

    def _split(self, sparse: SparseFeatures) -> list[SparseFeatures]:
        B = sparse.lengths.shape[1]
        p_l, p_v, _ = torch.ops.fbgemm.permute_2D_sparse_data(
            self._perm, sparse.lengths.view(len(self.dims), B), sparse.values, None, None)
        counts = p_l.sum(1).tolist()
        out, f, v = [], 0, 0
        for ts in self.group_tables:
            n = int(sum(counts[f: f + len(ts)]))
            out.append(SparseFeatures(("",) * len(ts), p_v[v: v + n], p_l[f: f + len(ts)]))
            f, v = f + len(ts), v + n
        return out

    def forward(self, sparse: SparseFeatures) -> torch.Tensor:
        parts = [m(s) for m, s in zip(self.groups, self._split(sparse))]
        return torch.cat(parts, dim=1).index_select(1, self._cols)

    def prefetch(self, sparse: SparseFeatures) -> None:
        if any(hasattr(m, "prefetch") for m in self.groups):
            for m, s in zip(self.groups, self._split(sparse)):
                if hasattr(m, "prefetch"):
                    m.prefetch(s)

    def _by_table(self, per_group: list[list]) -> list:
        out = [None] * len(self.dims)
        for ts, items in zip(self.group_tables, per_group):
            for t, x in zip(ts, items):
                out[t] = x
        return out

    def split_weights(self) -> list[torch.Tensor]:
        return self._by_table([m.split_weights() for m in self.groups])

    def split_optimizer_states(self) -> list[list[torch.Tensor]]:
        per = [m.split_optimizer_states() for m in self.groups]
        if not any(per):
            return []
        return self._by_table(per)

    def flush(self) -> None:
        for m in self.groups:
            if hasattr(m, "flush"):
                m.flush()

    def load_state(self, weights, states=None) -> None:
        _copy_into_views(self, weights, states)
        self.flush()

    def close(self) -> None:
        for m in self.groups:
            if hasattr(m, "close"):
                m.close()

    def tier_stats(self) -> dict[str, float]:
        return merge_tier_stats([m.tier_stats() for m in self.groups if hasattr(m, "tier_stats")])

    def memory_bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in self.groups:
            mb = m.memory_bytes() if hasattr(m, "memory_bytes") else {"fast": _fused_bytes(m)}
            for k, v in mb.items():
                out[k] = out.get(k, 0) + v
        return out


def _fused_bytes(mod: FusedEmbeddingBags) -> int:
    total = 0
    for name, p in list(mod.tbe.named_parameters()) + list(mod.tbe.named_buffers()):
        if name.startswith(("weights_", "momentum")):
            total += p.numel() * p.element_size()
    return total


def build_embedding_bags(
    rows: Sequence[int],
    dims: Sequence[int],
    optimizer: EmbeddingOptimizerConfig,
    placements: Sequence[Placement] | None = None,
    config: TierConfig | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
    init_slices: Sequence[InitSlice] | None = None,
    store_prefix: str = "tiered-",
) -> nn.Module:
    """One embedding module for tables with the given placements: FusedEmbeddingBags when all
    are in memory, a TieredEmbeddingBags when all share one slow tier, else a
    MultiTierEmbeddingBags of groups. Initial weights: ``init_slices`` (default: whole tables
    0..T-1 from ``seed``), so every placement starts from the same values."""
    T = len(rows)
    placements = list(placements or [Placement()] * T)
    init_slices = list(init_slices or [InitSlice(t, int(r), int(d))
                                       for t, (r, d) in enumerate(zip(rows, dims))])
    config = config or TierConfig()
    groups: dict[tuple, list[int]] = {}
    for t, p in enumerate(placements):
        key = (p.kind, p.cache_load_factor) if p.kind == "managed" else (p.kind,)
        groups.setdefault(key, []).append(t)
    mods = []
    for key, ts in groups.items():
        r, d = [rows[t] for t in ts], [dims[t] for t in ts]
        if key[0] in ("memory", "managed"):
            init = [init_slices[t].materialize(seed, rows[t], dims[t]) for t in ts]
            if key[0] == "memory":
                m = FusedEmbeddingBags(r, d, optimizer, device=device, initial_weights=init)
            else:
                m = managed_caching_bags(r, d, optimizer, key[1], config.policy, device,
                                         initial_weights=init)
        else:
            cfg = dataclasses.replace(config, tier=key[0])
            m = TieredEmbeddingBags(r, d, optimizer, device=device, seed=seed, config=cfg,
                                    cache_load_factors=[placements[t].cache_load_factor
                                                        for t in ts],
                                    init_slices=[init_slices[t] for t in ts],
                                    store_prefix=store_prefix)
        mods.append((ts, m))
    if len(mods) == 1 and mods[0][0] == list(range(T)):
        return mods[0][1]
    return MultiTierEmbeddingBags(mods, dims)


def tier_stats_of(module: nn.Module) -> dict[str, float]:
    """Tier counters of an embedding module (empty when it keeps everything in memory)."""
    fn = getattr(module, "tier_stats", None)
    return fn() if fn is not None else {}
