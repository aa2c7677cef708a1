"""The processed dataset as both preprocessing engines write it (``recscale.data.preprocess``:
pyarrow on this host, ``recscale.data.spark_preprocess`` on Spark): the ``preprocess`` block's
config, a block of parsed Criteo rows to parquet rows (through ``recscale.data.encode``, the
encoder every path shares), the split writers, the row accounting and the manifest
(``load_manifest`` reads it back)."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recscale.config import ConfigError, Validated, check, check_choice, to_dict
from recscale.data.criteo import (
    CriteoBlock,
    RejectedRowsError,
    criteo_rows,
)
from recscale.data.encode import Parsed, RowIds, encode, output_schema
from recscale.data.schema import FittedSchema, criteo_schema, criteo_sparse_names
from recscale.data.splits import (  # noqa: F401  (split_bounds: re-exported)
    SPLITS,
    FileSplit,
    Splitter,
    TimeSplit,
    check_fractions,
    split_bounds,
)
from recscale.data.unknown_ids import (
    ROW_COUNTS_NAME,
    count_train_rows,
    save_row_counts,
    sparse_tables,
)
from recscale.data.vocab import (
    VOCAB_NAME,
    IdCounter,
    VocabConfig,
    Vocabulary,
    build_vocabulary,
    load_vocabulary,
)

log = logging.getLogger(__name__)

MANIFEST_NAME = "_manifest.json"
MANIFEST_FORMAT = "recscale-criteo-parquet/1"


@dataclass(frozen=True)
class PreprocessConfig(Validated):
    # where the parquet splits, the manifest and the rejects file go
    output_dir: str = "data/05_model_input/criteo_parquet"
    # Criteo TSV: one table size per id feature of the preset; null -> hash_size_multiplier x the
    # known cardinality (synthetic data) capped at max_table_size, or max_table_size when
    # cardinalities are unknown
    table_sizes: tuple[int, ...] | None = None
    # the most rows a table sized from the data gets (a schema's hashed table without rows,
    # the Criteo preset's)
    max_table_size: int = 1_000_000
    # hashing ids into a table as large as the vocabulary makes ~37% of ids share a row;
    # 4x makes it ~11%. A schema's hashed table without rows gets this x the distinct ids of
    # the train split; the Criteo preset's, this x the known cardinality
    hash_size_multiplier: float = 4.0
    # train / validation / test: fractions of the rows in row order, {by: <time column>, ...}
    # or {train: [file globs], ...} (recscale.data.splits)
    splits: tuple[float, float, float] | TimeSplit | FileSplit = (0.8, 0.1, 0.1)
    row_group_size: int = 65536
    chunk_bytes: int = 1 << 25
    max_reject_fraction: float = 0.01
    compression: str = "zstd"
    workers: int = 1  # input files processed in parallel (separate processes)
    # multi-hot input: a row whose bag holds more ids than this is rejected
    max_bag_size: int = 256
    # pyarrow: worker processes on this host; spark: the SparkSession's cluster (spark.yml)
    engine: Literal["pyarrow", "spark"] = "pyarrow"
    # hash: id modulo the table size; vocab: frequency-thresholded vocabulary (``vocab`` block)
    ids: Literal["hash", "vocab"] = "hash"
    vocab: VocabConfig = field(default_factory=VocabConfig)

    def validate(self, prefix: str = "preprocess") -> None:
        if self.table_sizes is not None:
            n = len(criteo_sparse_names())
            check(len(self.table_sizes) == n and all(t >= 1 for t in self.table_sizes),
                  f"{prefix}.table_sizes", self.table_sizes, f"{n} positive integers")
        check(self.max_table_size >= 1, f"{prefix}.max_table_size", self.max_table_size, ">= 1")
        check(self.hash_size_multiplier >= 1, f"{prefix}.hash_size_multiplier",
              self.hash_size_multiplier, ">= 1")
        if isinstance(self.splits, tuple):
            check_fractions(self.splits, f"{prefix}.splits")
        check(self.row_group_size >= 1, f"{prefix}.row_group_size", self.row_group_size, ">= 1")
        check(self.chunk_bytes >= 1024, f"{prefix}.chunk_bytes", self.chunk_bytes, ">= 1024")
        check(0 <= self.max_reject_fraction <= 1, f"{prefix}.max_reject_fraction",
              self.max_reject_fraction, "a fraction in [0, 1]")
        check(self.compression in ("zstd", "snappy", "gzip", "none"), f"{prefix}.compression",
              self.compression, "one of zstd, snappy, gzip, none")
        check(self.workers >= 1, f"{prefix}.workers", self.workers, ">= 1")
        check(self.max_bag_size >= 1, f"{prefix}.max_bag_size", self.max_bag_size, ">= 1")
        check_choice(f"{prefix}.engine", self.engine, ("pyarrow", "spark"))
        check_choice(f"{prefix}.ids", self.ids, ("hash", "vocab"))
        if self.ids == "vocab" and self.table_sizes is not None:
            raise ConfigError(f"{prefix}.table_sizes={list(self.table_sizes)} cannot be used with "
                              f"{prefix}.ids='vocab': the vocabulary sizes the tables (set it to null)")

    def resolve_table_sizes(self, hint: Sequence[int] | None = None) -> tuple[int, ...]:
        if self.table_sizes is not None:
            return tuple(self.table_sizes)
        if hint is not None:
            return tuple(min(self.max_table_size, math.ceil(h * self.hash_size_multiplier))
                         for h in hint)
        return (self.max_table_size,) * len(criteo_sparse_names())


def criteo_fitted(table_sizes: Sequence[int], ids: str = "hash") -> FittedSchema:
    """The Criteo preset fitted to its table sizes (``ids``: hash or vocab)."""
    return FittedSchema.fit(criteo_schema(ids=ids), [int(t) for t in table_sizes])


def parquet_schema() -> pa.Schema:
    """The Criteo preset's processed columns."""
    return output_schema(criteo_fitted([1] * len(criteo_sparse_names())))


