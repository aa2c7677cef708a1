"""A table of the user's own columns -> the parquet splits of ``recscale.data.table_preprocess``,
on Apache Spark (``preprocess.engine: spark`` with a schema of your own).

The same units, parser, encoder, rejects, row numbers, splits and manifest as the pyarrow engine:
Spark schedules the units and the pyarrow engine's own functions do the work, so the rows cannot
differ. What runs where:

1. Driver: the input's units (``plan_units``: each parquet row group, each text file) with their
   global row numbers, and the split rule (``make_splitter``; a split by fractions of the rows in
   time first counts the time column, one task per unit).
2. Fitting (``ids: vocab`` features, ``standardize``): one Spark task per unit of the train split
   (``fit_unit``): its id counts and its standardize sums, block by block. The driver merges them
   in row order (``fit_schema``), so the vocabularies and the statistics are the pyarrow engine's
   to the last bit.
3. Writing: one Spark task per unit (``write_unit``) writes ``<split>/part-<unit>.parquet`` and
   ``rejects/part-<unit>.tsv``; the driver merges the rejects, checks the reject threshold and
   writes the manifest with the pyarrow engine's code. Parts are per unit here and one per split
   there; the rows, their order and split membership are the same.

Tasks open the input files and write the output by path: both must be on storage every executor
mounts (local disk for ``local[N]``, a shared filesystem for a cluster).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from recscale.data.encode import output_schema
from recscale.data.processed import (
    FileResult,
    PreprocessConfig,
    PreprocessReport,
    finish_preprocess,
    prepare_output,
)
from recscale.data.schema import FeatureSchema
from recscale.data.table_preprocess import (
    Unit,
    _needs_fit,
    build_unit_histories,
    fit_schema,
    fit_unit,
    make_splitter,
    plan_units,
    write_unit_part,
)

log = logging.getLogger(__name__)


def _session(spark):
    if spark is not None:
        return spark
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        from recscale.data.spark_session import make_spark_session

        spark = make_spark_session()
    return spark


def _write_task(out: str, fitted, vocab_bc, cfg: PreprocessConfig, delimiter: str,
                splitter, units: Sequence[Unit]):
    def run(i: int) -> FileResult:
        vocab = vocab_bc.value if vocab_bc is not None else None
        return write_unit_part(units[i], out, fitted, vocab, cfg, delimiter, splitter)

    return run


def preprocess_table_spark(files: Sequence[str], out_dir: str | os.PathLike,
                           cfg: PreprocessConfig, schema: FeatureSchema, delimiter: str = ",",
                           progress: Callable[[int, int], None] | None = None,
                           spark=None) -> PreprocessReport:
    """``preprocess_table`` on Spark (module docstring); ``files`` already expanded and checked.
    ``spark``: the SparkSession (default: the active one, else a local one from the defaults)."""
    spark = _session(spark)
    sc = spark.sparkContext
    t0 = time.perf_counter()
    out = prepare_output(out_dir)
    units = [Unit(u.index, os.path.abspath(u.path), u.row_group, u.rows, u.row_base, u.first_row)
             for u in plan_units(list(files), delimiter)]
    units = build_unit_histories(units, schema.histories, delimiter, cfg.chunk_bytes,
                                 out.resolve())
    total = int(sum(u.rows for u in units))

    def tasks(fn, args):  # one Spark task per unit, results in order
        return sc.parallelize(args, max(1, len(args))).map(lambda a: fn(*a)).collect()

    splitter = make_splitter(cfg, units, delimiter, tasks)
    log.info("spark: %d rows in %d files, %d units (%.1f s)", total, len(files), len(units),
             time.perf_counter() - t0)
    if progress:
        progress(0, total)
    fits = []
    if _needs_fit(schema):
        train = [u for u in units if splitter.may_train(u.path, u.row_base)]
        fits = tasks(fit_unit, [(u, schema, cfg, delimiter, splitter) for u in train])
    fitted, vocab, vocab_path = fit_schema(schema, cfg, out, fits)
    vocab_bc = sc.broadcast(vocab) if vocab is not None else None
    results = sc.parallelize(range(len(units)), max(1, len(units))).map(
        _write_task(str(out.resolve()), fitted, vocab_bc, cfg, delimiter, splitter, units)
    ).collect() if units else []
    if progress:
        progress(total, total)
    log.info("spark: %d units written (%.1f s)", len(units), time.perf_counter() - t0)
    return finish_preprocess(out, files, cfg, total, results,
                             np.asarray(fitted.table_rows, np.int64), vocab_path, fitted=fitted,
                             file_schema=output_schema(fitted), splitter=splitter)
