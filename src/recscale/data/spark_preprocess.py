"""Criteo TSV -> the parquet splits of ``recscale.data.preprocess``, on Apache Spark.

Same input, checks, reasons, row numbers, splits, schema and manifest as the pyarrow engine, so
the loader and trainer cannot tell which engine ran. The work is Spark SQL (no per-row Python):

1. ``spark.read.text`` (lines split on ``\\n`` only, as the pyarrow reader does). Each input split
   (a file block) is read in order by one task, so a line's number is the block's first line plus
   its position in the block (``monotonically_increasing_id`` minus the block's first). One small
   aggregation counts every block's lines; the driver turns the counts into each block's first
   line and global ``row``, in file order, and the split bounds.
2. Line checks (empty, stray bytes, field count) and value checks (label, 13 integers, 26 8-hex
   ids), each with the pyarrow reader's reason text (Python ``repr`` of the value included) and
   the same precedence (the first bad column in file order). Dense: log1p(max(x, 0)) in double,
   then float. Ids stay checked, lower-case hex strings here.
3. ``ids: vocab``: per-feature counts over the training rows (explode + group by on the hex
   strings), ids under ``min_count`` dropped in Spark; the rest go to the driver, where
   :func:`build_vocabulary` (the same code as the pyarrow engine) orders and caps them. The
   vocabulary reaches the tasks as a broadcast variable.
4. Each task writes its blocks' parts with the pyarrow engine's code (``mapInArrow``, one Arrow
   batch at a time, vectorised; never a Python call per row): hex ids decoded with the pyarrow
   reader's lookup table (Spark's ``conv`` costs about 5 us a value, more than the rest of the
   parse together), mapped to rows by ``map_ids`` (hash or vocabulary), written by its split
   writer: ``<split>/part-<block>.parquet`` in row order with row groups of exactly
   ``row_group_size`` (the last of each part may be short), and ``rejects/part-<block>.tsv``. The
   driver merges the rejects and writes the manifest with the pyarrow engine's code.

Parts are per input block here and per input file there; the rows, their order and split
membership are the same. The reject threshold is checked when every block is done (the pyarrow
engine stops at the first line over it); both raise RejectedRowsError naming the rejects file.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np

from recscale.data.criteo import (
    COLUMN_NAMES,
    DENSE_NAMES,
    NUM_FIELDS,
    NUM_SPARSE,
    SPARSE_NAMES,
    RejectLog,
    _parse_hex,
)
from recscale.data.preprocess import (
    SPLITS,
    PreprocessConfig,
    PreprocessReport,
    _FileResult,
    _SplitWriter,
    finish_preprocess,
    parquet_schema,
    prepare_output,
    resolve_vocabulary,
    split_bounds,
)
from recscale.data.vocab import IdCounter, Vocabulary, load_vocabulary

log = logging.getLogger(__name__)

_RESULT_SCHEMA = ("blk long, split_files string, written long, rejected long, by_reason string, "
                  "present array<long>")


def _spark_functions():
    with warnings.catch_warnings():  # pyspark warns about pandas 3 on import; we use no pandas
        warnings.simplefilter("ignore", FutureWarning)
        from pyspark.sql import functions as F
    return F


def _local_path(uri: str) -> str:
    p = urlparse(uri)
    return unquote(p.path) if p.scheme in ("file", "") else uri


def _pyrepr(F, c):
    """Python's repr() of a printable-ASCII string column (``None`` for null), in Spark SQL."""
    esc = F.regexp_replace(c, r"\\", r"\\\\")
    double = c.contains("'") & ~c.contains('"')
    return (F.when(c.isNull(), F.lit("None"))
            .when(double, F.concat(F.lit('"'), esc, F.lit('"')))
            .otherwise(F.concat(F.lit("'"), F.regexp_replace(esc, "'", r"\\'"), F.lit("'"))))


