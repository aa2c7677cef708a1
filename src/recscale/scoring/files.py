"""Batch scoring: raw files -> one parquet of every input row's score, streaming in bounded memory.

The files are read as preprocessing reads them (the Criteo TSV reader for ``criteo_tsv``; a
table's parquet row groups or text blocks, through the model's schema, for ``table`` and
``parquet``), cut into units (a TSV file, a parquet row group, a text file) with their global row
numbers, and scored block by block by a ``RawScorer``: in this process, unit after unit, or
(``engine: spark``) one Spark task per unit, each writing a part that the driver appends in
unit order, so both engines write the same file. The output holds one row per input row, in
input order: ``row`` (its number over all input rows, as preprocessing numbers them), ``score``
(its click probability; null where it was rejected), ``label`` (where the input has labels) and
``error`` (why a row was not scored; null where it was). Memory: one block of input and its
scores, whatever the input's size; the metrics, when there are labels, read back the output's
``row``, ``label`` and ``score`` columns (17 bytes a row) and sort the scores.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recscale.config import ConfigError
from recscale.data.criteo import RejectLog, count_lines, read_criteo_tsv
from recscale.data.processed import criteo_parsed
from recscale.data.table_preprocess import Unit, build_unit_histories, plan_units, unit_blocks
from recscale.data.table_source import file_columns, source_files
from recscale.evaluate.metrics import metrics_with_oracle
from recscale.scoring.config import SOURCES
from recscale.scoring.raw import RawScorer

log = logging.getLogger(__name__)


@dataclass
class ScoreReport:
    out_path: str
    rows_read: int
    rows_scored: int
    rows_rejected: int
    seconds: float
    labels: bool
    by_reason: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        return self.rows_read / self.seconds if self.seconds > 0 else 0.0


@dataclass
class UnitResult:
    read: int = 0
    scored: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


def output_schema(labels: bool) -> pa.Schema:
    fields = [pa.field("row", pa.int64(), nullable=False), pa.field("score", pa.float64())]
    if labels:
        fields.append(pa.field("label", pa.int8()))
    return pa.schema(fields + [pa.field("error", pa.string())])


class _Rejects(RejectLog):
    """The Criteo reader's rejected lines, kept (line, reason) until their block is written."""

    def __init__(self):
        super().__init__(path=None, max_fraction=1.0)
        self.lines: list[tuple[int, str]] = []

    def add(self, source: str, line: int, reason: str, text: bytes) -> None:
        super().add(source, line, reason, text)
        self.lines.append((line, reason))


def _taken(rejects: _Rejects, upto: int | None, offset: int) -> tuple[np.ndarray, dict]:
    """The rejected lines up to line ``upto`` (all: None) -> (their rows, reasons by row)."""
    keep, out = [], {}
    for line, reason in rejects.lines:
        if upto is None or line <= upto:
            out[line - 1 + offset] = reason
        else:
            keep.append((line, reason))
    rejects.lines = keep
    return np.array(sorted(out), np.int64), out


def check_source(scorer: RawScorer, source: str, files: Sequence[str], delimiter: str) -> bool:
    """The files can be scored by this model; -> whether they carry labels."""
    if source not in SOURCES:
        raise ConfigError(f"score.data.source={source!r} is not allowed: expected one of "
                          f"{', '.join(SOURCES)}")
    if source == "criteo_tsv":
        schema = scorer.fitted.schema
        if not scorer.criteo:
            raise ConfigError(
                "score.data.source='criteo_tsv' reads Criteo's 40 columns, but the model was "
                f"trained on another schema (label {schema.label_column!r}, {len(schema.dense)} dense, "
                f"{len(schema.sparse)} sparse features): use source 'table' (parquet or "
                "delimited text with a header)")
        for f in files:
            if not Path(f).is_file():
                raise ConfigError(f"score.data.files: {f!r} does not exist")
        return True
    built = {f.source for f in built_histories(scorer, files, delimiter)}
    for f in files:
        have = file_columns(f, delimiter)
        missing = [c for c in scorer.input_columns() if c not in have and c not in built]
        if missing:
            raise ConfigError(f"{f}: column(s) {', '.join(missing)} missing; the model reads "
                              f"{', '.join(scorer.input_columns())}. The file's columns: "
                              f"{', '.join(have)}")
    return all(scorer.label in file_columns(f, delimiter) for f in files)


