"""torchdata.nodes loaders: parquet row groups -> Batch.

One-hot files (an int64 id per feature) decode to ``Columns``; multi-hot files (``list<int64>``
bags, ``recscale.data.multihot``) to ``BagColumns``; both become the same jagged Batch. Which
columns are what is read from the file itself, as preprocessing wrote it from the fitted schema
(``parquet_features``): ``row`` and ``label``, then the dense features (float32), then the sparse
features (an int64 id, or a list of them), each in the schema's order.

Graph per rank: RowGroupSource (this rank's row groups) -> ParallelMapper (read + decode a row
group in reader threads; pyarrow releases the GIL) -> Rebatcher (exact batch_size slices across
row-group boundaries) -> Mapper (numpy -> Batch tensors) -> [PinMemory on CUDA] -> Prefetcher.
Decoding happens once per row group; the per-batch path is numpy slicing only.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
import torchdata.nodes as tn

from recscale.config import Validated, check
from recscale.data.batch import Batch, SparseFeatures
from recscale.data.encode import WEIGHTS_OF


@dataclass(frozen=True)
class RowGroupRef:
    """Rows [start, stop) of row group ``index`` of ``path`` (stop None = to the end)."""

    path: str
    index: int
    num_rows: int
    start: int = 0
    stop: int | None = None

    @property
    def rows(self) -> int:
        return (self.num_rows if self.stop is None else self.stop) - self.start


def list_row_groups(files: Sequence[str | os.PathLike]) -> list[RowGroupRef]:
    refs = []
    for f in files:
        meta = pq.ParquetFile(f).metadata
        refs += [RowGroupRef(str(f), i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    return refs


def shard_row_groups(refs: Sequence[RowGroupRef], rank: int, world_size: int) -> list[RowGroupRef]:
    """One rank's rows: the contiguous range [rank * N / W, (rank + 1) * N / W) of the N rows, so
    ranks differ by at most one row and every row is read by exactly one rank. A rank reads the row
    groups inside its range whole and at most two boundary groups in part."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not allowed: expected 0 <= rank < world_size={world_size}")
    total = sum(r.rows for r in refs)
    lo, hi = rank * total // world_size, (rank + 1) * total // world_size
    out, pos = [], 0
    for r in refs:
        a, b = max(lo, pos), min(hi, pos + r.rows)
        if a < b:
            out.append(RowGroupRef(r.path, r.index, r.num_rows, r.start + a - pos, r.start + b - pos))
        pos += r.rows
    return out


def select_rows(refs: Sequence[RowGroupRef], work: Sequence[Sequence[int]]) -> list[RowGroupRef]:
    """The row groups (in part where needed) holding the row positions of ``work`` (intervals
    [start, stop) of the rows of ``refs`` counted from 0; see ``recscale.data.work``), in the
    order of ``work``."""
    starts, pos = [], 0
    for r in refs:
        starts.append(pos)
        pos += r.rows
    out = []
    for a, b in work:
        if not 0 <= a <= b <= pos:
            raise ValueError(f"row interval [{a}, {b}) is not allowed: these files hold {pos} rows")
        for r, s in zip(refs, starts, strict=True):
            lo, hi = max(a, s), min(b, s + r.rows)
            if lo < hi:
                out.append(RowGroupRef(r.path, r.index, r.num_rows, r.start + lo - s,
                                       r.start + hi - s))
    return out


def rank_row_counts(files: Sequence[str | os.PathLike], world_size: int) -> list[int]:
    refs = list_row_groups(files)
    return [sum(r.rows for r in shard_row_groups(refs, k, world_size)) for k in range(world_size)]


@dataclass
class Columns:
    """Decoded rows in numpy: what a row group (or a batch slice of rows) holds; ``keys``: the
    sparse features' names (the batch's keys)."""

    row: np.ndarray
    label: np.ndarray
    dense: np.ndarray
    ids: np.ndarray
    present: np.ndarray
    keys: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.row.shape[0])

    def slice(self, a: int, b: int) -> Columns:
        return Columns(self.row[a:b], self.label[a:b], self.dense[a:b], self.ids[a:b],
                       self.present[a:b], self.keys)

    @staticmethod
    def concat(parts: Sequence[Columns]) -> Columns:
        if len(parts) == 1:
            return parts[0]
        return Columns(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                         ("row", "label", "dense", "ids", "present")), keys=parts[0].keys)