def transform_block(block: CriteoBlock, row_offset: int, table_sizes: np.ndarray,
                    vocab: Vocabulary | None = None) -> tuple[pa.Table, np.ndarray]:
    """Parsed Criteo rows -> model-ready columns, through the one encoder every path writes with
    (``recscale.data.encode``): the preset's transforms, ids hashed or looked up in ``vocab``;
    -> (table, ids written per feature)."""
    fitted = criteo_fitted(table_sizes, "hash" if vocab is None else "vocab")
    return encode(criteo_parsed(block), fitted, vocab, block.line - 1 + row_offset)


def criteo_parsed(block: CriteoBlock) -> Parsed:
    """The Criteo reader's rows as the encoder takes them (every row passed the reader)."""
    n = len(block)
    present = block.sparse_present
    return Parsed(
        n, block.label.astype(np.int8, copy=False),
        [(block.dense[:, j].astype(np.float64), block.dense_present[:, j])
         for j in range(block.dense.shape[1])],
        [RowIds(present[:, j], block.sparse[:, j].astype(np.int64))
         for j in range(block.sparse.shape[1])],
        np.zeros(n, bool))


def criteo_table_parsed(t: pa.Table, labels: bool) -> Parsed:
    """Rows of Criteo's columns in a table (a served request, a scored table's block) parsed by
    the Criteo TSV reader, its rules and its reasons (``criteo.criteo_rows``), as the encoder
    takes them: every row in place, the ones it rejects marked with their reason."""
    block, reasons = criteo_rows(t, labels)
    n, good = t.num_rows, block.line - 1
    full = Parsed(n, np.zeros(n, np.int8), [], [], np.ones(n, bool), dict(reasons))
    full.bad[good] = False
    full.label[good] = block.label
    for j in range(block.dense.shape[1]):
        x, present = np.zeros(n), np.zeros(n, bool)
        x[good], present[good] = block.dense[:, j], block.dense_present[:, j]
        full.dense.append((x, present))
    for j in range(block.sparse.shape[1]):
        ids, present = np.zeros(n, np.int64), np.zeros(n, bool)
        ids[good], present[good] = block.sparse[:, j], block.sparse_present[:, j]
        full.keys.append(RowIds(present, ids))
    return full


