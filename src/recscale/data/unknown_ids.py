"""Ids not seen in training look up a row that training updated.

An id that the train split never held has no row of its own: with ``ids: vocab`` it maps to the
out-of-vocabulary row 0, with ``ids: hash`` to whichever row its hash lands on. Left alone, that
row is either never trained (the vocabulary's row 0 when every train id passed ``min_count``; a
hashed row no train id lands on) or trained on other ids. Two things make it a trained row:

1. **Routing** (``train.unknown_ids.routing: frequency``): while training, each occurrence of a
   train id whose table row the train split holds ``n`` times is looked up in the table's
   unknown row (row 0) instead, with probability ``min(1, k / n)``: about ``k`` occurrences per
   id, so row 0 learns what a first sighting of an id looks like, which is what an unseen id at
   serving time is. Rare ids (``n <= k``) always go there: they are treated as unknown. The
   decision is a hash of (``train.seed``, the row's number in the dataset, the feature, the id's
   place in its bag): the same occurrences are routed in every epoch, on any world size, after a
   resume, and nothing else is (validation, test and serving read their ids as written).
   Only features with ``ids: hash`` or ``ids: vocab`` are routed (``index`` ids and bucketized
   dense features have no unknown id).
2. **Filling** (``train.unknown_ids.fill``, ``recscale.embedding.unknown``): when training ends,
   every row of a hashed or vocabulary table that still holds its initial value (no update ever
   reached it) gets the trained row 0's vector.

The per-row counts ``n`` come from preprocessing: the train split's ids counted per table row
(``count_train_rows``), written beside the manifest as ``row_counts.parquet`` (columns ``table``,
``row``, ``count``; rows the split never holds are left out) and named by the manifest's
``row_counts_path``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recscale.config import Validated, check, check_choice
from recscale.data.schema import FittedSchema

ROW_COUNTS_NAME = "row_counts.parquet"
UNKNOWN_ROW = 0
ROUTING = ("frequency", "off")
# a lookup array of every table's counts is used up to this many rows in all (4 bytes each);
# above it, a sorted array of the rows the train split holds
DENSE_LOOKUP_ROWS = 1 << 23


@dataclass(frozen=True)
class UnknownIdsConfig(Validated):
    """The ``train.unknown_ids`` block (module docstring)."""

    routing: Literal["frequency", "off"] = "frequency"
    k: float = 1.0  # occurrences of each train id routed to the unknown row (about)
    fill: bool = True  # rows no update reached get the trained unknown row's vector

    def validate(self, prefix: str = "train.unknown_ids") -> None:
        check_choice(f"{prefix}.routing", self.routing, ROUTING)
        check(isinstance(self.k, (int, float)) and self.k > 0, f"{prefix}.k", self.k, "> 0")
        check(isinstance(self.fill, bool), f"{prefix}.fill", self.fill, "true or false")


def unknown_tables(fitted: FittedSchema) -> tuple[bool, ...]:
    """For each table, whether it has an unknown row (its ids are hashed or a vocabulary)."""
    policy = {f.table_name: f.ids for f in fitted.schema.sparse_inputs}
    return tuple(policy[n] in ("hash", "vocab") for n in fitted.table_names)


# --- counting, in preprocessing --------------------------------------------------------------------
def count_train_rows(files: Sequence[str | os.PathLike], fitted: FittedSchema
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per table, (rows the train split's ids hold, how many times each), over every feature
    that looks the table up; one table's counts in memory at a time (its rows x 8 bytes)."""
    out = []
    feats = fitted.table_features()
    for t, rows in enumerate(fitted.table_rows):
        total = np.zeros(int(rows), np.int64)
        for f in files:
            pf = pq.ParquetFile(f)
            for g in range(pf.metadata.num_row_groups):
                table = pf.read_row_group(g, columns=list(feats[t]))
                for name in feats[t]:
                    col = table.column(name)
                    if pa.types.is_list(col.type):
                        col = pc.list_flatten(col)
                    ids = col.drop_null().to_numpy(zero_copy_only=False).astype(np.int64)
                    if len(ids) * 16 < len(total):  # few ids, a large table: O(ids), not O(rows)
                        u, c = np.unique(ids, return_counts=True)
                        total[u] += c
                    else:
                        total += np.bincount(ids, minlength=len(total))[:len(total)]
        used = np.flatnonzero(total)
        out.append((used.astype(np.int64), total[used]))
    return out


