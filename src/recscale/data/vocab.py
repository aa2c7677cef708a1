"""Frequency-thresholded id vocabularies: each categorical feature's raw integer ids -> contiguous
embedding rows.

Counts come from the training rows only. An id seen at least ``min_count`` times gets a row; the
most frequent come first (ties: smaller id first), at most ``max_size`` of them. Row 0 is the
out-of-vocabulary (OOV) row that every other id shares, so feature j's table has
``len(ids_j) + 1`` rows. A missing id stays missing (an empty bag), as with hashing.

Growth is append-only (scheduled retraining): ids of the existing vocabulary keep their rows (and
add the new counts to theirs); new ids that pass ``min_count`` on the new data get the rows after
the existing ones, most frequent first, up to ``max_size``. A warm-started model's rows therefore
stay aligned; its tables only grow.

The artifact is a parquet file with one row per (feature, id): ``feature`` (its name), ``id``
(int64, the raw id; a string id's stable hash), ``index`` (int64, >= 1) and ``count`` (int64). Both preprocessing
engines build it with :func:`build_vocabulary` from per-feature counts, so they agree exactly.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recscale.config import Validated, check

OOV_INDEX = 0
VOCAB_NAME = "vocabulary.parquet"


class VocabularyMismatch(ValueError):
    """A vocabulary file does not fit the data: its features or its columns differ."""


@dataclass(frozen=True)
class VocabConfig(Validated):
    """The ``preprocess.vocab`` block (used when ``preprocess.ids`` is ``vocab``)."""

    min_count: int = 1  # ids seen fewer times in the training rows share the OOV row
    max_size: int | None = None  # most ids per feature (the most frequent kept); null: no cap
    # an existing vocabulary to grow append-only (retraining); null: build a fresh one
    path: str | None = None

    def validate(self, prefix: str = "preprocess.vocab") -> None:
        check(self.min_count >= 1, f"{prefix}.min_count", self.min_count, ">= 1")
        check(self.max_size is None or self.max_size >= 1, f"{prefix}.max_size", self.max_size,
              "null or >= 1")


def vocab_schema() -> pa.Schema:
    return pa.schema([pa.field("feature", pa.string(), nullable=False),
                      pa.field("id", pa.int64(), nullable=False),
                      pa.field("index", pa.int64(), nullable=False),
                      pa.field("count", pa.int64(), nullable=False)])


@dataclass
class Vocabulary:
    """Per feature: ``ids[j]`` in index order (``ids[j][k]`` has row ``k + 1``) and their counts."""

    ids: list[np.ndarray]
    counts: list[np.ndarray]
    features: tuple[str, ...]

    def __post_init__(self) -> None:
        self.ids = [np.asarray(a, dtype=np.int64) for a in self.ids]
        self.counts = [np.asarray(c, dtype=np.int64) for c in self.counts]
        order = [np.argsort(a, kind="stable") for a in self.ids]
        self._sorted = [a[o] for a, o in zip(self.ids, order)]
        self._rows = [(o + 1).astype(np.int64) for o in order]

    @property
    def table_sizes(self) -> tuple[int, ...]:
        return tuple(len(a) + 1 for a in self.ids)

    def lookup(self, j: int, values: np.ndarray) -> np.ndarray:
        """Raw ids of feature ``j`` -> rows (OOV_INDEX for ids not in the vocabulary)."""
        keys, rows = self._sorted[j], self._rows[j]
        v = np.asarray(values, dtype=np.int64)
        if len(keys) == 0:
            return np.zeros(len(v), dtype=np.int64)
        pos = np.minimum(np.searchsorted(keys, v), len(keys) - 1)
        return np.where(keys[pos] == v, rows[pos], OOV_INDEX)

    def to_table(self) -> pa.Table:
        feats = np.concatenate([np.full(len(a), i, dtype=np.int32) for i, a in enumerate(self.ids)]
                               or [np.zeros(0, np.int32)])
        names = pa.array(np.asarray(self.features, dtype=object)[feats], pa.string())
        index = np.concatenate([np.arange(1, len(a) + 1, dtype=np.int64) for a in self.ids]
                               or [np.zeros(0, np.int64)])
        return pa.Table.from_arrays(
            [names, pa.array(np.concatenate(self.ids or [np.zeros(0, np.int64)])), pa.array(index),
             pa.array(np.concatenate(self.counts or [np.zeros(0, np.int64)]))],
            schema=vocab_schema())

    def save(self, path: str | os.PathLike) -> str:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(self.to_table(), p)
        return str(p)


def vocabulary_table(path: str | os.PathLike | None) -> pa.Table:
    """The vocabulary artifact at ``path`` as a table (feature, id, index, count); with no path
    (``ids: hash``) an empty table of the same columns, so a run always says which it had."""
    if path is None:
        return vocab_schema().empty_table()
    return pq.read_table(path, schema=vocab_schema())


def load_vocabulary(path: str | os.PathLike, features: Sequence[str]) -> Vocabulary:
    """Read a vocabulary artifact; raises VocabularyMismatch naming what does not fit."""
    table = pq.read_table(path)
    missing_cols = [c for c in vocab_schema().names if c not in table.column_names]
    if missing_cols:
        raise VocabularyMismatch(f"vocabulary {path}: missing column(s) {', '.join(missing_cols)}; "
                                 f"expected columns {', '.join(vocab_schema().names)}")
    names = table.column("feature").to_numpy(zero_copy_only=False)
    found = set(names.tolist())
    unexpected = sorted(found - set(features))
    if unexpected:
        raise VocabularyMismatch(
            f"vocabulary {path} has feature(s) {', '.join(unexpected)} that the data does not "
            f"have; the data's categorical features are {', '.join(features)}")
    ids, counts = [], []
    idx = table.column("index").to_numpy()
    all_ids = table.column("id").to_numpy()
    all_counts = table.column("count").to_numpy()
    for f in features:
        sel = names == f
        order = np.argsort(idx[sel], kind="stable")
        got = idx[sel][order]
        if not np.array_equal(got, np.arange(1, len(got) + 1)):
            raise VocabularyMismatch(f"vocabulary {path}: feature {f}'s indices are not 1..{len(got)}")
        ids.append(all_ids[sel][order])
        counts.append(all_counts[sel][order])
    return Vocabulary(ids, counts, tuple(features))


class IdCounter:
    """Per-feature id counts, accumulated chunk by chunk (memory: the distinct ids)."""

    def __init__(self, num_features: int):
        self.ids = [np.zeros(0, np.int64) for _ in range(num_features)]
        self.counts = [np.zeros(0, np.int64) for _ in range(num_features)]

    def add(self, sparse: np.ndarray, present: np.ndarray) -> None:
        for j in range(sparse.shape[1]):
            v = sparse[present[:, j], j].astype(np.int64)
            u, c = np.unique(v, return_counts=True)
            self.merge(j, u, c)

    def merge(self, j: int, ids: np.ndarray, counts: np.ndarray) -> None:
        allv = np.concatenate([self.ids[j], ids])
        allc = np.concatenate([self.counts[j], counts])
        u, inv = np.unique(allv, return_inverse=True)
        self.ids[j] = u
        self.counts[j] = np.bincount(inv, weights=allc, minlength=len(u)).astype(np.int64)


def build_vocabulary(counter: IdCounter, cfg: VocabConfig,
                     existing: Vocabulary | None, features: Sequence[str]) -> Vocabulary:
    """Counts -> vocabulary (module docstring: thresholds, order, append-only growth)."""
    ids, counts = [], []
    for j in range(len(features)):
        u, c = counter.ids[j], counter.counts[j]
        old_ids = existing.ids[j] if existing is not None else np.zeros(0, np.int64)
        old_counts = existing.counts[j] if existing is not None else np.zeros(0, np.int64)
        known = np.isin(u, old_ids)
        # existing ids keep their rows; their counts grow by what this data adds
        add = np.zeros(len(old_ids), np.int64)
        if known.any():
            order = np.argsort(old_ids, kind="stable")
            where = order[np.searchsorted(old_ids[order], u[known])]
            add[where] = c[known]
        new_u, new_c = u[~known], c[~known]
        keep = new_c >= cfg.min_count
        new_u, new_c = new_u[keep], new_c[keep]
        rank = np.lexsort((new_u, -new_c))  # most frequent first; ties: smaller id first
        room = len(new_u) if cfg.max_size is None else max(0, cfg.max_size - len(old_ids))
        rank = rank[:room]
        ids.append(np.concatenate([old_ids, new_u[rank]]))
        counts.append(np.concatenate([old_counts + add, new_c[rank]]))
    return Vocabulary(ids, counts, tuple(features))
