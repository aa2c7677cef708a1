"""One block of parsed rows -> model-ready parquet columns, through the fitted feature schema.

Every preprocessing path writes through ``encode``: the Criteo TSV reader (both engines, by way
of ``recscale.data.processed.write_split_rows``), the multi-hot Criteo parquet and any table of
the user's own (``recscale.data.table_preprocess``). A reader parses its rows into ``Parsed``
(raw dense values with their presence, raw integer keys per sparse feature, the rows rejected
with their reason); ``encode`` applies the dense transforms with their fitted statistics, maps the
keys to rows (hash, vocabulary or index), bucketizes, and lays the columns out as
``output_schema`` says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from recscale.data.schema import FittedSchema
from recscale.data.vocab import Vocabulary

WEIGHTS_OF = "recscale.weights_of"  # field metadata of a weights column: the feature's name


@dataclass
class Parsed:
    """One block's values, before anything fitted is applied."""

    n: int
    label: np.ndarray  # int8
    dense: list[tuple[np.ndarray, np.ndarray]]  # per dense feature: raw float64, present
    # per sparse feature: (lengths [n], flat int64 keys), or RowIds
    keys: list[tuple[np.ndarray, np.ndarray] | RowIds]
    bad: np.ndarray  # bool [n]
    reasons: dict[int, str] = field(default_factory=dict)  # row in block -> first reason
    # per weighted sparse feature (its position): float32 weights aligned with its keys
    weights: dict[int, np.ndarray] = field(default_factory=dict)

    def reject(self, rows: np.ndarray, reason: Callable[[int], str]) -> None:
        for r in np.flatnonzero(rows):
            if not self.bad[r]:
                self.bad[r] = True
                self.reasons[int(r)] = reason(int(r))


@dataclass
class RowIds:
    """A categorical feature's ids laid out one per row, as a reader with a column per feature
    has them (the Criteo TSV's): ``ids[i]`` is row i's id, any value where not ``present[i]``.
    ``Parsed.keys`` takes it in place of (lengths, keys), which saves a gather and a scatter."""

    present: np.ndarray  # bool [n]
    ids: np.ndarray  # int64 [n]


def split_keys(lengths: np.ndarray, keys: np.ndarray, keep: np.ndarray):
    """The (lengths, keys) of the rows ``keep``."""
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    return lengths[keep], keys[keep[row_of]]


def output_schema(fitted: FittedSchema) -> pa.Schema:
    """The processed parquet's columns: ``row``, ``label``, the dense inputs (float32), the
    sparse inputs (int64, or list<int64> when any feature is multi-hot), in the schema's order
    (what the loader reads)."""
    bags = any(f.is_bag for f in fitted.schema.sparse_inputs)
    fields = [pa.field("row", pa.int64(), nullable=False),
              pa.field("label", pa.int8(), nullable=False)]
    fields += [pa.field(n, pa.float32(), nullable=False) for n in fitted.dense_names]
    fields += [pa.field(n, pa.list_(pa.int64()) if bags else pa.int64())
               for n in fitted.sparse_names]
    # the ids' weights of weighted features, after every feature, marked for the loader
    fields += [pa.field(f.weights_column, pa.list_(pa.float32()),
                        metadata={WEIGHTS_OF: f.name})
               for f in fitted.schema.sparse_inputs if f.weights]
    return pa.schema(fields)


def encode(p: Parsed, fitted: FittedSchema, vocab: Vocabulary | None,
           rows: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """Parsed rows -> the output table of the rows that pass (``rows``: the block's global row
    numbers), and per sparse input the number of ids written. ``vocab``: the vocabulary of the
    ``ids: vocab`` tables, in ``schema.vocab_tables`` order."""
    schema = fitted.schema
    sizes = dict(zip(fitted.table_names, fitted.table_rows))
    ids: list[tuple[np.ndarray, np.ndarray] | RowIds] = []
    for f, entry in zip(schema.sparse, p.keys):
        keys = entry.ids if isinstance(entry, RowIds) else entry[1]
        size = sizes[f.table_name]
        if f.ids == "vocab":
            mapped = vocab.lookup(schema.vocab_index(f), keys)
        elif f.ids == "index":  # checked by the reader: every id is in [0, size)
            mapped = keys
        else:
            mapped = keys % size
        mapped = mapped.astype(np.int64, copy=False)
        ids.append(RowIds(entry.present, mapped) if isinstance(entry, RowIds)
                   else (entry[0], mapped))
    for f, (x, present) in zip(schema.dense, p.dense):
        if f.boundaries is not None:
            ids.append(RowIds(present, f.bucket(x, fitted.stats.get(f.name))))
    keep = ~p.bad
    everything = bool(keep.all())
    bags = any(f.is_bag for f in schema.sparse_inputs)
    cols = [pa.array(rows if everything else rows[keep], pa.int64()),
            pa.array(p.label if everything else p.label[keep], pa.int8())]
    for f, (x, present) in zip(schema.dense, p.dense):
        if f.boundaries is None:
            v = f.apply(x, present, fitted.stats.get(f.name))
            cols.append(pa.array(v if everything else v[keep]))
    present_ids = np.zeros(len(ids), np.int64)
    for j, entry in enumerate(ids):
        if isinstance(entry, RowIds):
            present, mapped = entry.present, entry.ids
            if not everything:
                present, mapped = present[keep], mapped[keep]
            present_ids[j] = int(np.count_nonzero(present))
            if not bags:  # one nullable id column: the values under the mask are not stored
                cols.append(pa.array(mapped, mask=~present))
                continue
            lengths, mapped = present.astype(np.int64), mapped[present]
        else:
            lengths, mapped = entry
            if not everything:
                lengths, mapped = split_keys(lengths, mapped, keep)
            present_ids[j] = len(mapped)
        if bags:
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            cols.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(mapped, pa.int64())))
        else:
            full = np.zeros(len(lengths), np.int64)
            full[lengths > 0] = mapped
            cols.append(pa.array(full, mask=lengths == 0))
    for j, f in enumerate(schema.sparse):
        if f.weights:
            lengths = p.keys[j][0]
            w = p.weights[j]
            if not everything:
                lengths, w = split_keys(lengths, w, keep)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            cols.append(pa.ListArray.from_arrays(pa.array(offsets),
                                                 pa.array(w.astype(np.float32), pa.float32())))
    return pa.Table.from_arrays(cols, schema=output_schema(fitted)), present_ids
