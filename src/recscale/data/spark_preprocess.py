"""Criteo TSV -> the parquet splits of ``recscale.data.preprocess``, on Apache Spark.

Same input, checks, reasons, row numbers, splits, schema and manifest as the pyarrow engine, so
the loader and trainer cannot tell which engine ran. Spark schedules the work and does the global
steps; every line is parsed by the pyarrow engine's own chunk parser, so parity holds by
construction. What runs where:

1. Driver: each input file is cut into byte blocks of Spark's ``spark.sql.files.maxPartitionBytes``
   (a line belongs to the block that holds its first byte).
2. Spark tasks, one per block (``mapInArrow`` over the block numbers): count the block's lines
   (``bytes.count`` over the block's byte range, read from the file path by the task). The driver
   turns the counts into each block's first line and global ``row``, in file order, and the
   split bounds.
3. ``ids: vocab``: Spark tasks parse their blocks (:func:`recscale.data.criteo._parse_block`, the
   pyarrow reader's vectorised parser, one chunk of ``chunk_bytes`` at a time) and emit per-feature
   ``(feature, id, count)`` of their training rows as Arrow batches; a Spark ``groupBy`` (the
   shuffle) sums them and drops ids under ``min_count`` (unless already in the vocabulary); the
   rest go to the driver, where :func:`build_vocabulary` (the pyarrow engine's code) orders and
   caps them. The vocabulary reaches the tasks as a broadcast variable.
4. Spark tasks, one per block: parse the block chunk by chunk with the same parser, map ids
   (``transform_block``: hash or vocabulary) and write with the pyarrow engine's split writer:
   ``<split>/part-<block>.parquet`` in row order with row groups of exactly ``row_group_size``
   (the last of each part may be short), and ``rejects/part-<block>.tsv``. The driver merges the
   rejects and writes the manifest with the pyarrow engine's code.

All of it is batched Arrow/numpy work per chunk, never a Python call per row. Tasks open the input
files and write the output by path: both must be on storage that every executor mounts (local
disk for ``local[N]``, a shared filesystem for a cluster). Parts are per input block here and per
input file there; the rows, their order and split membership are the same. The reject threshold
is checked when every block is done (the pyarrow engine stops at the first line over it); both
raise RejectedRowsError naming the rejects file.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from recscale.data.criteo import RejectLog, _parse_block
from recscale.data.processed import (
    SPLITS,
    FileResult,
    PreprocessConfig,
    PreprocessReport,
    SplitWriter,
    finish_preprocess,
    prepare_output,
    resolve_vocabulary,
    write_split_rows,
)
from recscale.data.schema import criteo_sparse_names
from recscale.data.splits import Splitter, check_criteo_splits
from recscale.data.vocab import IdCounter, Vocabulary, load_vocabulary

log = logging.getLogger(__name__)

_DEFAULT_BLOCK_BYTES = 128 << 20  # Spark's own default for spark.sql.files.maxPartitionBytes
_RESULT_SCHEMA = ("blk long, split_files string, written long, rejected long, by_reason string, "
                  "present array<long>")


def block_chunks(path: str, start: int, end: int, chunk_bytes: int) -> Iterator[bytes]:
    """The lines whose first byte lies in ``[start, end)`` of ``path``, as chunks of whole lines
    of about ``chunk_bytes`` (each line with its newline; a last line without one gets one, as
    the pyarrow reader's chunks do)."""
    with open(path, "rb") as fh:
        pos = 0
        if start > 0:  # the first line that starts at or after ``start``
            fh.seek(start - 1)
            pos = start - 1
            while True:
                buf = fh.read(1 << 16)
                if not buf:
                    return
                i = buf.find(b"\n")
                if i >= 0:
                    pos += i + 1
                    break
                pos += len(buf)
        if pos >= end:
            return
        fh.seek(pos)
        base, rest = pos, b""  # base: the file offset of rest[0]
        while True:
            data = fh.read(chunk_bytes)
            if not data:
                break
            data = rest + data
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            if base + cut + 1 >= end:  # the block's last line ends in this chunk
                yield data[:data.find(b"\n", end - 1 - base) + 1]
                return
            yield data[:cut + 1]
            rest, base = data[cut + 1:], base + cut + 1
    if rest:
        yield rest + b"\n"


def _spark_functions():
    with warnings.catch_warnings():  # pyspark warns about pandas 3 on import; we use no pandas
        warnings.simplefilter("ignore", FutureWarning)
        from pyspark.sql import functions as F
    return F


def _block_bytes(spark) -> int:
    try:
        return int(spark._jsparkSession.sessionState().conf().filesMaxPartitionBytes())
    except Exception:  # noqa: BLE001 - a Spark without that accessor: Spark's default
        return _DEFAULT_BLOCK_BYTES


def _cut_blocks(files: Sequence[str], block_bytes: int) -> list[dict]:
    blocks = []
    for fi, f in enumerate(files):
        size = os.path.getsize(f)
        for start in range(0, size, block_bytes):
            blocks.append({"blk": len(blocks), "file": fi, "path": f, "start": start,
                           "end": min(start + block_bytes, size)})
    return blocks


def _number_blocks(blocks: list[dict], n_files: int) -> list[int]:
    """Each block's first line in its file and first global row; -> lines per file."""
    per_file = [0] * n_files
    row = 0
    for b in blocks:
        b["first_line"] = per_file[b["file"]] + 1
        b["row_base"] = row
        per_file[b["file"]] += b["n"]
        row += b["n"]
    return per_file


def _map_blocks(spark, blocks: list[dict], fn, schema: str):
    """A DataFrame of ``fn(block)``'s Arrow batches, one Spark task per block."""
    keys = ("blk", "file", "path", "start", "end", "first_line", "row_base")
    task_blocks = [{k: b[k] for k in keys if k in b} for b in blocks]

    def run(batches):
        for batch in batches:
            for k in batch.column(0).to_numpy():
                yield from fn(task_blocks[int(k)])

    ids = spark.range(0, len(blocks), 1, numPartitions=len(blocks))
    with warnings.catch_warnings():  # pyspark's pandas-version warning; no pandas used
        warnings.simplefilter("ignore", FutureWarning)
        return ids.mapInArrow(run, schema)


def _count_lines(spark, blocks: list[dict], chunk_bytes: int) -> None:
    def count(b):
        import pyarrow as pa

        n = sum(c.count(b"\n") for c in block_chunks(b["path"], b["start"], b["end"], chunk_bytes))
        yield pa.RecordBatch.from_pydict({"blk": [b["blk"]], "n": [n]})

    got = {int(r["blk"]): int(r["n"])
           for r in _map_blocks(spark, blocks, count, "blk long, n long").collect()}
    if len(got) != len(blocks):
        raise RuntimeError(f"spark: {len(got)} of {len(blocks)} blocks counted their lines")
    for b in blocks:
        b["n"] = got[b["blk"]]


def _count_ids(spark, F, blocks: list[dict], train_ends: list[int], cfg: PreprocessConfig,
               existing: Vocabulary | None) -> IdCounter:
    """Per-feature id counts over the training rows (tasks count, Spark's shuffle sums); ids
    under min_count (and not already in the vocabulary) are dropped in Spark, the rest collected."""
    chunk_bytes = cfg.chunk_bytes

    def count(b):
        import pyarrow as pa

        counter = IdCounter(len(criteo_sparse_names()))
        quiet = RejectLog(path=None, max_fraction=1.0)  # the writing pass records the rejects
        line = b["first_line"]
        offset = b["row_base"] - b["first_line"] + 1
        for buf in block_chunks(b["path"], b["start"], b["end"], chunk_bytes):
            parsed = _parse_block(buf, line, b["path"], quiet)
            line += buf.count(b"\n")
            keep = parsed.line - 1 + offset < train_ends[b["file"]]
            counter.add(parsed.sparse[keep], parsed.sparse_present[keep])
        f = np.concatenate([np.full(len(a), j, np.int32) for j, a in enumerate(counter.ids)])
        yield pa.RecordBatch.from_pydict({"f": f, "id": np.concatenate(counter.ids),
                                          "n": np.concatenate(counter.counts)})

    train = [b for b in blocks if b["row_base"] < train_ends[b["file"]]]
    if not train:
        return IdCounter(len(criteo_sparse_names()))
    counts = (_map_blocks(spark, train, count, "f int, id long, n long")
              .groupBy("f", "id").agg(F.sum("n").alias("n")))
    keep = F.col("n") >= cfg.vocab.min_count
    if existing is not None and any(len(a) for a in existing.ids):
        known = spark.createDataFrame(
            [(j, int(i)) for j, a in enumerate(existing.ids) for i in a],
            "f int, id long").withColumn("known", F.lit(True))
        counts = counts.join(F.broadcast(known), ["f", "id"], "left")
        keep = keep | F.col("known").isNotNull()
    table = counts.where(keep).select("f", "id", "n").toArrow()
    counter = IdCounter(len(criteo_sparse_names()))
    f = table.column("f").to_numpy()
    ids = table.column("id").to_numpy().astype(np.int64)
    n = table.column("n").to_numpy().astype(np.int64)
    for j in range(len(criteo_sparse_names())):
        sel = f == j
        order = np.argsort(ids[sel], kind="stable")
        counter.ids[j] = ids[sel][order]
        counter.counts[j] = n[sel][order]
    return counter


def _block_writer(out: str, sources: dict[int, str], bounds: list[np.ndarray],
                  table_sizes: np.ndarray,
                  vocab_bc, cfg: PreprocessConfig):
    """A block -> its parquet parts and rejects part, with the pyarrow engine's parser, transform
    and writer; one result row."""

    def write(b):
        import pyarrow as pa

        vocab = vocab_bc.value if vocab_bc is not None else None
        blk = b["blk"]
        rejects = RejectLog(path=Path(out) / "rejects" / f"part-{blk:05d}.tsv", max_fraction=1.0)
        writers = {s: SplitWriter(Path(out) / s / f"part-{blk:05d}.parquet", cfg.row_group_size,
                                   cfg.compression, keep_empty=False) for s in SPLITS}
        present = np.zeros(len(criteo_sparse_names()), dtype=np.int64)
        written = 0
        line = b["first_line"]
        offset = b["row_base"] - b["first_line"] + 1
        try:
            for buf in block_chunks(b["path"], b["start"], b["end"], cfg.chunk_bytes):
                parsed = _parse_block(buf, line, sources[blk], rejects)
                line += buf.count(b"\n")
                if not len(parsed):
                    continue
                write_split_rows(parsed, offset, table_sizes, vocab, bounds[b["file"]], writers,
                                 present)
                written += len(parsed)
        finally:
            rejects.close()
            for w in writers.values():
                w.close()
        files = {s: (str(w.path), w.rows, w.row_groups) for s, w in writers.items() if w.rows}
        yield pa.RecordBatch.from_pylist(
            [{"blk": blk, "split_files": json.dumps(files), "written": written,
              "rejected": rejects.count, "by_reason": json.dumps(rejects.by_reason),
              "present": present.tolist()}], schema=_result_arrow_schema())

    return write


def _result_arrow_schema():
    import pyarrow as pa

    return pa.schema([("blk", pa.int64()), ("split_files", pa.string()), ("written", pa.int64()),
                      ("rejected", pa.int64()), ("by_reason", pa.string()),
                      ("present", pa.list_(pa.int64()))])


def preprocess_criteo_spark(
    files: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    cfg: PreprocessConfig,
    table_size_hint: Sequence[int] | None = None,
    progress: Callable[[int, int], None] | None = None,
    spark=None,
) -> PreprocessReport:
    """``preprocess_criteo`` on Spark (module docstring). ``spark``: the SparkSession to use
    (the project hook's); default: the active one, else a local one from ``SparkConfig()``."""
    check_criteo_splits(cfg.splits)
    F = _spark_functions()
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            from recscale.data.spark_session import make_spark_session

            spark = make_spark_session()
    t0 = time.perf_counter()
    files = [str(f) for f in files]
    out = prepare_output(out_dir)
    if not files:
        raise ValueError("no input files to preprocess")
    paths = [os.path.abspath(f) for f in files]
    blocks = _cut_blocks(paths, _block_bytes(spark))
    if blocks:
        _count_lines(spark, blocks, cfg.chunk_bytes)
    line_counts = _number_blocks(blocks, len(files))
    total = int(sum(line_counts))
    splitter = Splitter(cfg.splits, total)
    bounds = [splitter.row_bounds(f) for f in files]  # per file: a file split's is its split
    log.info("spark: %d lines in %d files, %d blocks (%.1f s)", total, len(files), len(blocks),
             time.perf_counter() - t0)
    if progress:
        progress(0, total)
    vocab, vocab_path, vocab_bc = None, None, None
    if cfg.ids == "vocab":
        existing = load_vocabulary(cfg.vocab.path, criteo_sparse_names()) if cfg.vocab.path else None
        counter = _count_ids(spark, F, blocks, [int(b[0]) for b in bounds], cfg, existing)
        vocab, vocab_path = resolve_vocabulary(counter, cfg, out)
        table_sizes = np.asarray(vocab.table_sizes, dtype=np.int64)
        vocab_bc = spark.sparkContext.broadcast(vocab)
        log.info("spark: vocabulary counted (%.1f s)", time.perf_counter() - t0)
    else:
        table_sizes = np.asarray(cfg.resolve_table_sizes(table_size_hint), dtype=np.int64)
    results: list[FileResult] = []
    if blocks:
        sources = {b["blk"]: files[b["file"]] for b in blocks}
        writer = _block_writer(str(out.resolve()), sources, bounds, table_sizes, vocab_bc, cfg)
        for r in _map_blocks(spark, blocks, writer, _RESULT_SCHEMA).collect():
            results.append(FileResult(
                index=int(r["blk"]),
                split_files={s: tuple(v) for s, v in json.loads(r["split_files"]).items()},
                written=int(r["written"]), rejected=int(r["rejected"]),
                by_reason=json.loads(r["by_reason"]),
                present=np.asarray(r["present"], dtype=np.int64)))
        if len(results) != len(blocks):
            raise RuntimeError(f"spark: {len(results)} of {len(blocks)} blocks reported back")
    if vocab_bc is not None:
        vocab_bc.unpersist()
    if progress:
        progress(total, total)
    log.info("spark: parts written (%.1f s)", time.perf_counter() - t0)
    return finish_preprocess(out, files, cfg, total, results, table_sizes, vocab_path,
                             splitter=splitter)