def _read_blocks(spark, F, files: Sequence[str]):
    """-> (lines DataFrame: path, block_start, mid, value; blocks in row order on the driver)."""
    lines = (spark.read.option("lineSep", "\n").text([os.path.abspath(f) for f in files])
             .select(F.col("_metadata.file_path").alias("path"),
                     F.col("_metadata.file_block_start").alias("block_start"),
                     F.monotonically_increasing_id().alias("mid"), "value"))
    counts = (lines.groupBy("path", "block_start")
              .agg(F.count(F.lit(1)).alias("n"), F.min("mid").alias("min_mid")).collect())
    index = {os.path.realpath(os.path.abspath(f)): i for i, f in enumerate(files)}
    blocks = []
    for r in counts:
        fi = index.get(os.path.realpath(_local_path(r["path"])))
        if fi is None:
            raise RuntimeError(f"Spark read {r['path']}, which is none of the input files")
        blocks.append({"path": r["path"], "block_start": int(r["block_start"]), "file": fi,
                       "n": int(r["n"]), "min_mid": int(r["min_mid"])})
    blocks.sort(key=lambda b: (b["file"], b["block_start"]))
    return lines, blocks


def _number_blocks(blocks: list[dict], n_files: int) -> list[int]:
    """Each block's first line in its file and first global row; -> lines per file."""
    per_file = [0] * n_files
    row = 0
    for k, b in enumerate(blocks):
        b["blk"] = k
        b["first_line"] = per_file[b["file"]] + 1
        b["row_base"] = row
        per_file[b["file"]] += b["n"]
        row += b["n"]
    return per_file


def _parse(F, located):
    """Lines with blk, line, row -> the checked, typed columns and the reject reason (or null)."""
    # one projection per step, each computing its columns once (Spark does not collapse a
    # projection into the next when that would evaluate an expensive expression twice)
    df = located.select("blk", "line", "row", "value",
                        F.split(F.col("value"), "\t", -1).alias("f"))
    v, nf = F.col("value"), F.size(F.col("f"))
    line_reason = (F.when(v == "", F.lit("empty line"))
                   .when(v.rlike(r"[^\t\x20-\x7e]"),
                         F.lit("bad byte: non-printable or non-ASCII character"))
                   .when(nf != NUM_FIELDS,
                         F.concat(F.lit(f"field count: expected {NUM_FIELDS} tab-separated fields, "
                                        "found "), nf.cast("string"))))
    # fields as strings, null where empty (the pyarrow reader's null_values=[""])
    df = df.select("blk", "line", "row", "value", line_reason.alias("line_reason"),
                   *[F.nullif(F.get(F.col("f"), i), F.lit("")).alias(c)
                     for i, c in enumerate(COLUMN_NAMES)])
    # the first bad column in file order, as the pyarrow reader reports it
    checks = [F.col("label").isNull() | ~F.col("label").isin("0", "1")]
    checks += [F.col(c).isNotNull() & ~F.col(c).rlike(r"^[+-]?[0-9]{1,18}$") for c in DENSE_NAMES]
    checks += [F.col(c).isNotNull() & ~F.col(c).rlike(r"^[0-9a-fA-F]{8}$") for c in SPARSE_NAMES]
    first_bad = F.coalesce(*[F.when(ok, F.lit(i)) for i, ok in enumerate(checks)])
    df = df.select("*", F.when(F.col("line_reason").isNull(), first_bad).alias("bad_col"))
    prefixes = (["label: must be 0 or 1, got "] + [f"{c}: not an integer: " for c in DENSE_NAMES]
                + [f"{c}: not an 8-digit hex id: " for c in SPARSE_NAMES])
    bad_value = F.get(F.array(*[F.col(c) for c in COLUMN_NAMES]), F.col("bad_col"))
    reason = (F.when(F.col("line_reason").isNotNull(), F.col("line_reason"))
              .when(F.col("bad_col").isNotNull(),
                    F.concat(F.get(F.array(*[F.lit(p) for p in prefixes]), F.col("bad_col")),
                             _pyrepr(F, bad_value))))
    bad = F.col("line_reason").isNotNull() | F.col("bad_col").isNotNull()
    cols = [F.col("blk"), F.col("line"), F.col("row"), reason.alias("reason"),
            F.when(bad, F.col("value").cast("binary")).alias("raw"),
            F.when(bad, F.lit(0)).otherwise(F.col("label").cast("int")).cast("byte").alias("label")]
    for c in DENSE_NAMES:
        x = F.col(c).try_cast("long")
        cols.append(F.when(bad | x.isNull(), F.lit(0.0))
                    .otherwise(F.log1p(F.greatest(x, F.lit(0)).cast("double")))
                    .cast("float").alias(c))
    for c in SPARSE_NAMES:
        cols.append(F.when(~bad, F.lower(F.col(c))).alias(c))
    return df.select(*cols)