@dataclass
class BagColumns:
    """Decoded multi-hot rows: ``lengths[i, t]`` ids for feature t of row i, ``values`` row-major
    (row 0's bags of features 0..T-1, then row 1's, ...), so a slice of rows is one slice."""

    row: np.ndarray
    label: np.ndarray
    dense: np.ndarray
    lengths: np.ndarray  # int64 [n, T]
    values: np.ndarray  # int64 [lengths.sum()]
    keys: tuple[str, ...] = ()  # the sparse features' names
    weights: np.ndarray | None = None  # float32, one per value (1 for unweighted features)
    _starts: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.row.shape[0])

    def slice(self, a: int, b: int) -> BagColumns:
        if self._starts is None:  # where each row's ids begin: once per object, not per slice
            self._starts = np.concatenate([[0], np.cumsum(self.lengths.sum(axis=1))])
        lo, hi = int(self._starts[a]), int(self._starts[b])
        return BagColumns(self.row[a:b], self.label[a:b], self.dense[a:b], self.lengths[a:b],
                          self.values[lo:hi], self.keys,
                          None if self.weights is None else self.weights[lo:hi])

    @staticmethod
    def concat(parts: Sequence[BagColumns]) -> BagColumns:
        if len(parts) == 1:
            return parts[0]
        weights = None if parts[0].weights is None else np.concatenate([p.weights for p in parts])
        return BagColumns(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                            ("row", "label", "dense", "lengths", "values")), keys=parts[0].keys,
                          weights=weights)


def regroup(lengths: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Jagged ``values`` laid out by (i, j) segments of ``lengths[i, j]`` -> laid out by (j, i),
    one gather (no Python loop over features or rows)."""
    n, m = lengths.shape
    src_start = np.zeros(n * m, dtype=np.int64)
    np.cumsum(lengths.reshape(-1)[:-1], out=src_start[1:])
    dst_len = lengths.T.reshape(-1)
    dst_start = np.zeros(n * m, dtype=np.int64)
    np.cumsum(dst_len[:-1], out=dst_start[1:])
    shift = src_start.reshape(n, m).T.reshape(-1) - dst_start
    return values[np.repeat(shift, dst_len) + np.arange(int(dst_len.sum()))]


def parquet_features(schema: pa.Schema) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(dense feature names, sparse feature names) of a preprocessed file, in its column order:
    every float column but ``label`` is a dense feature, every integer or list column but
    ``row`` a sparse one (a column of id weights, marked ``WEIGHTS_OF``, is neither)."""
    dense, sparse = [], []
    for f in schema:
        if f.name in ("row", "label") or _weights_of(f) is not None:
            continue
        (dense if pa.types.is_floating(f.type) else sparse).append(f.name)
    return tuple(dense), tuple(sparse)


def _weights_of(f: pa.Field) -> str | None:
    """The feature whose id weights a column holds, or None."""
    meta = f.metadata or {}
    got = meta.get(WEIGHTS_OF.encode())
    return got.decode() if got is not None else None


def _read_bags(table, dense_names, sparse_names) -> BagColumns:
    lengths, flat, weights = [], [], []
    weighted = {_weights_of(f): f.name for f in table.schema if _weights_of(f) is not None}
    for name in sparse_names:
        col = table.column(name).combine_chunks()
        lengths.append(pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False))
        flat.append(pc.list_flatten(col).to_numpy(zero_copy_only=False))
        if weighted:
            weights.append(pc.list_flatten(table.column(weighted[name]).combine_chunks())
                           .to_numpy(zero_copy_only=False) if name in weighted
                           else np.ones(len(flat[-1]), np.float32))
    n = table.num_rows
    lengths_tn = np.stack(lengths).astype(np.int64) if n else np.zeros((len(sparse_names), 0),
                                                                      np.int64)
    values = np.concatenate(flat).astype(np.int64, copy=False)
    return BagColumns(
        row=table.column("row").to_numpy().copy(),
        label=table.column("label").to_numpy().astype(np.float32),
        dense=_dense(table, dense_names),
        lengths=np.ascontiguousarray(lengths_tn.T),
        values=regroup(lengths_tn, values),
        keys=sparse_names,
        weights=regroup(lengths_tn, np.concatenate(weights).astype(np.float32, copy=False))
        if weighted else None,
    )


def _dense(table, names) -> np.ndarray:
    if not names:
        return np.zeros((table.num_rows, 0), np.float32)
    return np.stack([table.column(n).to_numpy() for n in names], axis=1).astype(np.float32)


def read_row_group(ref: RowGroupRef) -> Columns | BagColumns:
    f = pq.ParquetFile(ref.path)
    table = f.read_row_group(ref.index)
    if ref.start or ref.stop is not None:
        table = table.slice(ref.start, ref.rows)
    return columns_of(table)


