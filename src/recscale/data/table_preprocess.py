"""A user's own click log -> the parquet splits, driven by the feature schema (``features``).

Three stages, three modules: where the rows come from and what each file must hold
(``recscale.data.table_source``: sources, the column check before any work, reading in bounded
memory), a block of rows -> raw values and the rows rejected with their reason
(``recscale.data.table_parse``), and here fitting and writing. Every input row is written or
becomes a line of ``rejects.tsv`` (``preprocess.max_reject_fraction`` applies): the manifest's
accounting says so.

The input is cut into units (each parquet row group, each text file), read in order in this
process, one a worker process (``preprocess.workers``) or one a Spark task
(``recscale.data.spark_table``), with the same functions. Two passes: the first over the train
split's rows fits what the schema leaves to the data (the vocabularies of ``ids: vocab``
features, the statistics of ``standardize``), the second writes the rows through the shared
encoder (``recscale.data.encode``): ``row`` (the row's number over all input rows, in order),
``label`` (int8), the dense inputs (float32) and the sparse inputs (int64 ids; list<int64> bags
when any feature is multi-hot), in the schema's order, which is what the loader reads. The
fitted schema goes into the manifest (``recscale.data.schema.FittedSchema``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recscale.config import ConfigError
from recscale.data.criteo import RejectedRowsError, RejectLog
from recscale.data.encode import Parsed, RowIds, encode, output_schema, split_keys
from recscale.data.history import Histories, build_histories, with_histories
from recscale.data.processed import (
    SPLITS,
    FileResult,
    PreprocessConfig,
    PreprocessReport,
    SplitWriter,
    finish_preprocess,
    merge_rejects,
    prepare_output,
)
from recscale.data.schema import FeatureSchema, FittedSchema, SparseFeature
from recscale.data.splits import Splitter, TimeSplit, merge_counts, time_counts
from recscale.data.table_parse import parse_block
from recscale.data.table_source import (
    count_rows,
    is_text,
    needed_columns,
    read_row_group,
    read_text_blocks,
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


# --- fitting and writing --------------------------------------------------------------------------
def sized_tables(schema: FeatureSchema) -> tuple[str, ...]:
    """The hashed tables the schema gives no ``rows``: sized from the distinct ids the train
    split holds (``fit_schema``)."""
    return tuple(dict.fromkeys(f.table_name for f in schema.sparse
                               if f.ids == "hash" and schema.table_of(f.table_name).rows is None))


def _counted(schema: FeatureSchema, f) -> int | None:
    """Where feature ``f``'s ids are counted in a fit's IdCounter: the vocabulary tables first,
    then the tables sized from the data; None: not counted."""
    if f.ids == "vocab":
        return schema.vocab_index(f)
    sized = sized_tables(schema)
    if f.ids == "hash" and f.table_name in sized:
        return len(schema.vocab_tables) + sized.index(f.table_name)
    return None


def _fit_block(p: Parsed, schema: FeatureSchema, keep: np.ndarray,
               counter: IdCounter) -> list[tuple[str, np.ndarray]]:
    """The rows ``keep`` of a block: their ids counted into ``counter`` (``ids: vocab``
    features, and hashed ones whose table is sized from the data); -> per standardized dense
    feature, [n, sum, sum of squares] of its values."""
    for j, f in enumerate(schema.sparse):
        k = _counted(schema, f)
        if k is not None:  # counted into its table's vocabulary, or its distinct ids
            entry = p.keys[j]
            if isinstance(entry, RowIds):
                keys = entry.ids[keep & entry.present]
            else:
                lengths, keys = split_keys(*entry, keep)
            u, c = np.unique(keys, return_counts=True)
            counter.merge(k, u, c)
    sums = []
    for f, (x, present) in zip(schema.dense, p.dense):
        if f.standardizes:
            v = f.numeric(x[keep & present], until_standardize=True)
            sums.append((f.name, np.array([len(v), v.sum(), (v * v).sum()])))
    return sums


def _stats(sums: dict[str, np.ndarray], schema: FeatureSchema) -> dict[str, dict[str, float]]:
    out = {}
    for f in schema.dense:
        if f.standardizes:
            n, s, ss = sums[f.name]
            if n == 0:
                raise ConfigError(f"features.dense ({f.name}): standardize has no present value "
                                  "in the train split to fit its mean and standard deviation on")
            mean = s / n
            std = float(np.sqrt(max(ss / n - mean * mean, 0.0)))
            out[f.name] = {"mean": float(mean), "std": std if std > 0 else 1.0}
    return out


def _row_text(t: pa.Table, r: int) -> bytes:
    return "\t".join(f"{c}={t.column(c)[r].as_py()!r}" for c in t.column_names).encode()


@dataclass(frozen=True)
class Unit:
    """A piece of the input that one task reads: a parquet row group, or a whole text file."""

    index: int
    path: str
    row_group: int | None  # None: the whole (text) file
    rows: int
    row_base: int  # the global row number of its first row
    first_row: int  # its first row's position in its file (0-based)
    history: Histories | None = None  # the history features to join (recscale.data.history)


def plan_units(files: Sequence[str], delimiter: str) -> list[Unit]:
    """The input's units in row order, with their global row numbers."""
    units, base = [], 0
    for f in files:
        if is_text(f):
            n = count_rows(f, delimiter)
            units.append(Unit(len(units), f, None, n, base, 0))
            base += n
            continue
        meta = pq.ParquetFile(f).metadata
        first = 0
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            units.append(Unit(len(units), f, g, n, base, first))
            base, first = base + n, first + n
    return units