def _count_ids(F, parsed, train_end: int, cfg: PreprocessConfig,
               existing: Vocabulary | None) -> IdCounter:
    """Per-feature id counts over the training rows; ids under min_count (and not already in the
    vocabulary) are dropped in Spark, the rest collected."""
    pairs = (parsed.where(F.col("reason").isNull() & (F.col("row") < train_end))
             .select(F.explode(F.array(*[F.struct(F.lit(j).alias("f"), F.col(c).alias("hex"))
                                         for j, c in enumerate(SPARSE_NAMES)])).alias("p"))
             .select("p.f", "p.hex").where(F.col("hex").isNotNull()))
    counts = pairs.groupBy("f", "hex").agg(F.count(F.lit(1)).alias("n"))
    keep = F.col("n") >= cfg.vocab.min_count
    if existing is not None and any(len(a) for a in existing.ids):
        spark = parsed.sparkSession
        known = spark.createDataFrame(
            [(j, f"{int(i):08x}") for j, a in enumerate(existing.ids) for i in a],
            "f int, hex string").withColumn("known", F.lit(True))
        counts = counts.join(F.broadcast(known), ["f", "hex"], "left")
        keep = keep | F.col("known").isNotNull()
    table = counts.where(keep).select("f", "hex", "n").toArrow()
    counter = IdCounter()
    f = table.column("f").to_numpy()
    ids = _parse_hex(table.column("hex"), table.num_rows)[0].astype(np.int64)
    n = table.column("n").to_numpy()
    for j in range(NUM_SPARSE):
        sel = f == j
        order = np.argsort(ids[sel], kind="stable")
        counter.ids[j] = ids[sel][order].astype(np.int64)
        counter.counts[j] = n[sel][order].astype(np.int64)
    return counter