def columns_of(table: pa.Table) -> Columns | BagColumns:
    """Preprocessed rows (``recscale.data.encode.output_schema``'s columns) -> numpy columns."""
    dense_names, sparse_names = parquet_features(table.schema)
    if any(pa.types.is_list(table.schema.field(n).type) for n in sparse_names):
        return _read_bags(table, dense_names, sparse_names)
    dense = _dense(table, dense_names)
    ids = np.stack([pc.fill_null(table.column(n), 0).to_numpy() for n in sparse_names], axis=1)
    present = np.stack([table.column(n).is_valid().to_numpy() for n in sparse_names], axis=1)
    return Columns(
        row=table.column("row").to_numpy().copy(),
        label=table.column("label").to_numpy().astype(np.float32),
        dense=dense,
        ids=ids.astype(np.int64, copy=False),
        present=present,
        keys=sparse_names,
    )


class IdOutOfRange(ValueError):
    """A batch holds an id that is not a row of its feature's table."""

    def __init__(self, message: str):
        # torchdata re-raises a reader thread's error with the thread's traceback as its
        # message (once per node it passes): keep the original message, which names the row
        marker = f"{type(self).__name__}: "
        if "Original Traceback" in message and marker in message:
            message = message.rsplit(marker, 1)[1].strip()
        super().__init__(message)


def check_ids(cols: Columns | BagColumns, rows: Sequence[int], where: str) -> None:
    """Every present id of feature ``t`` in ``[0, rows[t])``; else IdOutOfRange naming the row,
    the feature, the id and the table's rows (one vectorised pass over the ids)."""
    limit = np.asarray(rows, dtype=np.int64)
    if len(limit) != len(cols.keys):
        raise ValueError(f"{len(limit)} table sizes for the {len(cols.keys)} features "
                         f"{', '.join(cols.keys)}")
    if isinstance(cols, BagColumns):
        feat = np.repeat(np.tile(np.arange(len(limit)), len(cols)), cols.lengths.reshape(-1))
        bad = (cols.values < 0) | (cols.values >= limit[feat])
        if not bad.any():
            return
        i = int(np.flatnonzero(bad)[0])
        t = int(feat[i])
        r = int(np.searchsorted(np.cumsum(cols.lengths.sum(axis=1)), i, side="right"))
        value = int(cols.values[i])
    else:
        bad = cols.present & ((cols.ids < 0) | (cols.ids >= limit[None, :]))
        if not bad.any():
            return
        r, t = (int(v) for v in np.argwhere(bad)[0])
        value = int(cols.ids[r, t])
    raise IdOutOfRange(
        f"row {int(cols.row[r])} ({where}): feature {cols.keys[t]} has id {value}, not a row "
        f"of its table ([0, {int(limit[t])})): the data does not match the manifest's schema; "
        "preprocess it again")


def empty_columns(keys: Sequence[str], num_dense: int) -> Columns:
    """No rows, of a dataset with sparse features ``keys`` and ``num_dense`` dense ones."""
    return Columns(np.zeros(0, np.int64), np.zeros(0, np.float32),
                   np.zeros((0, num_dense), np.float32), np.zeros((0, len(keys)), np.int64),
                   np.zeros((0, len(keys)), bool), tuple(keys))


def empty_batch(keys: Sequence[str], num_dense: int, weighted: bool = False) -> Batch:
    """A batch of no rows of a dataset with sparse features ``keys`` and ``num_dense`` dense
    (``weighted``: with its empty id weights, as the dataset's other batches have them: a
    sharded step's exchanges carry weights on every rank or on none)."""
    batch = to_batch(empty_columns(keys, num_dense))
    if weighted:
        batch.sparse.weights = torch.zeros(0, dtype=torch.float32)
    return batch


def empty_like(batch: Batch | None) -> Batch:
    """A batch of no rows with the features of ``batch``."""
    if batch is None:
        raise RuntimeError("this rank's rows ran out before its first batch and its EpochData "
                           "names no empty batch of the dataset's features (EpochData.empty)")
    return empty_batch(batch.sparse.keys, int(batch.dense.shape[1]),
                       batch.sparse.weights is not None)


def to_batch(cols: Columns | BagColumns) -> Batch:
    if isinstance(cols, BagColumns):
        sparse = SparseFeatures(cols.keys, torch.from_numpy(regroup(cols.lengths, cols.values)),
                                torch.from_numpy(np.ascontiguousarray(cols.lengths.T)),
                                None if cols.weights is None else
                                torch.from_numpy(regroup(cols.lengths, cols.weights)))
        return Batch(torch.from_numpy(np.ascontiguousarray(cols.dense)), sparse,
                     torch.from_numpy(np.ascontiguousarray(cols.label)),
                     torch.from_numpy(np.ascontiguousarray(cols.row)))
    return Batch(
        dense=torch.from_numpy(np.ascontiguousarray(cols.dense)),
        sparse=SparseFeatures.from_dense_ids(cols.keys, cols.ids, cols.present),
        labels=torch.from_numpy(np.ascontiguousarray(cols.label)),
        row_ids=torch.from_numpy(np.ascontiguousarray(cols.row)),
    )