def built_histories(scorer: RawScorer, files: Sequence[str], delimiter: str) -> tuple:
    """The model's history features that scoring builds from the files (no file holds the
    feature's column, every file holds its key, item and time), as preprocessing did."""
    have = [set(file_columns(f, delimiter)) for f in files]
    return tuple(f for f in scorer.fitted.schema.histories
                 if all(f.source not in h and {f.key, f.item, f.time} <= h for h in have))


def plan_score_units(source: str, files: Sequence[str], delimiter: str) -> list[Unit]:
    """The input's units in row order, as preprocessing cuts it (a Criteo TSV file is one),
    their paths absolute (a Spark task opens them by path)."""
    if source != "criteo_tsv":
        return [dataclasses.replace(u, path=os.path.abspath(u.path))
                for u in plan_units(list(files), delimiter)]
    units, base = [], 0
    for i, f in enumerate(files):
        n = count_lines(f)
        units.append(Unit(i, os.path.abspath(f), None, n, base, 0))
        base += n
    return units


def _blocks(scorer: RawScorer, u: Unit, source: str, delimiter: str, chunk_bytes: int,
            labels: bool) -> Iterator[tuple]:
    """-> per block (rows scored, labels, probabilities, rows rejected, reasons by row)."""
    if source == "criteo_tsv":
        rejects = _Rejects()
        for block in read_criteo_tsv(u.path, rejects, chunk_bytes):
            rows, lab, probs = scorer.score_parsed(criteo_parsed(block),
                                                   block.line - 1 + u.row_base)
            # the lines the reader rejected up to this block's last (later ones wait)
            yield rows, lab, probs, *_taken(rejects, int(block.line[-1]), u.row_base)
        yield np.zeros(0, np.int64), np.zeros(0, np.int8), np.zeros(0), \
            *_taken(rejects, None, u.row_base)
        return
    built = set(u.history.features) if u.history else set()
    columns = [c for c in scorer.input_columns() if c not in built] + \
        ([scorer.label] if labels else [])
    pos = 0
    for block in unit_blocks(u, columns, delimiter, chunk_bytes):
        p = scorer.parse(block, labels)  # a labelled file's rows all read their label
        rows = u.row_base + pos + np.arange(block.num_rows, dtype=np.int64)
        scored, lab, probs = scorer.score_parsed(p, rows)
        bad = {int(rows[r]): why for r, why in p.reasons.items()}
        yield scored, lab, probs, np.array(sorted(bad), np.int64), bad
        pos += block.num_rows


def score_unit(scorer: RawScorer, u: Unit, source: str, delimiter: str, chunk_bytes: int,
               labels: bool, writer: pq.ParquetWriter,
               progress: Callable[[int], None] | None = None) -> UnitResult:
    """One unit's rows, scored, appended to ``writer`` in row order."""
    schema, res = output_schema(labels), UnitResult()
    for rows, lab, probs, bad_rows, bad in _blocks(scorer, u, source, delimiter, chunk_bytes,
                                                   labels):
        n_bad = len(bad_rows)
        row = np.concatenate([rows, bad_rows]) if n_bad else rows
        if not len(row):
            continue
        if n_bad:  # the rejected rows go in their places, with null scores and their reason
            order = np.argsort(row, kind="stable")
            rejected = np.concatenate([np.zeros(len(rows), bool), np.ones(n_bad, bool)])[order]
            errors = np.empty(len(row), object)
            errors[len(rows):] = [bad[int(r)] for r in bad_rows]
            row, probs, lab = row[order], np.concatenate([probs, np.zeros(n_bad)])[order], \
                np.concatenate([lab, np.zeros(n_bad, np.int8)])[order]
            errors = pa.array(errors[order], pa.string())
        else:  # scored rows come in order: nothing to sort or to say
            rejected, errors = None, pa.nulls(len(row), pa.string())
        cols = [pa.array(row), pa.array(probs, mask=rejected)]
        if labels:
            cols.append(pa.array(lab, mask=rejected))
        cols.append(errors)
        writer.write_table(pa.Table.from_arrays(cols, schema=schema))
        for why in bad.values():
            kind = why.split(":")[0]
            res.by_reason[kind] = res.by_reason.get(kind, 0) + 1
        res.read += len(row)
        res.scored += len(rows)
        if progress:
            progress(len(row))
    return res


def score_unit_part(make_scorer: Callable[[], RawScorer], u: Unit, source: str,
                    delimiter: str, chunk_bytes: int, labels: bool, parts: str) -> UnitResult:
    """One unit into ``<parts>/part-<unit>.parquet``: what a Spark task runs."""
    path = Path(parts) / f"part-{u.index:05d}.parquet"
    with pq.ParquetWriter(path, output_schema(labels), compression="zstd") as writer:
        return score_unit(make_scorer(), u, source, delimiter, chunk_bytes, labels, writer)