def save_row_counts(counts: Sequence[tuple[np.ndarray, np.ndarray]], names: Sequence[str],
                    path: str | os.PathLike) -> str:
    table = pa.table({
        "table": pa.array(np.concatenate([np.full(len(r), n, dtype=object)
                                          for n, (r, _) in zip(names, counts)] or
                                         [np.zeros(0, object)]), pa.string()),
        "row": pa.array(np.concatenate([r for r, _ in counts] or [np.zeros(0, np.int64)]),
                        pa.int64()),
        "count": pa.array(np.concatenate([c for _, c in counts] or [np.zeros(0, np.int64)]),
                          pa.int64())})
    pq.write_table(table, path)
    return str(path)


def load_row_counts(path: str | os.PathLike, names: Sequence[str]
                    ) -> list[tuple[np.ndarray, np.ndarray]]:
    """``save_row_counts``'s file -> per table of ``names``, (rows, counts)."""
    t = pq.read_table(path)
    which = t.column("table").to_numpy(zero_copy_only=False)
    rows, counts = t.column("row").to_numpy(), t.column("count").to_numpy()
    return [(rows[which == n], counts[which == n]) for n in names]


def sparse_tables(sizes: Sequence[int], used: Sequence[int], factor: float = 10.0
                  ) -> list[int]:
    """The tables (indices) with more than ``factor`` x as many rows as the train split's ids
    use."""
    return [t for t, (r, u) in enumerate(zip(sizes, used)) if r > factor * max(int(u), 1)]


# --- routing, in the train split's loader ----------------------------------------------------------
def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def row_keys(seed: int, rows: np.ndarray) -> np.ndarray:
    """The first half of ``route_uniform``: one uint64 per row number (a row's ids share it)."""
    with np.errstate(over="ignore"):
        s = _mix(np.array([np.uint64(int(seed) % (1 << 64))]))
        return _mix(s ^ np.asarray(rows).astype(np.uint64))


def _uniform(keys: np.ndarray, features: np.ndarray, places: np.ndarray | None) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = np.asarray(features).astype(np.uint64) << np.uint64(32)
        if places is not None:
            x = x | np.asarray(places).astype(np.uint64)
        h = _mix(keys ^ x)
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def route_uniform(seed: int, rows: np.ndarray, features: np.ndarray,
                  places: np.ndarray) -> np.ndarray:
    """A number in [0, 1) per id occurrence, a hash of (seed, the row's number, the feature's
    index, the id's place in its bag): ``mix(mix(mix(seed) ^ row) ^ (feature << 32 | place))``
    with splitmix64's finalizer ``mix``, the same numbers on any machine."""
    return _uniform(row_keys(seed, rows), features, places)