class SplitWriter:
    """Buffers rows and writes parquet row groups of exactly ``row_group_size`` (last may be short)."""

    def __init__(self, path: Path, row_group_size: int, compression: str, keep_empty: bool = True,
                 schema: pa.Schema | None = None):
        self.keep_empty = keep_empty
        self.schema = schema if schema is not None else parquet_schema()
        self.path = path
        self.row_group_size = row_group_size
        self.compression = None if compression == "none" else compression
        self.pending: list[pa.Table] = []
        self.n_pending = 0
        self.rows = 0
        self.row_groups = 0
        self.writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self.pending.append(table)
        self.n_pending += table.num_rows
        while self.n_pending >= self.row_group_size:
            self._flush(self.row_group_size)

    def _flush(self, n: int) -> None:
        merged = pa.concat_tables(self.pending)
        head, tail = merged.slice(0, n), merged.slice(n)
        if self.writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(self.path, self.schema, compression=self.compression)
        self.writer.write_table(head, row_group_size=n)
        self.rows += head.num_rows
        self.row_groups += 1
        self.pending = [tail] if tail.num_rows else []
        self.n_pending = tail.num_rows

    def close(self) -> None:
        if self.n_pending:
            self._flush(self.n_pending)
        if self.writer is not None:
            self.writer.close()
        elif self.keep_empty:  # an empty split still gets a readable file
            self.path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(self.schema.empty_table(), self.path)


@dataclass(frozen=True)
class PreprocessReport:
    out_dir: str
    manifest_path: str
    lines_read: int
    rows_written: int
    rows_rejected: int
    rejects_path: str
    rejects_by_reason: dict
    split_rows: dict
    table_sizes: tuple[int, ...]
    pooling_factors: tuple[float, ...]
    vocabulary_path: str | None = None

    def to_dict(self) -> dict:
        return to_dict(self)


@dataclass
class FileResult:
    index: int
    split_files: dict  # split -> (path, rows, row_groups) or absent
    written: int
    rejected: int
    by_reason: dict
    present: np.ndarray


def write_split_rows(block: CriteoBlock, offset: int, table_sizes: np.ndarray,
                     vocab: Vocabulary | None, bounds: np.ndarray, writers: dict,
                     present: np.ndarray) -> np.ndarray:
    """One parsed block -> its rows appended to each split's writer (``bounds``: where each split
    starts, in global rows), its present ids counted into ``present``; -> the block's rows. Both
    engines write through this."""
    table, ids = transform_block(block, offset, table_sizes, vocab)
    rows = block.line - 1 + offset
    present += ids
    cut = np.searchsorted(rows, bounds, side="left")
    lo = 0
    for split, hi in zip(SPLITS, cut):
        writers[split].write(table.slice(lo, hi - lo))
        lo = hi
    return rows


def merge_rejects(out: Path, rejects_path: Path) -> None:
    """The per-file rejects, in input order, into one rejects.tsv."""
    parts = sorted((out / "rejects").glob("part-*.tsv"))
    with open(rejects_path, "w", encoding="utf-8") as fh:
        fh.write("file\tline\treason\ttext\n")
        for part_path in parts:
            with open(part_path, encoding="utf-8") as part:
                next(part, None)
                fh.writelines(part)
            os.remove(part_path)


