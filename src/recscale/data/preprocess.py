"""Criteo TSV -> parquet splits ready for training; and the engine switch of a table of the
user's own (``preprocess_table``).

Dense counts: missing -> 0, negatives clamped to 0, then log1p (float32). Categorical 8-hex ids
(``ids``): ``hash``, the 32-bit id modulo the feature's table size, or ``vocab``, the id's row in a
frequency-thresholded vocabulary built from the training rows (``recscale.data.vocab``; tables
sized from it). Either way int64; a missing id stays null and becomes an empty bag in the batch.
Two engines write the same splits (``engine``): ``pyarrow`` (worker processes on this host, here)
and ``spark`` (``recscale.data.spark_preprocess``, on any Spark cluster); what both write (the
config, the split writers, the row accounting, the manifest) is ``recscale.data.processed``. Rows keep their global row number (``row``: 0-based over the input files, in
order), so every row of the output traces back to a line of the input and the splits can be
audited. Splits follow row order (Criteo convention: later rows are later in time).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from recscale.data.criteo import (
    RejectedRowsError,
    RejectLog,
    count_lines,
    read_criteo_tsv,
)
from recscale.data.processed import (  # noqa: F401  (SPLITS, PreprocessConfig, load_manifest ...: re-exported, the API)
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    SPLITS,
    FileResult,
    PreprocessConfig,
    PreprocessReport,
    SplitWriter,
    finish_preprocess,
    load_manifest,
    merge_rejects,
    prepare_output,
    resolve_vocabulary,
    write_split_rows,
)
from recscale.data.schema import FeatureSchema, criteo_sparse_names
from recscale.data.spark_preprocess import preprocess_criteo_spark
from recscale.data.spark_table import preprocess_table_spark
from recscale.data.splits import Splitter, TimeSplit, check_criteo_splits
from recscale.data.table_preprocess import preprocess_table_pyarrow
from recscale.data.table_source import check_columns, source_files
from recscale.data.vocab import IdCounter, Vocabulary

log = logging.getLogger(__name__)


def _preprocess_file(index: int, path: str, offset: int, bounds: np.ndarray, total: int,
                     table_sizes: np.ndarray, vocab: Vocabulary | None, cfg: PreprocessConfig,
                     out: Path, progress: Callable[[int, int], None] | None = None) -> FileResult:
    """One input file -> its part of each split (``<split>/part-<index>.parquet``), streaming."""
    try:  # hand freed chunk memory back at once, so peak RSS tracks the chunk, not the file
        pa.jemalloc_set_decay_ms(0)
    except (NotImplementedError, pa.ArrowNotImplementedError, AttributeError):
        pass
    rejects_path = out / "rejects" / f"part-{index:05d}.tsv"
    rejects = RejectLog(path=rejects_path, total_lines=total, max_fraction=cfg.max_reject_fraction)
    writers = {s: SplitWriter(out / s / f"part-{index:05d}.parquet", cfg.row_group_size,
                               cfg.compression, keep_empty=False) for s in SPLITS}
    present = np.zeros(len(criteo_sparse_names()), dtype=np.int64)
    written = 0
    try:
        for block in read_criteo_tsv(path, rejects, cfg.chunk_bytes):
            rows = write_split_rows(block, offset, table_sizes, vocab, bounds, writers, present)
            written += len(block)
            if progress:
                progress(int(rows[-1]) + 1, total)
    finally:
        rejects.close()
        for w in writers.values():
            w.close()
    files = {s: (str(w.path), w.rows, w.row_groups) for s, w in writers.items() if w.rows}
    return FileResult(index, files, written, rejects.count, dict(rejects.by_reason), present)


def _run_jobs(jobs, cfg, line_counts, total, results, progress) -> None:
    if cfg.workers > 1 and len(jobs) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=min(cfg.workers, len(jobs)),
                                 mp_context=mp.get_context("spawn")) as pool:
            futures = [pool.submit(_preprocess_file, *job) for job in jobs]
            done_lines = 0
            for fut in as_completed(futures):
                res = fut.result()  # re-raises a worker's RejectedRowsError
                results.append(res)
                done_lines += line_counts[res.index]
                if progress:
                    progress(done_lines, total)
    else:
        for job in jobs:
            results.append(_preprocess_file(*job, progress=progress))


def _count_train_ids(files: Sequence[str | os.PathLike], offsets: np.ndarray,
                     train_ends: Sequence[int], chunk_bytes: int) -> IdCounter:
    """Per-feature id counts over each file's rows before its ``train_ends`` (rejected lines
    count nothing)."""
    counter = IdCounter(len(criteo_sparse_names()))
    for f, offset, train_end in zip(files, offsets, train_ends):
        if offset >= train_end:
            continue
        quiet = RejectLog(path=None, max_fraction=1.0)  # the main pass records the rejects
        # the file's lines from train_end on are not read: their ids count nothing
        for block in read_criteo_tsv(f, quiet, chunk_bytes, before_line=train_end - offset + 1):
            keep = block.line - 1 + offset < train_end
            counter.add(block.sparse[keep], block.sparse_present[keep])
    return counter


def preprocess_criteo(
    files: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    cfg: PreprocessConfig,
    table_size_hint: Sequence[int] | None = None,
    progress: Callable[[int, int], None] | None = None,
    spark=None,
) -> PreprocessReport:
    """Read Criteo TSV ``files`` (in time order, e.g. one per day) and write the parquet splits
    under ``out_dir``, ``cfg.workers`` files at a time in separate processes (``engine: pyarrow``)
    or on Spark (``engine: spark``; ``spark``: the SparkSession, else one from the defaults).

    Memory is bounded per worker by the chunk size, whatever the file sizes. Raises
    RejectedRowsError when more than ``cfg.max_reject_fraction`` of the lines cannot be parsed;
    every rejected line is listed in ``out_dir/rejects.tsv`` with its reason either way.
    ``progress(lines_done, lines_total)`` is called as work completes.
    """
    if cfg.engine == "spark":
        return preprocess_criteo_spark(files, out_dir, cfg, table_size_hint, progress, spark=spark)
    check_criteo_splits(cfg.splits)
    out = prepare_output(out_dir)
    line_counts = [count_lines(f) for f in files]
    total = int(sum(line_counts))
    splitter = Splitter(cfg.splits, total)
    bounds = [splitter.row_bounds(str(f)) for f in files]
    offsets = np.concatenate([[0], np.cumsum(line_counts)[:-1]]).astype(np.int64)
    vocab, vocab_path = None, None
    if cfg.ids == "vocab":
        counter = _count_train_ids(files, offsets, [int(b[0]) for b in bounds], cfg.chunk_bytes)
        vocab, vocab_path = resolve_vocabulary(counter, cfg, out)
        table_sizes = np.asarray(vocab.table_sizes, dtype=np.int64)
    else:
        table_sizes = np.asarray(cfg.resolve_table_sizes(table_size_hint), dtype=np.int64)
    jobs = [(i, str(f), int(o), bounds[i], total, table_sizes, vocab, cfg, out)
            for i, (f, o) in enumerate(zip(files, offsets))]
    results: list[FileResult] = []
    rejects_path = out / "rejects.tsv"
    try:
        _run_jobs(jobs, cfg, line_counts, total, results, progress)
    except RejectedRowsError as exc:
        merge_rejects(out, rejects_path)
        raise RejectedRowsError(f"{exc} All rejected lines so far: {rejects_path}") from None
    return finish_preprocess(out, files, cfg, total, results, table_sizes, vocab_path,
                             splitter=splitter)


def preprocess_table(files: Sequence[str | os.PathLike], out_dir: str | os.PathLike,
                     cfg: PreprocessConfig, schema: FeatureSchema, delimiter: str = ",",
                     progress: Callable[[int, int], None] | None = None,
                     spark=None) -> PreprocessReport:
    """Read ``files`` (parquet files, directories of them, or delimited text with a header; in
    time order) through the feature ``schema`` and write the parquet splits, the rejects and the
    manifest under ``out_dir`` (``recscale.data.table_preprocess``), on this host
    (``engine: pyarrow``) or on Spark (``engine: spark``, ``recscale.data.spark_table``; ``spark``:
    the SparkSession, else one from the defaults). Every file's columns are checked before any
    work. ``progress(rows_done, rows_total)``."""
    files = source_files(files)
    check_columns(files, schema, delimiter,
                  cfg.splits.by if isinstance(cfg.splits, TimeSplit) else None)
    if cfg.engine == "spark":
        return preprocess_table_spark(files, out_dir, cfg, schema, delimiter, progress, spark)
    return preprocess_table_pyarrow(files, out_dir, cfg, schema, delimiter, progress)