class UnknownRouter:
    """Routes a share of the train split's ids to their table's unknown row (module
    docstring). ``counts``: per table, (rows, counts) as ``count_train_rows`` gives them."""

    def __init__(self, fitted: FittedSchema, counts: Sequence[tuple[np.ndarray, np.ndarray]],
                 k: float, seed: int):
        self.keys = fitted.sparse_names
        self.k, self.seed = float(k), int(seed)
        has_unknown = unknown_tables(fitted)
        tables = np.asarray(fitted.feature_tables(), np.int64)
        self.routed = np.asarray([has_unknown[t] for t in tables], bool)
        offsets = np.concatenate([[0], np.cumsum(fitted.table_rows)]).astype(np.int64)
        self.feature_offset = offsets[tables]  # each feature's table's first global row
        total = int(offsets[-1])
        glob = np.concatenate([offsets[t] + r for t, (r, _) in enumerate(counts)] or
                              [np.zeros(0, np.int64)]).astype(np.int64)
        n = np.concatenate([c for _, c in counts] or [np.zeros(0, np.int64)]).astype(np.int64)
        if total <= DENSE_LOOKUP_ROWS:  # a count per row of every table: one gather
            self.dense: np.ndarray | None = np.zeros(total, np.float32)
            self.dense[glob] = n
        else:  # the rows the split holds, sorted: a binary search each
            order = np.argsort(glob, kind="stable")
            self.dense, self.sorted_rows = None, glob[order]
            self.sorted_counts = n[order].astype(np.float64)

    def _counts(self, glob: np.ndarray) -> np.ndarray:
        if self.dense is not None:
            return self.dense[glob]
        if not len(self.sorted_rows):
            return np.zeros(glob.shape, np.float64)
        pos = np.minimum(np.searchsorted(self.sorted_rows, glob), len(self.sorted_rows) - 1)
        return np.where(self.sorted_rows[pos] == glob, self.sorted_counts[pos], 0.0)

    def mask(self, ids: np.ndarray, keys: np.ndarray, features: np.ndarray,
             places: np.ndarray | None) -> np.ndarray:
        """Which of these id occurrences go to the unknown row (``keys``: their rows'
        ``row_keys``; every array of one shape, or broadcasting to it). An id the counts never
        saw (the data changed since) is left alone."""
        n = self._counts(self.feature_offset[features] + ids)
        u = _uniform(keys, features, places)
        return self.routed[features] & (ids != UNKNOWN_ROW) & (n > 0) & (u * n < self.k)

    def __call__(self, cols):
        """A row group's columns (``recscale.data.loader.Columns`` or ``BagColumns``) with the
        routed ids replaced by the unknown row (a new object; the input is not changed)."""
        import dataclasses

        if tuple(cols.keys) != tuple(self.keys):
            raise ValueError(f"the train split's sparse columns {list(cols.keys)} are not the "
                             f"fitted schema's {list(self.keys)}")
        n, m = len(cols), len(self.keys)
        keys = row_keys(self.seed, cols.row)
        if hasattr(cols, "values"):  # bags: values row-major, (row, feature) segments
            seg = cols.lengths.reshape(-1)
            feat = np.repeat(np.tile(np.arange(m), n), seg)
            starts = np.zeros(len(seg), np.int64)
            np.cumsum(seg[:-1], out=starts[1:])
            place = np.arange(len(cols.values)) - np.repeat(starts, seg)
            hit = self.mask(cols.values, np.repeat(keys, cols.lengths.sum(axis=1)), feat, place)
            if not hit.any():
                return cols
            return dataclasses.replace(cols, values=np.where(hit, UNKNOWN_ROW, cols.values))
        hit = self.mask(cols.ids, keys[:, None], np.arange(m)[None, :], None) & cols.present
        if not hit.any():
            return cols
        return dataclasses.replace(cols, ids=np.where(hit, UNKNOWN_ROW, cols.ids))


def router_for(manifest: dict, cfg: UnknownIdsConfig, seed: int) -> UnknownRouter | None:
    """The train split's router of a dataset's manifest, or None (routing off, or a dataset
    preprocessed without row counts: a warning says so)."""
    if cfg.routing == "off":
        return None
    fitted = FittedSchema.of(manifest)
    if not any(unknown_tables(fitted)):
        return None
    path = manifest.get("row_counts_path")
    if not path or not Path(path).exists():
        import logging

        logging.getLogger(__name__).warning(
            "train.unknown_ids.routing=%s: the dataset has no row counts (%s); no id is routed "
            "to the unknown row. Preprocess it again to write them", cfg.routing,
            path or "the manifest names none")
        return None
    return UnknownRouter(fitted, load_row_counts(path, fitted.table_names), cfg.k, seed)