def unit_blocks(u: Unit, columns: Sequence[str], delimiter: str,
                chunk_bytes: int) -> Iterator[pa.Table]:
    """A unit's rows in blocks of ``columns``, its history features joined where built."""
    return with_histories(_read_unit(u, columns, delimiter, chunk_bytes), u.row_base, u.history)


def _read_unit(u: Unit, columns: Sequence[str], delimiter: str,
               chunk_bytes: int) -> Iterator[pa.Table]:
    if u.row_group is None:
        yield from read_text_blocks(u.path, columns, delimiter, chunk_bytes)
    else:
        yield read_row_group(u.path, u.row_group, columns)


def build_unit_histories(units: Sequence[Unit], features: Sequence[SparseFeature],
                         delimiter: str, chunk_bytes: int, out: Path) -> list[Unit]:
    """History ``features`` built over the units (``recscale.data.history``, steps 1 and 2)
    -> the units, each able to join its rows' histories as it is read."""
    if not features:
        return list(units)

    def blocks(columns):
        for u in units:
            base = u.row_base
            for t in _read_unit(u, list(dict.fromkeys(columns)), delimiter, chunk_bytes):
                yield base, t
                base += t.num_rows

    total = int(sum(u.rows for u in units))
    built = build_histories(features, blocks, total, out)
    log.info("history features %s built over %d rows", ", ".join(built.features), total)
    return [dataclasses.replace(u, history=built) for u in units]


def unit_columns(schema: FeatureSchema, splitter: Splitter) -> list[str]:
    """The columns a unit is read with: the schema's, and the split rule's time column."""
    return list(dict.fromkeys(needed_columns(schema, build=True)
                              + [c for c in [splitter.column] if c]))


def fit_unit(u: Unit, schema: FeatureSchema, cfg: PreprocessConfig, delimiter: str,
             splitter: Splitter) -> tuple[IdCounter, list[list[tuple[str, np.ndarray]]]]:
    """What one unit's train rows fit: its id counts (``ids: vocab`` features) and, per block in
    order, the standardize sums (added in unit and block order, they give the same floats on
    either engine)."""
    counter = IdCounter(len(schema.vocab_tables) + len(sized_tables(schema)))
    sums = []
    pos = u.row_base
    for block in unit_blocks(u, unit_columns(schema, splitter), delimiter, cfg.chunk_bytes):
        p = parse_block(block, schema, cfg.max_bag_size)
        split, no_time = splitter.split_of(u.path, pos + np.arange(block.num_rows), block)
        sums.append(_fit_block(p, schema, ~p.bad & ~no_time & (split == 0), counter))
        pos += block.num_rows
    return counter, sums


