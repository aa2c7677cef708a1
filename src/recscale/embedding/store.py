"""The slow tier of the tiered embedding store: ``SlowTierStore``, every table's row records.

Per table one ``[rows, dim + state]`` float32 array of row records, the weights followed by the
fused optimizer's state of that row (row-wise Adagrad: 1 float; Adagrad: ``dim``; SGD: none), so
one fancy-index read fetches a row's weights and state.

- ``ddr``: a host tensor.
- ``ssd``: a ``numpy.memmap`` file under a directory; every write-back goes first to a journal
  (one record per transaction, with a CRC and a commit mark), then to the file, then the journal
  is truncated; opening an existing store replays a complete journal and drops an incomplete one,
  so a process killed mid write-back never leaves a torn row.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import zlib
from collections.abc import Sequence

import numpy as np
import torch

from recscale.config import check_choice
from recscale.embedding.tier_config import TIER_KINDS

# A test hook (failpoint): "journal" kills the process after half of the next SSD journal record
# is written, "apply" after half of the next write-back is applied to the table file (mid-row).
FAILPOINT_ENV = "RECSCALE_TIERED_FAILPOINT"


class SlowTierStore:
    """Row records of every table of one module on the slow tier (see the module docstring).
    ``create=False`` opens the store already in ``directory`` and recovers it from its journal
    (``replayed``: "clean", "replayed" or "dropped")."""

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

