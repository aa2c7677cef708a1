"""History features (``kind: history``): for each row, the ``item`` values of the other rows of
the same ``key`` strictly before the row's ``time``, the latest ``max_len`` of them, oldest
first (the user's last N items before this click). Rows at the same time do not see each
other; among rows at one time, input order decides which are the latest. A row without a key or
time gets an empty history and is in no other row's; a row without an item is in none either.

The input may be in any order (a log as it comes, shuffled, or grouped by user). Built before
the rows are parsed, in three steps whose memory is bounded by a partition, not the input:

1. One pass over the input's units in row order reads the key, item and time columns and
   spills each row's (row, key, time, item) to one of ``P`` partitions by a hash of its key
   (``P``: the rows over ``PARTITION_ROWS``), so all of a key's rows are in one partition.
2. Each partition is sorted by (key, time, row) and every row's history found by binary search
   (vectorised; no Python per row), written sorted by row.
3. A unit's blocks, as the fitting and writing passes read them (in this process, worker
   processes or Spark tasks), get their rows' histories joined as a list column named as the
   feature (``with_histories``: the partitions' row groups for the block's rows), which the
   parser takes as a multi-hot column.

Steps 1 and 2 run where preprocessing is driven (the Spark engine's driver too). The scratch
files live under ``<output>/_history/`` and are removed when the manifest is written. A served
model takes the history as a column of its own (a list, or a delimited string): a service
keeps, per key, the same last ``max_len`` items (docs/features.md, "Histories").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recscale.data.schema import SparseFeature
from recscale.data.splits import time_values
from recscale.data.table_parse import stable_hash

HISTORY_DIR = "_history"
PARTITION_ROWS = 4_000_000  # rows per partition of step 2 (its memory: ~100 bytes a row)
RESULT_ROW_GROUP = 16_384  # step 2's row groups: what a block reads of each partition


@dataclass(frozen=True)
class Histories:
    """Where step 2 left each history feature's partitions (what ``with_histories`` reads)."""

    features: tuple[str, ...]  # the features' columns, as the parser reads them
    parts: tuple[tuple[str, ...], ...]  # per feature, its partitions' files


def _text(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Keys and items as text, so a file's integer 42 and a CSV's "42" are one value; floats
    that are integers written as integers; empty text as missing."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_floating(col.type):
        x = col.to_numpy(zero_copy_only=False)
        whole = np.isfinite(x) & (np.floor(x) == x)
        if whole[~np.isnan(x)].all():
            col = pa.array(np.where(whole, x, 0).astype(np.int64), mask=~whole)
    text = col if pa.types.is_string(col.type) else pc.cast(col, pa.string())
    text = pc.utf8_trim_whitespace(text)
    return pc.if_else(pc.equal(text, ""), pa.scalar(None, pa.string()), text)


def build_histories(features: Sequence[SparseFeature],
                    blocks: Callable[[Sequence[str]], Iterator[tuple[int, pa.Table]]],
                    total: int, out: str | Path) -> Histories:
    """Steps 1 and 2 (module docstring). ``blocks(columns)``: the input's rows in row order,
    as (first global row, block of ``columns``)."""
    scratch = Path(out) / HISTORY_DIR
    n_parts = max(1, -(-total // PARTITION_ROWS))
    parts = []
    for fi, f in enumerate(features):
        spill = [scratch / f"spill-{fi}-{p:04d}.parquet" for p in range(n_parts)]
        schema = pa.schema([("row", pa.int64()), ("key", pa.string()), ("time", pa.float64()),
                            ("item", pa.string())])
        scratch.mkdir(parents=True, exist_ok=True)
        writers = [pq.ParquetWriter(s, schema) for s in spill]
        try:
            for base, t in blocks([f.key, f.time, f.item]):
                keys = _text(t.column(f.key))
                times, ok = time_values(t.column(f.time))
                table = pa.table({"row": base + np.arange(t.num_rows, dtype=np.int64),
                                  "key": keys, "time": np.where(ok, times, np.nan),
                                  "item": _text(t.column(f.item))}, schema=schema)
                part = stable_hash(keys).view(np.uint64) % np.uint64(n_parts)
                for p in range(n_parts):
                    sel = part == p
                    if sel.any():
                        writers[p].write_table(table.filter(pa.array(sel)))
        finally:
            for w in writers:
                w.close()
        files = []
        for p, s in enumerate(spill):
            result = scratch / f"history-{fi}-{p:04d}.parquet"
            pq.write_table(_partition_histories(pq.read_table(s), f.max_len), result,
                           row_group_size=RESULT_ROW_GROUP)
            s.unlink()
            files.append(str(result))
        parts.append(tuple(files))
    return Histories(tuple(f.source for f in features), tuple(parts))


def _partition_histories(t: pa.Table, max_len: int) -> pa.Table:
    """Step 2 on one partition's (row, key, time, item) -> (row, history), sorted by row."""
    rows = t.column("row").to_numpy()
    order = np.argsort(rows, kind="stable")
    t, rows = t.take(pa.array(order)), rows[order]
    times = t.column("time").to_numpy(zero_copy_only=False)
    keys = t.column("key").combine_chunks()
    query = keys.is_valid().to_numpy(zero_copy_only=False) & ~np.isnan(times)
    items = t.column("item").combine_chunks()
    event = query & items.is_valid().to_numpy(zero_copy_only=False)
    code = pc.fill_null(pc.dictionary_encode(keys).indices, 0).to_numpy(zero_copy_only=False)
    _, rank = np.unique(np.where(query, times, 0.0), return_inverse=True)
    width = np.int64(rank.max(initial=0) + 2)
    at = np.where(query, code.astype(np.int64) * width + rank + 1, -1)  # (key, time) as one int
    ev = np.flatnonzero(event)
    ev = ev[np.argsort(at[ev], kind="stable")]  # by (key, time), then row: oldest first
    ev_at = at[ev]
    q = np.flatnonzero(query)
    end = np.searchsorted(ev_at, at[q], side="left")  # events of the key before this time
    start = np.maximum(np.searchsorted(ev_at, code[q].astype(np.int64) * width, side="left"),
                       end - max_len)
    lengths = np.zeros(len(rows), np.int64)
    lengths[q] = end - start
    take = np.repeat(start, end - start) + (
        np.arange(int((end - start).sum())) - np.repeat(np.cumsum(end - start) - (end - start),
                                                        end - start))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = items.take(pa.array(ev[take], pa.int64()))
    return pa.table({"row": rows, "history": pa.ListArray.from_arrays(pa.array(offsets), values)})


def with_histories(blocks: Iterator[pa.Table], first_row: int,
                   histories: Histories | None) -> Iterator[pa.Table]:
    """Step 3: a unit's blocks (its first global row ``first_row``) with each history feature
    joined as a list column, row for row."""
    if histories is None:
        yield from blocks
        return
    base = first_row
    for t in blocks:
        lo, hi = base, base + t.num_rows
        for name, files in zip(histories.features, histories.parts):
            got = [pq.read_table(f, filters=[("row", ">=", lo), ("row", "<", hi)])
                   for f in files]
            side = pa.concat_tables(got) if len(got) > 1 else got[0]
            side = side.take(pc.sort_indices(side.column("row")))
            if side.num_rows != t.num_rows:
                raise RuntimeError(f"history {name}: {side.num_rows} rows for the block of rows "
                                   f"{lo}-{hi - 1}")
            t = t.append_column(name, side.column("history"))
        base = hi
        yield t