def time_counts_unit(u: Unit, column: str, delimiter: str, chunk_bytes: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """One unit's distinct times and their rows (a split by fractions of the rows in time)."""
    return merge_counts([time_counts(b.column(column))
                         for b in unit_blocks(u, [column], delimiter, chunk_bytes)])


def make_splitter(cfg: PreprocessConfig, units: Sequence[Unit], delimiter: str,
                  run=None) -> Splitter:
    """``preprocess.splits`` resolved for these units; a split by fractions of the rows in time
    first counts the time column's values (``run(fn, args)``: how the units' tasks run, in
    order; default here, one after another)."""
    total = int(sum(u.rows for u in units))
    rule = cfg.splits
    if isinstance(rule, TimeSplit) and rule.fractions is not None:
        args = [(u, rule.by, delimiter, cfg.chunk_bytes) for u in units]
        parts = run(time_counts_unit, args) if run else [time_counts_unit(*a) for a in args]
        splitter = Splitter(rule, total, merge_counts(parts))
    else:
        splitter = Splitter(rule, total)
    if splitter.times is not None:
        log.info("splits by %s: train before %s, validation from it, test from %s",
                 rule.by, splitter.times[0], splitter.times[1])
    return splitter


def write_unit(u: Unit, fitted: FittedSchema, vocab: Vocabulary | None, cfg: PreprocessConfig,
               delimiter: str, splitter: Splitter, writers: dict, rejects: RejectLog,
               progress: Callable[[int], None] | None = None) -> tuple[int, np.ndarray]:
    """One unit's rows -> the split writers and the rejects; -> (rows written, ids per sparse
    input)."""
    schema = fitted.schema
    header = 1 if is_text(u.path) else 0
    present = np.zeros(len(fitted.sparse_names), np.int64)
    written, pos = 0, 0
    for block in unit_blocks(u, unit_columns(schema, splitter), delimiter, cfg.chunk_bytes):
        p = parse_block(block, schema, cfg.max_bag_size)
        rows = u.row_base + pos + np.arange(block.num_rows)
        split, no_time = splitter.split_of(u.path, rows, block)
        p.reject(no_time, lambda r, b=block: splitter.reason(b, r))
        for r in np.flatnonzero(p.bad):
            rejects.add(u.path, u.first_row + pos + int(r) + 1 + header, p.reasons[int(r)],
                        _row_text(block, int(r)))
        table, ids = encode(p, fitted, vocab, rows)
        present += ids
        written += table.num_rows
        split = split[~p.bad]
        if np.all(split[1:] >= split[:-1]):  # in row order: each split a slice
            cut = np.searchsorted(split, np.arange(1, len(SPLITS) + 1), side="left")
            lo = 0
            for name, hi in zip(SPLITS, cut):
                writers[name].write(table.slice(lo, hi - lo))
                lo = hi
        else:
            for k, name in enumerate(SPLITS):
                writers[name].write(table.filter(pa.array(split == k)))
        pos += block.num_rows
        if progress:
            progress(block.num_rows)
    return written, present


def write_unit_part(u: Unit, out: str, fitted: FittedSchema, vocab: Vocabulary | None,
                    cfg: PreprocessConfig, delimiter: str, splitter: Splitter) -> FileResult:
    """One unit into parts of its own (``<split>/part-<unit>.parquet``,
    ``rejects/part-<unit>.tsv``): what a worker process or a Spark task does."""
    rejects = RejectLog(path=Path(out) / "rejects" / f"part-{u.index:05d}.tsv", max_fraction=1.0)
    writers = {s: SplitWriter(Path(out) / s / f"part-{u.index:05d}.parquet", cfg.row_group_size,
                              cfg.compression, keep_empty=False, schema=output_schema(fitted))
               for s in SPLITS}
    try:
        written, present = write_unit(u, fitted, vocab, cfg, delimiter, splitter, writers,
                                      rejects)
    finally:
        rejects.close()
        for w in writers.values():
            w.close()
    files = {s: (str(w.path), w.rows, w.row_groups) for s, w in writers.items() if w.rows}
    return FileResult(u.index, files, written, rejects.count, dict(rejects.by_reason), present)


def _in_processes(fn, args: list[tuple], workers: int, done: Callable[[int], None]) -> list:
    """``fn(*a)`` for each of ``args`` in ``workers`` spawned processes, results in order."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    out = [None] * len(args)
    with ProcessPoolExecutor(max_workers=min(workers, len(args)),
                             mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(fn, *a): i for i, a in enumerate(args)}
        for fut in futures:  # in order; a worker's error re-raises here
            out[futures[fut]] = fut.result()
            done(futures[fut])
    return out


def fit_schema(schema: FeatureSchema, cfg: PreprocessConfig, out: Path,
               fits: Sequence[tuple[IdCounter, list]]) -> tuple[FittedSchema, Vocabulary | None,
                                                               str | None]:
    """The units' fits (in row order) -> the fitted schema, the vocabulary and its file."""
    vocab_tables = schema.vocab_tables
    sized = sized_tables(schema)
    counter = IdCounter(len(vocab_tables) + len(sized))
    sums = {f.name: np.zeros(3) for f in schema.dense if f.standardizes}
    for c, blocks in fits:
        for k in range(len(vocab_tables) + len(sized)):
            counter.merge(k, c.ids[k], c.counts[k])
        for block in blocks:
            for name, partial in block:
                sums[name] += partial
    vocab, vocab_path = None, None
    if vocab_tables:
        # one vocabulary per table (named as it; features sharing it agree on the threshold
        # and cap), grown append-only from ``existing``
        names = vocab_tables
        existing = load_vocabulary(cfg.vocab.path, names) if cfg.vocab.path else None
        by_table = {f.table_name: f for f in reversed(schema.sparse) if f.ids == "vocab"}
        per = [build_vocabulary(_one(counter, k), VocabConfig(by_table[n].min_count,
                                                              by_table[n].max_size),
                                _one_vocab(existing, k), features=(n,))
               for k, n in enumerate(vocab_tables)]
        vocab = Vocabulary([v.ids[0] for v in per], [v.counts[0] for v in per], names)
        vocab_path = vocab.save(out / VOCAB_NAME)
    sizes: dict[str, int] = {}
    vocab_sizes = dict(zip(vocab.features, vocab.table_sizes)) if vocab else {}
    bucketized = {d.name: d.boundaries for d in schema.dense if d.boundaries is not None}
    for f in schema.sparse_inputs:
        t = schema.table_of(f.table_name)
        if f.ids == "vocab":
            n = vocab_sizes[f.table_name]
        elif f.name in bucketized:
            n = len(bucketized[f.name]) + 1
        elif t.rows is None and f.table_name in sized:  # hashed: from the train split's ids
            distinct = len(counter.ids[len(vocab_tables) + sized.index(f.table_name)])
            n = hashed_rows(distinct, cfg)
            log.info("table %s: %d rows for the %d distinct ids of the train split "
                     "(preprocess.hash_size_multiplier=%s, at most preprocess.max_table_size=%d)",
                     f.table_name, n, distinct, cfg.hash_size_multiplier, cfg.max_table_size)
        else:
            n = t.rows or cfg.max_table_size
        sizes.setdefault(f.table_name, n)
    rows_by_table = [sizes[n] for n in dict.fromkeys(f.table_name for f in schema.sparse_inputs)]
    return FittedSchema.fit(schema, rows_by_table, _stats(sums, schema)), vocab, vocab_path


def hashed_rows(distinct: int, cfg: PreprocessConfig) -> int:
    """The rows of a hashed table the schema gives none: ``preprocess.hash_size_multiplier`` x
    the distinct ids of the train split, at least 1, at most ``preprocess.max_table_size``."""
    return int(min(cfg.max_table_size, max(1, math.ceil(distinct * cfg.hash_size_multiplier))))


def _needs_fit(schema: FeatureSchema) -> bool:
    return any(f.ids == "vocab" for f in schema.sparse) or any(f.standardizes
                                                               for f in schema.dense) \
        or bool(sized_tables(schema))


def preprocess_table_pyarrow(files: Sequence[str], out_dir: str | os.PathLike,
                             cfg: PreprocessConfig, schema: FeatureSchema, delimiter: str = ",",
                             progress: Callable[[int, int], None] | None = None
                             ) -> PreprocessReport:
    """``recscale.data.preprocess.preprocess_table`` on this host: in this process (one part
    per split), or with ``preprocess.workers`` > 1 in that many processes, one unit each at a
    time (a part per unit, the rows the same); ``files`` already expanded and checked
    (``source_files``, ``check_columns``)."""
    out = prepare_output(out_dir)
    units = build_unit_histories(plan_units(files, delimiter), schema.histories, delimiter,
                                 cfg.chunk_bytes, out)
    total = int(sum(u.rows for u in units))
    parallel = cfg.workers > 1 and len(units) > 1
    splitter = make_splitter(cfg, units, delimiter, (lambda fn, args: _in_processes(
        fn, args, cfg.workers, lambda i: None)) if parallel else None)
    train = [u for u in units if splitter.may_train(u.path, u.row_base)] \
        if _needs_fit(schema) else []
    fit_args = [(u, schema, cfg, delimiter, splitter) for u in train]
    fits = _in_processes(fit_unit, fit_args, cfg.workers, lambda i: None) if parallel and \
        len(train) > 1 else [fit_unit(*a) for a in fit_args]
    fitted, vocab, vocab_path = fit_schema(schema, cfg, out, fits)
    if parallel:  # one part per unit, as Spark writes them; the threshold checked at the end
        def unit_done(i: int) -> None:
            if progress:
                progress(units[i].row_base + units[i].rows, total)

        results = _in_processes(write_unit_part, [
            (u, str(out), fitted, vocab, cfg, delimiter, splitter) for u in units], cfg.workers,
            unit_done)
        return finish_preprocess(out, files, cfg, total, results,
                                 np.asarray(fitted.table_rows, np.int64), vocab_path,
                                 fitted=fitted, file_schema=output_schema(fitted),
                                 splitter=splitter)
    rejects_log = RejectLog(path=out / "rejects" / "part-00000.tsv", total_lines=total,
                            max_fraction=cfg.max_reject_fraction)
    writers = {s: SplitWriter(out / s / "part-00000.parquet", cfg.row_group_size,
                              cfg.compression, keep_empty=False, schema=output_schema(fitted))
               for s in SPLITS}
    present = np.zeros(len(fitted.sparse_names), np.int64)
    written, done = 0, 0

    def step(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, total)

    try:
        for u in units:
            w, ids = write_unit(u, fitted, vocab, cfg, delimiter, splitter, writers,
                                rejects_log, step)
            written += w
            present += ids
    except RejectedRowsError as exc:
        rejects_log.close()
        merge_rejects(out, out / "rejects.tsv")
        raise RejectedRowsError(f"{exc} All rejected rows so far: {out / 'rejects.tsv'}") \
            from None
    finally:
        rejects_log.close()
        for w in writers.values():
            w.close()
    files_out = {s: (str(w.path), w.rows, w.row_groups) for s, w in writers.items() if w.rows}
    result = FileResult(0, files_out, written, rejects_log.count, dict(rejects_log.by_reason),
                        present)
    return finish_preprocess(out, files, cfg, total, [result],
                             np.asarray(fitted.table_rows, np.int64), vocab_path, fitted=fitted,
                             file_schema=output_schema(fitted), splitter=splitter)


def _one(counter: IdCounter, k: int) -> IdCounter:
    c = IdCounter(1)
    c.ids[0], c.counts[0] = counter.ids[k], counter.counts[k]
    return c


def _one_vocab(existing, k: int):
    if existing is None:
        return None
    return Vocabulary([existing.ids[k]], [existing.counts[k]], (existing.features[k],))