def _part_writer(out: str, sources: dict[int, str], bounds: np.ndarray, table_sizes: np.ndarray,
                 vocab_bc, cfg: PreprocessConfig):
    """The mapInArrow function: a task's rows (its blocks, each in row order) -> parquet parts and
    rejects parts with the pyarrow engine's writer; one result row per block."""

    def write(batches):
        import pyarrow as pa

        from recscale.data.preprocess import map_ids

        vocab = vocab_bc.value if vocab_bc is not None else None
        schema = parquet_schema()
        state: dict = {}

        def close(st):
            st["rejects"].close()
            for w in st["writers"].values():
                w.close()
            files = {s: (str(w.path), w.rows, w.row_groups) for s, w in st["writers"].items()
                     if w.rows}
            return {"blk": st["blk"], "split_files": json.dumps(files), "written": st["written"],
                    "rejected": st["rejects"].count, "by_reason": json.dumps(st["rejects"].by_reason),
                    "present": st["present"].tolist()}

        def open_block(blk):
            return {"blk": blk, "last_row": -1, "written": 0,
                    "present": np.zeros(NUM_SPARSE, dtype=np.int64),
                    "rejects": RejectLog(path=Path(out) / "rejects" / f"part-{blk:05d}.tsv",
                                         max_fraction=1.0),
                    "writers": {s: _SplitWriter(Path(out) / s / f"part-{blk:05d}.parquet",
                                                cfg.row_group_size, cfg.compression,
                                                keep_empty=False) for s in SPLITS}}

        done = []
        for batch in batches:
            blk = batch.column("blk").to_numpy()
            starts = np.flatnonzero(np.concatenate([[True], blk[1:] != blk[:-1]]))
            ends = np.concatenate([starts[1:], [len(blk)]])
            for lo, hi in zip(starts, ends):
                b = int(blk[lo])
                if state.get("blk") != b:
                    if state:
                        done.append(close(state))
                    state = open_block(b)
                part = batch.slice(int(lo), int(hi - lo))
                rows = part.column("row").to_numpy()
                if rows[0] <= state["last_row"] or (len(rows) > 1 and (np.diff(rows) <= 0).any()):
                    raise RuntimeError(f"block {b}: rows reached the writer out of order")
                state["last_row"] = int(rows[-1])
                reason = part.column("reason")
                bad = reason.is_valid().to_numpy(zero_copy_only=False)
                if bad.any():
                    lines = part.column("line").to_numpy()
                    raw = part.column("raw")
                    texts = reason.to_pylist()
                    for i in np.flatnonzero(bad):
                        state["rejects"].add(sources[b], int(lines[i]), texts[i], raw[int(i)].as_py())
                good = part.filter(pa.array(~bad)) if bad.any() else part
                if good.num_rows == 0:
                    continue
                sparse = [good.column(c) for c in SPARSE_NAMES]
                present = np.stack([a.is_valid().to_numpy(zero_copy_only=False) for a in sparse], 1)
                raw_ids = np.stack([_parse_hex(a, good.num_rows)[0] for a in sparse], 1)
                ids = map_ids(raw_ids, table_sizes, vocab)
                state["present"] += present.sum(axis=0)
                state["written"] += good.num_rows
                cols = [good.column("row"), good.column("label")]
                cols += [good.column(c) for c in DENSE_NAMES]
                cols += [pa.array(ids[:, j], mask=~present[:, j]) for j in range(NUM_SPARSE)]
                table = pa.Table.from_arrays(cols, schema=schema)
                good_rows = table.column("row").to_numpy()
                cut = np.searchsorted(good_rows, bounds, side="left")
                start = 0
                for split, stop in zip(SPLITS, cut):
                    state["writers"][split].write(table.slice(start, stop - start))
                    start = stop
            if done:
                yield pa.RecordBatch.from_pylist(done, schema=_result_arrow_schema())
                done = []
        if state:
            yield pa.RecordBatch.from_pylist([close(state)], schema=_result_arrow_schema())

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
    lines, blocks = _read_blocks(spark, F, files)
    line_counts = _number_blocks(blocks, len(files))
    total = int(sum(line_counts))
    bounds = split_bounds(total, cfg.splits)
    log.info("spark: %d lines in %d files, %d blocks (%.1f s)", total, len(files), len(blocks),
             time.perf_counter() - t0)
    if progress:
        progress(0, total)
    if blocks:
        meta = spark.createDataFrame(
            [(b["path"], b["block_start"], b["blk"], b["first_line"], b["row_base"], b["min_mid"])
             for b in blocks],
            "path string, block_start long, blk long, first_line long, row_base long, min_mid long")
        pos = F.col("mid") - F.col("min_mid")
        located = lines.join(F.broadcast(meta), ["path", "block_start"]).select(
            "blk", (F.col("first_line") + pos).alias("line"), (F.col("row_base") + pos).alias("row"),
            "value")
    else:
        located = None
    vocab, vocab_path, vocab_bc = None, None, None
    if cfg.ids == "vocab":
        existing = load_vocabulary(cfg.vocab.path) if cfg.vocab.path else None
        counter = _count_ids(F, _parse(F, located), int(bounds[0]), cfg, existing) \
            if located is not None else IdCounter()
        vocab, vocab_path = resolve_vocabulary(counter, cfg, out)
        table_sizes = np.asarray(vocab.table_sizes, dtype=np.int64)
        vocab_bc = spark.sparkContext.broadcast(vocab)
        log.info("spark: vocabulary counted (%.1f s)", time.perf_counter() - t0)
    else:
        table_sizes = np.asarray(cfg.resolve_table_sizes(table_size_hint), dtype=np.int64)
    results: list[_FileResult] = []
    if located is not None:
        sources = {b["blk"]: files[b["file"]] for b in blocks}
        writer = _part_writer(str(out.resolve()), sources, bounds, table_sizes, vocab_bc, cfg)
        parsed = _parse(F, located)
        with warnings.catch_warnings():  # pyspark's pandas-version warning; no pandas used
            warnings.simplefilter("ignore", FutureWarning)
            parts = parsed.mapInArrow(writer, _RESULT_SCHEMA)
        for r in parts.collect():
            results.append(_FileResult(
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
    return finish_preprocess(out, files, cfg, total, results, table_sizes, vocab_path)