def score_files(make_scorer: Callable[[], RawScorer] | RawScorer, files: Sequence[str],
                out_path: str | Path, source: str = "table", delimiter: str = ",",
                chunk_bytes: int = 1 << 24,
                progress: Callable[[int, int | None], None] | None = None,
                oracle: np.ndarray | None = None, spark=None) -> ScoreReport:
    """Score every row of ``files`` (in order) into the parquet ``out_path``; with labels, the
    metrics of the rows scored (``oracle``: the generator's true probabilities by row).
    ``make_scorer``: the scorer, or a picklable callable that makes it (what every Spark task
    calls; the engine is Spark when a session is given)."""
    t0 = time.perf_counter()
    scorer = make_scorer if isinstance(make_scorer, RawScorer) else make_scorer()
    files = [str(f) for f in files] if source == "criteo_tsv" else source_files(files)
    labels = check_source(scorer, source, files, delimiter)
    units = plan_score_units(source, files, delimiter)
    total = int(sum(u.rows for u in units))
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    histories = built_histories(scorer, files, delimiter) if source != "criteo_tsv" else ()
    scratch = out.with_name(out.name + ".history").resolve()
    if histories:  # built over the scored files, as preprocessing built them over its input
        units = build_unit_histories(units, histories, delimiter, chunk_bytes, scratch)
    tmp = out.with_name(out.name + ".tmp")
    results: list[UnitResult] = []
    done = 0

    def step(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, total)

    with pq.ParquetWriter(tmp, output_schema(labels), compression="zstd") as writer:
        if spark is None:
            for u in units:
                results.append(score_unit(scorer, u, source, delimiter, chunk_bytes, labels,
                                          writer, step))
        else:
            results = _on_spark(spark, make_scorer, units, source, delimiter, chunk_bytes,
                                labels, out, writer, step)
    tmp.replace(out)
    shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.perf_counter() - t0
    read, scored = sum(r.read for r in results), sum(r.scored for r in results)
    if read != total:
        raise RuntimeError(f"row accounting failed: {read} rows scored or rejected of the "
                           f"{total} in {len(files)} file(s)")
    by_reason: dict[str, int] = {}
    for r in results:
        for k, v in r.by_reason.items():
            by_reason[k] = by_reason.get(k, 0) + v
    metrics = {}
    if labels and scored:
        t = pq.read_table(out, columns=["row", "score", "label"])
        ok = t.column("score").is_valid().to_numpy(zero_copy_only=False)
        metrics = metrics_with_oracle(
            t.column("label").to_numpy(zero_copy_only=False)[ok].astype(np.float64),
            t.column("score").to_numpy(zero_copy_only=False)[ok],
            t.column("row").to_numpy()[ok], oracle)
    log.info("scored %d of %d rows (%d rejected) in %.1f s (%.0f rows/s) -> %s", scored, read,
             read - scored, seconds, read / max(seconds, 1e-9), out)
    return ScoreReport(str(out), read, scored, read - scored, seconds, labels, by_reason,
                       metrics)


def _on_spark(spark, make_scorer, units: list[Unit], source: str, delimiter: str,
              chunk_bytes: int, labels: bool, out: Path, writer: pq.ParquetWriter,
              step: Callable[[int], None]) -> list[UnitResult]:
    """One Spark task per unit writes its part; the parts appended to ``writer`` in order."""
    if not callable(make_scorer) or isinstance(make_scorer, RawScorer):
        raise ValueError("scoring on Spark needs a picklable callable that makes the scorer in "
                         "each task (make_scorer), not a scorer")
    parts = out.with_name(out.name + ".parts").resolve()
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True)
    t0 = time.perf_counter()
    try:
        results = spark.sparkContext.parallelize(units, max(1, len(units))).map(
            lambda u: score_unit_part(make_scorer, u, source, delimiter, chunk_bytes, labels,
                                      str(parts))).collect()
        log.info("spark: %d units scored (%.1f s)", len(units), time.perf_counter() - t0)
        for u in units:
            f = pq.ParquetFile(parts / f"part-{u.index:05d}.parquet")
            for g in range(f.metadata.num_row_groups):
                t = f.read_row_group(g)
                writer.write_table(t)
                step(t.num_rows)
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    return results