def prepare_output(out_dir: str | os.PathLike) -> Path:
    """The output folder, without parts of an earlier run (a rerun must not mix them in)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in list(out.glob("*/part-*.parquet")) + list(out.glob("rejects/part-*.tsv")):
        stale.unlink()
    return out


def resolve_vocabulary(counter: IdCounter, cfg: PreprocessConfig, out: Path) -> tuple[Vocabulary, str]:
    """Counts of the training rows -> the vocabulary (grown from ``cfg.vocab.path`` if given),
    saved as ``out/vocabulary.parquet``."""
    existing = load_vocabulary(cfg.vocab.path, criteo_sparse_names()) if cfg.vocab.path else None
    vocab = build_vocabulary(counter, cfg.vocab, existing, criteo_sparse_names())
    path = vocab.save(out / VOCAB_NAME)
    log.info("vocabulary: %d ids over %d features (min_count=%d, max_size=%s%s) -> %s",
             sum(len(a) for a in vocab.ids), len(vocab.ids), cfg.vocab.min_count,
             cfg.vocab.max_size, f", grown from {cfg.vocab.path}" if existing else "", path)
    return vocab, path


def finish_preprocess(out: Path, files: Sequence[str | os.PathLike], cfg: PreprocessConfig,
                      total: int, results: list[FileResult], table_sizes: np.ndarray,
                      vocab_path: str | None = None, fitted: FittedSchema | None = None,
                      file_schema: pa.Schema | None = None,
                      splitter: Splitter | None = None) -> PreprocessReport:
    """The parts every engine wrote -> rejects.tsv, the threshold check, the row accounting and
    the manifest. ``results``: one per part, in any order (``index`` orders them by row);
    ``fitted``: the fitted schema (default: the Criteo preset's) and ``file_schema`` the parts'
    columns (default: Criteo's); ``splitter``: the split rule as resolved, recorded beside the
    config when it is a time or file split."""
    fitted = fitted or criteo_fitted(np.asarray(table_sizes).tolist(), cfg.ids)
    file_schema = file_schema if file_schema is not None else parquet_schema()
    table_sizes = np.asarray(table_sizes, dtype=np.int64)
    rejects_path = out / "rejects.tsv"
    merge_rejects(out, rejects_path)
    results = sorted(results, key=lambda r: r.index)
    n_rejected = sum(r.rejected for r in results)
    by_reason: dict[str, int] = {}
    for r in results:
        for k, v in r.by_reason.items():
            by_reason[k] = by_reason.get(k, 0) + v
    written = sum(r.written for r in results)
    if total and n_rejected > cfg.max_reject_fraction * total:
        raise RejectedRowsError(
            f"{n_rejected} of {total} input lines rejected (more than max_reject_fraction="
            f"{cfg.max_reject_fraction}); see {rejects_path} for every rejected line and its reason.")
    present = np.sum([r.present for r in results], axis=0) if results else \
        np.zeros(len(fitted.sparse_names))
    pooling = (present / max(written, 1)).round(6)
    splits = {}
    for s in SPLITS:
        parts = [r.split_files[s] for r in results if s in r.split_files]
        if not parts:  # an empty split still gets a readable file
            empty = out / s / "part-empty.parquet"
            empty.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(file_schema.empty_table(), empty)
            parts = [(str(empty), 0, 0)]
        splits[s] = {"files": [p[0] for p in parts], "rows": int(sum(p[1] for p in parts)),
                     "row_groups": int(sum(p[2] for p in parts))}
    split_rows = {s: splits[s]["rows"] for s in SPLITS}
    # the train split's ids per table row: what routing to the unknown row reads
    # (recscale.data.unknown_ids), and how many rows of each table the split uses
    row_counts = count_train_rows(splits["train"]["files"], fitted)
    row_counts_path = save_row_counts(row_counts, fitted.table_names, out / ROW_COUNTS_NAME)
    used = [len(r) for r, _ in row_counts]
    for t in sparse_tables(fitted.table_rows, used):
        log.warning("table %s has %d rows but the train split's ids use %d of them (more than "
                    "10x): give it rows in features.tables, or leave them null to size it from "
                    "the data", fitted.table_names[t], fitted.table_rows[t], used[t])
    manifest = {
        "format": MANIFEST_FORMAT,
        "source_files": [str(f) for f in files],
        "lines_read": total,
        "rows_written": written,
        "rows_rejected": n_rejected,
        "rejects_path": str(rejects_path),
        "splits": splits,
        "dense_features": list(fitted.dense_names),
        "sparse_features": list(fitted.sparse_names),
        "table_sizes": table_sizes.tolist(),
        "pooling_factors": pooling.tolist(),
        "engine": cfg.engine,
        "ids": cfg.ids,
        "vocabulary_path": vocab_path,
        "row_counts_path": row_counts_path,
        "train_rows_used": used,  # per table: its rows the train split's ids hold
        "config": to_dict(cfg),
        # the fitted schema every later stage reads (recscale.data.schema.FittedSchema)
        "schema": fitted.to_dict(),
    }
    if splitter is not None and not isinstance(cfg.splits, tuple):
        manifest["split_rule"] = splitter.record()
    if written + n_rejected != total:
        raise RuntimeError(f"row accounting failed: {written} written + {n_rejected} rejected "
                           f"!= {total} lines read")
    shutil.rmtree(out / "_history", ignore_errors=True)  # recscale.data.history's scratch
    manifest_path = out / MANIFEST_NAME
    manifest_path.write_text(json.dumps(manifest, indent=2))
    log.info("preprocessed %d lines: %d rows written (%s), %d rejected -> %s",
             total, written, split_rows, n_rejected, rejects_path)
    return PreprocessReport(
        out_dir=str(out), manifest_path=str(manifest_path), lines_read=total,
        rows_written=written, rows_rejected=n_rejected, rejects_path=str(rejects_path),
        rejects_by_reason=by_reason, split_rows=split_rows,
        table_sizes=tuple(table_sizes.tolist()), pooling_factors=tuple(pooling.tolist()),
        vocabulary_path=vocab_path,
    )


def load_manifest(path: str | os.PathLike) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    manifest = json.loads(p.read_text())
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{p} is not a recscale parquet manifest (format {manifest.get('format')!r})")
    return manifest