class RowGroupSource(tn.BaseNode[RowGroupRef]):
    """Yields this rank's row groups in order; its state is the index of the next one."""

    def __init__(self, refs: Sequence[RowGroupRef]):
        super().__init__()
        self.refs = list(refs)
        self._i = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._i = initial_state["next"] if initial_state else 0

    def next(self) -> RowGroupRef:
        if self._i >= len(self.refs):
            raise StopIteration
        self._i += 1
        return self.refs[self._i - 1]

    def get_state(self) -> dict[str, Any]:
        return {"next": self._i}


class Rebatcher(tn.BaseNode[Columns]):
    """Cuts a stream of row groups into batches of exactly ``batch_size`` rows, the last one
    shorter (no row is ever dropped). State: batches emitted this epoch (a resume re-reads and
    skips them, which is exact because the order is deterministic).
    """

    def __init__(self, source: tn.BaseNode[Columns], batch_size: int):
        super().__init__()
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} is not allowed: expected a positive integer")
        self.source = source
        self.batch_size = batch_size
        self._buf: list[Columns] = []
        self._n = 0
        self._emitted = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.source.reset()
        self._buf, self._n, self._emitted = [], 0, 0
        for _ in range(initial_state["batches_emitted"] if initial_state else 0):
            self.next()

    def next(self) -> Columns:
        while self._n < self.batch_size:
            try:
                part = next(self.source)
            except StopIteration:
                break
            if len(part):
                self._buf.append(part)
                self._n += len(part)
        if self._n == 0:
            raise StopIteration
        merged = type(self._buf[0]).concat(self._buf)
        take = min(self.batch_size, self._n)
        out, rest = merged.slice(0, take), merged.slice(take, self._n)
        self._buf = [rest] if len(rest) else []
        self._n = len(rest)
        self._emitted += 1
        return out

    def get_state(self) -> dict[str, Any]:
        return {"batches_emitted": self._emitted}


@dataclass(frozen=True)
class LoaderConfig(Validated):
    batch_size: int
    rank: int = 0
    world_size: int = 1
    reader_workers: int = 2
    prefetch: int = 4
    pin_memory: bool = False
    # per sparse feature, its table's rows: every id is checked to be one (None: unchecked)
    table_rows: tuple[int, ...] | None = None

    def validate(self, prefix: str = "loader") -> None:
        check(self.batch_size > 0, f"{prefix}.batch_size", self.batch_size, "a positive integer")
        check(0 <= self.rank < self.world_size, f"{prefix}.rank", self.rank,
              f"in [0, world_size={self.world_size})")
        check(self.reader_workers >= 1, f"{prefix}.reader_workers", self.reader_workers, ">= 1")
        check(self.prefetch >= 1, f"{prefix}.prefetch", self.prefetch, ">= 1")


def _read(ref: RowGroupRef, rows: Sequence[int] | None,
          route: Callable[[Columns | BagColumns], Columns | BagColumns] | None
          ) -> Columns | BagColumns:
    cols = read_row_group(ref)
    if rows is not None:
        check_ids(cols, rows, f"{ref.path}, row group {ref.index}")
    return cols if route is None else route(cols)


def make_loader(files: Sequence[str | os.PathLike], cfg: LoaderConfig,
                work: Sequence[Sequence[int]] | None = None,
                route: Callable[[Columns | BagColumns], Columns | BagColumns] | None = None
                ) -> tn.Loader:
    """A restartable loader of Batches over this rank's row groups of ``files``, or over the
    row positions ``work`` (intervals; the rest of an epoch resharded to another world size).
    ``route``: applied to each row group's columns after they are read and checked, in the
    reader threads (the train split's unknown-id routing, ``recscale.data.unknown_ids``: a
    function of each row's own number, so the same rows are changed whatever the rank, world
    size or resume point)."""
    refs = list_row_groups(files)
    if work is None:
        refs = shard_row_groups(refs, cfg.rank, cfg.world_size)
    else:
        refs = select_rows(refs, work)
    node: tn.BaseNode = RowGroupSource(refs)
    read = read_row_group if cfg.table_rows is None and route is None else functools.partial(
        _read, rows=cfg.table_rows, route=route)
    node = tn.ParallelMapper(node, read, num_workers=max(1, cfg.reader_workers),
                             in_order=True, method="thread")
    node = Rebatcher(node, cfg.batch_size)
    node = tn.Mapper(node, to_batch)
    if cfg.pin_memory and torch.cuda.is_available():
        node = tn.PinMemory(node)
    node = tn.Prefetcher(node, prefetch_factor=max(1, cfg.prefetch))
    return tn.Loader(node)


def count_rows(files: Sequence[str | os.PathLike]) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)
