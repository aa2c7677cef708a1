"""A user's own click log -> the parquet splits, driven by the feature schema (``features``).

Sources (``data.source: table``): parquet files or directories of them (a ``key=value`` folder of
the path, e.g. ``day=2024-01-03``, is a column ``key`` of its rows), and delimited text files with
a header (``.csv``, ``.tsv``, ``.txt``; ``data.delimiter``). Files are read in the order given,
in bounded memory (record batches of ``preprocess.chunk_bytes`` of text, or parquet row groups).

Before any work every file's columns are checked against the schema: a missing column, or one
whose type cannot hold what the schema says (a dense feature that is not a number, an ``int`` id
column of strings, a multi-hot feature that is neither a list nor a string), fails naming the
column, the file and the type expected. A row that cannot be used becomes a line of
``rejects.tsv`` with its reason (and ``preprocess.max_reject_fraction`` applies): a label that is
not 0 or 1, a dense value that is not a number, an id that is not of its ``id_type``, an id outside
its table (``ids: index``), a null inside a list, a list longer than ``max_len`` without a
truncation rule. Every input row is written or rejected: the manifest's accounting says so.

The input is cut into units (each parquet row group, each text file), read in order by the
pyarrow engine here or one Spark task each (``recscale.data.spark_table``), with the same
functions. Two passes: the first over the train split's rows fits what the schema leaves to the data (the
vocabularies of ``ids: vocab`` features, the statistics of ``standardize``), the second writes the
rows: ``row`` (the row's number over all input rows, in order), ``label`` (int8), the dense
inputs (float32) and the sparse inputs (int64 ids; list<int64> bags when any feature is
multi-hot), in the schema's order, which is what the loader reads. The fitted schema goes into the
manifest (``recscale.data.schema.FittedSchema``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from recscale.config import ConfigError
from recscale.data.criteo import RejectedRowsError, RejectLog
from recscale.data.encode import Parsed, encode, output_schema, split_keys
from recscale.data.processed import (
    SPLITS,
    FileResult,
    PreprocessConfig,
    PreprocessReport,
    SplitWriter,
    finish_preprocess,
    merge_rejects,
    prepare_output,
    split_bounds,
)
from recscale.data.schema import (
    FeatureSchema,
    FittedSchema,
    SparseFeature,
    stable_hash,
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

TEXT_SUFFIXES = (".csv", ".tsv", ".txt")
_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
_INTEGER = r"^\s*[-+]?\d+\s*$"
_HEX = r"^\s*[0-9a-fA-F]{1,16}\s*$"


# --- the source: files, their columns, their rows ----------------------------------------------------
def source_files(paths: Sequence[str | os.PathLike]) -> list[str]:
    """Files and directories (their parquet and text files, recursively, in sorted order)."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(str(f) for f in p.rglob("*") if f.is_file() and
                           (f.suffix in (".parquet", ".pq") or f.suffix in TEXT_SUFFIXES))
            if not found:
                raise ConfigError(f"data.files: directory {str(p)!r} holds no parquet or text file")
            out += found
        else:
            out.append(str(p))
    return out


def is_text(path: str) -> bool:
    return Path(path).suffix in TEXT_SUFFIXES


def partition_columns(path: str) -> dict[str, str]:
    """The ``key=value`` folders of a file's path (a day partition, ...)."""
    return dict(part.split("=", 1) for part in Path(path).parent.parts if "=" in part)


def _file_schema(path: str, delimiter: str) -> pa.Schema:
    if is_text(path):
        with pcsv.open_csv(path, parse_options=pcsv.ParseOptions(delimiter=delimiter),
                           convert_options=pcsv.ConvertOptions(auto_dict_encode=False),
                           read_options=pcsv.ReadOptions(block_size=1 << 16)) as reader:
            names = reader.schema.names
        return pa.schema([pa.field(n, pa.string()) for n in names])
    schema = pq.read_schema(path)
    for k in partition_columns(path):
        if k not in schema.names:
            schema = schema.append(pa.field(k, pa.string()))
    return schema


def _needed(schema: FeatureSchema) -> list[tuple[str, str, str]]:
    """(column, the feature that reads it, what it must hold)."""
    out = [(schema.label, "features.label", "number")]
    out += [(f.source, f"features.dense[{i}] ({f.name})", "number")
            for i, f in enumerate(schema.dense)]
    for i, f in enumerate(schema.sparse):
        what = "list" if f.kind == "multi_hot" else ("integer" if f.id_type == "int" else "string")
        out.append((f.source, f"features.sparse[{i}] ({f.name})", what))
    return out


def _holds(t: pa.DataType, what: str, text: bool) -> bool:
    if text:  # every value of a text file is a string, parsed row by row
        return True
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return what in ("string", "list")  # a typed file's column holds its type
    if what == "number":
        return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
    if what == "integer":  # floats too: a database's integer column with nulls reads as float
        return pa.types.is_integer(t) or pa.types.is_floating(t)
    if what == "string":
        return pa.types.is_integer(t)
    if what == "list":
        return (pa.types.is_list(t) or pa.types.is_large_list(t)) and \
            (pa.types.is_integer(t.value_type) or pa.types.is_string(t.value_type)
             or pa.types.is_large_string(t.value_type))
    return False


def check_columns(files: Sequence[str], schema: FeatureSchema, delimiter: str) -> None:
    """Every file holds every column the schema reads, of a type that can hold it; else a
    ConfigError naming the column, the file and the type expected."""
    expected = {"number": "a number (integer or float)", "integer": "integers (id_type: int)",
                "string": "strings or integers (id_type: string)",
                "list": "a list of integers or strings, or a delimited string (multi_hot)"}
    for f in files:
        if not os.path.exists(f):
            raise ConfigError(f"data.files: {f!r} does not exist")
        have = _file_schema(f, delimiter)
        for col, who, what in _needed(schema):
            if col not in have.names:
                raise ConfigError(f"{f}: column {col!r} ({who}) is missing; expected "
                                  f"{expected[what]}. The file's columns: {', '.join(have.names)}")
            t = have.field(col).type
            if not _holds(t, what, is_text(f)):
                raise ConfigError(f"{f}: column {col!r} ({who}) has type {t}; expected "
                                  f"{expected[what]}")


def count_rows(path: str, delimiter: str) -> int:
    if not is_text(path):
        return pq.ParquetFile(path).metadata.num_rows
    return sum(b.num_rows for b in _text_batches(path, delimiter, None, 1 << 24))


def _text_batches(path: str, delimiter: str, columns: Sequence[str] | None,
                  block_bytes: int) -> Iterator[pa.RecordBatch]:
    names = _file_schema(path, delimiter).names
    cols = list(columns) if columns is not None else names[:1]
    with pcsv.open_csv(
            path, read_options=pcsv.ReadOptions(block_size=block_bytes),
            parse_options=pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=False),
            convert_options=pcsv.ConvertOptions(
                column_types={c: pa.string() for c in cols}, include_columns=cols,
                strings_can_be_null=False, quoted_strings_can_be_null=False)) as reader:
        yield from reader


def read_blocks(path: str, columns: Sequence[str], delimiter: str,
                chunk_bytes: int) -> Iterator[pa.Table]:
    """A file's rows, in order, in blocks holding ``columns`` (text: every value a string)."""
    cols = list(dict.fromkeys(columns))
    if is_text(path):
        for b in _text_batches(path, delimiter, cols, chunk_bytes):
            yield pa.Table.from_batches([b])
        return
    parts = partition_columns(path)
    pf = pq.ParquetFile(path)
    own = [c for c in cols if c in pf.schema_arrow.names]
    for i in range(pf.metadata.num_row_groups):
        t = pf.read_row_group(i, columns=own)
        for k, v in parts.items():
            if k in cols and k not in own:
                t = t.append_column(k, pa.array([v] * t.num_rows, pa.string()))
        yield t


def write_rows(rows, path: str | os.PathLike, progress: Callable[[int], None] | None = None) -> int:
    """Rows a catalog dataset loaded (a pandas DataFrame, a pyarrow Table, or an iterable of
    either: chunks) -> one parquet file at ``path``, streaming; -> the number of rows. Every
    chunk is cast to the first chunk's columns and types (an error names the chunk and the
    column that cannot be)."""
    chunks = [rows] if isinstance(rows, pa.Table) or hasattr(rows, "to_parquet") else rows
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer, n = None, 0
    try:
        for i, chunk in enumerate(chunks):
            t = chunk if isinstance(chunk, pa.Table) else pa.Table.from_pandas(
                chunk, preserve_index=False)
            if writer is None:
                writer = pq.ParquetWriter(path, t.schema, compression="zstd")
            elif t.schema != writer.schema:
                if t.column_names != writer.schema.names:
                    raise ValueError(f"raw_table: chunk {i} has columns {t.column_names}, the "
                                     f"first chunk {writer.schema.names}")
                try:
                    t = t.cast(writer.schema)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ValueError(f"raw_table: chunk {i} does not fit the first chunk's "
                                     f"types ({exc})") from None
            writer.write_table(t)
            n += t.num_rows
            if progress:
                progress(t.num_rows)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise ValueError("raw_table loaded no rows")
    return n


# --- parsing: a block's columns -> raw values, and the rows that cannot be used ----------------------
def _strings(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return col if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) \
        else pc.cast(col, pa.string())


def _numbers(col, name: str, p: Parsed, what: str) -> tuple[np.ndarray, np.ndarray]:
    """A column -> (float64 values, present); a value that is not a number rejects its row."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        empty = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(col), ""), True)
        ok = pc.fill_null(pc.match_substring_regex(col, _NUMBER), False)
        bad = ~np.asarray(pc.or_(empty, ok).to_numpy(zero_copy_only=False), dtype=bool)
        vals = col.to_numpy(zero_copy_only=False)
        p.reject(bad, lambda r: f"{what}: {name}={str(vals[r])[:40]!r} is not a number")
        col = pc.if_else(ok, col, pa.scalar(None, col.type)).cast(pa.float64())
    col = col.cast(pa.float64())
    x = col.to_numpy(zero_copy_only=False)
    present = ~np.isnan(x)
    return np.where(present, x, 0.0), present


def _keys(values: pa.Array, f: SparseFeature, where: np.ndarray, p: Parsed) -> np.ndarray:
    """Raw ids (int or string values) -> int64 keys; a value not of ``id_type`` rejects its row
    (``where[i]``: the block row of value ``i``)."""
    if f.id_type == "int" and pa.types.is_integer(values.type):
        return values.cast(pa.int64()).to_numpy(zero_copy_only=False)
    if f.id_type == "int" and pa.types.is_floating(values.type):
        x = values.to_numpy(zero_copy_only=False).astype(np.float64)
        whole = np.isfinite(x) & (x == np.round(x)) & (np.abs(x) < 2.0**63)
        if not whole.all():
            bad_rows = np.zeros(p.n, bool)
            bad_rows[where[~whole]] = True
            first: dict[int, float] = {}
            for i in np.flatnonzero(~whole):
                first.setdefault(int(where[i]), float(x[i]))
            p.reject(bad_rows, lambda r: f"bad id: {f.name}={first[r]!r} is not an integer")
        return np.where(whole, x, 0).astype(np.int64)
    s = _strings(values)
    if f.id_type == "string":
        return stable_hash(s)
    pattern = _INTEGER if f.id_type == "int" else _HEX
    ok = np.asarray(pc.fill_null(pc.match_substring_regex(s, pattern), False)
                    .to_numpy(zero_copy_only=False), dtype=bool)
    if not ok.all():
        text = s.to_numpy(zero_copy_only=False)
        bad_rows = np.zeros(p.n, bool)
        bad_rows[where[~ok]] = True
        first = {}
        for i in np.flatnonzero(~ok):
            first.setdefault(int(where[i]), str(text[i])[:40])
        p.reject(bad_rows, lambda r: f"bad id: {f.name}={first[r]!r} is not "
                 f"{'an integer' if f.id_type == 'int' else 'hexadecimal'}")
    good = pc.if_else(pa.array(ok), s, pa.scalar("0", s.type))
    if f.id_type == "int":
        return pc.cast(pc.utf8_trim_whitespace(good), pa.int64()).to_numpy(zero_copy_only=False)
    return np.array([int(v, 16) for v in good.to_pylist()], dtype=np.int64)


def _bags(col, f: SparseFeature, max_bag: int, p: Parsed) -> tuple[np.ndarray, np.ndarray]:
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if f.kind == "categorical":
        present = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            present &= ~np.asarray(pc.fill_null(pc.equal(pc.utf8_trim_whitespace(col), ""), True)
                                   .to_numpy(zero_copy_only=False), dtype=bool)
        rows = np.flatnonzero(present)
        keys = _keys(col.filter(pa.array(present)), f, rows, p) if len(rows) else \
            np.zeros(0, np.int64)
        return present.astype(np.int64), keys
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = pc.if_else(pc.fill_null(pc.equal(pc.utf8_trim_whitespace(col), ""), True),
                         pa.scalar(None, col.type), col)
        col = pc.split_pattern(col, f.delimiter)
    lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
    lengths = lengths.astype(np.int64)
    flat = pc.list_flatten(col)
    row_of = np.repeat(np.arange(p.n), lengths)
    nulls = ~np.asarray(flat.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if nulls.any():
        bad = np.zeros(p.n, bool)
        bad[row_of[nulls]] = True
        p.reject(bad, lambda r: f"null in list: {f.name} holds a null id")
    limit = f.max_len or max_bag
    keep = np.ones(len(row_of), bool)
    if (lengths > limit).any():
        if f.truncate == "reject":
            p.reject(lengths > limit, lambda r: f"list too long: {f.name} holds {lengths[r]} ids, "
                     f"more than max_len={limit} (truncate: reject)")
        else:
            pos = np.arange(len(row_of)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            from_end = np.repeat(lengths, lengths) - 1 - pos
            keep = (pos if f.truncate == "keep_first" else from_end) < limit
    keep &= ~nulls
    keys = _keys(pc.filter(flat, pa.array(keep)), f, row_of[keep], p) if keep.any() else \
        np.zeros(0, np.int64)
    lengths = np.bincount(row_of[keep], minlength=p.n).astype(np.int64)
    return lengths, keys


def parse_block(t: pa.Table, schema: FeatureSchema, max_bag: int) -> Parsed:
    n = t.num_rows
    p = Parsed(n, np.zeros(n, np.int8), [], [], np.zeros(n, bool))
    lab, lab_present = _numbers(t.column(schema.label), schema.label, p, "bad label")
    ok = lab_present & ((lab == 0) | (lab == 1))
    p.reject(~ok & ~p.bad, lambda r: f"bad label: {schema.label}="
             f"{f'{lab[r]:g}' if lab_present[r] else 'missing'} is not 0 or 1")
    p.label = np.where(ok, lab, 0).astype(np.int8)
    for f in schema.dense:
        p.dense.append(_numbers(t.column(f.source), f.name, p, "bad dense value"))
    for f in schema.sparse:
        lengths, keys = _bags(t.column(f.source), f, max_bag, p)
        if f.min_id is not None and (keys < f.min_id).any():
            _reject_ids(lengths, keys, keys < f.min_id, p, lambda v, f=f: (
                f"negative id: {f.name}={v}" if f.min_id == 0 else
                f"id below min_id: {f.name}={v} < {f.min_id}"))
        if f.ids == "index":
            _check_range(lengths, keys, f, int(schema.table_of(f.table_name).rows), p)
        p.keys.append((lengths, keys))
    return p


def _reject_ids(lengths: np.ndarray, keys: np.ndarray, out: np.ndarray, p: Parsed,
                reason: Callable[[int], str]) -> None:
    """The rows holding an id flagged in ``out`` are rejected, ``reason(id)`` naming the first."""
    row_of = np.repeat(np.arange(p.n), lengths)
    bad = np.zeros(p.n, bool)
    bad[row_of[out]] = True
    first: dict[int, int] = {}
    for i in np.flatnonzero(out):
        first.setdefault(int(row_of[i]), int(keys[i]))
    p.reject(bad, lambda r: reason(first[r]))


def _check_range(lengths: np.ndarray, keys: np.ndarray, f: SparseFeature, size: int,
                 p: Parsed) -> None:
    """``ids: index``: an id outside [0, size) rejects its row (before anything is fitted)."""
    out = (keys < 0) | (keys >= size)
    if out.any():
        _reject_ids(lengths, keys, out, p, lambda v: f"id outside table: {f.name}={v} is not in "
                    f"[0, {size}) (table {f.table_name})")


# --- fitting and writing --------------------------------------------------------------------------
@dataclass
class Fit:
    """What the train split's rows fit: id counts (``ids: vocab``), sums for ``standardize``."""

    counter: IdCounter
    sums: dict[str, np.ndarray]  # name -> [n, sum, sum of squares]


def _fit_block(p: Parsed, schema: FeatureSchema, keep: np.ndarray, fit: Fit) -> None:
    vocab_feats = [j for j, f in enumerate(schema.sparse) if f.ids == "vocab"]
    for k, j in enumerate(vocab_feats):
        lengths, keys = split_keys(*p.keys[j], keep)
        u, c = np.unique(keys, return_counts=True)
        fit.counter.merge(k, u, c)
    for f, (x, present) in zip(schema.dense, p.dense):
        if f.standardizes:
            v = f.numeric(x[keep & present], until_standardize=True)
            fit.sums[f.name] += [len(v), v.sum(), (v * v).sum()]


def _stats(fit: Fit, schema: FeatureSchema) -> dict[str, dict[str, float]]:
    out = {}
    for f in schema.dense:
        if f.standardizes:
            n, s, ss = fit.sums[f.name]
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
    if u.row_group is None:
        yield from read_blocks(u.path, columns, delimiter, chunk_bytes)
        return
    cols = list(dict.fromkeys(columns))
    pf = pq.ParquetFile(u.path)
    own = [c for c in cols if c in pf.schema_arrow.names]
    t = pf.read_row_group(u.row_group, columns=own)
    for k, v in partition_columns(u.path).items():
        if k in cols and k not in own:
            t = t.append_column(k, pa.array([v] * t.num_rows, pa.string()))
    yield t


def fit_unit(u: Unit, schema: FeatureSchema, cfg: PreprocessConfig, delimiter: str,
             train_end: int) -> tuple[IdCounter, list[list[tuple[str, np.ndarray]]]]:
    """What one unit's train rows fit: its id counts (``ids: vocab`` features) and, per block in
    order, the standardize sums (added in unit and block order, they give the same floats on
    either engine)."""
    fit = Fit(IdCounter(sum(f.ids == "vocab" for f in schema.sparse)), {})
    sums = []
    pos = u.row_base
    for block in unit_blocks(u, [c for c, _, _ in _needed(schema)], delimiter, cfg.chunk_bytes):
        p = parse_block(block, schema, cfg.max_bag_size)
        rows = pos + np.arange(block.num_rows)
        fit.sums = {f.name: np.zeros(3) for f in schema.dense if f.standardizes}
        _fit_block(p, schema, ~p.bad & (rows < train_end), fit)
        sums.append(list(fit.sums.items()))
        pos += block.num_rows
    return fit.counter, sums


def write_unit(u: Unit, fitted: FittedSchema, vocab: Vocabulary | None, cfg: PreprocessConfig,
               delimiter: str, bounds: np.ndarray, writers: dict, rejects: RejectLog,
               progress: Callable[[int], None] | None = None) -> tuple[int, np.ndarray]:
    """One unit's rows -> the split writers and the rejects; -> (rows written, ids per sparse
    input)."""
    schema = fitted.schema
    header = 1 if is_text(u.path) else 0
    present = np.zeros(len(fitted.sparse_names), np.int64)
    written, pos = 0, 0
    for block in unit_blocks(u, [c for c, _, _ in _needed(schema)], delimiter, cfg.chunk_bytes):
        p = parse_block(block, schema, cfg.max_bag_size)
        rows = u.row_base + pos + np.arange(block.num_rows)
        for r in np.flatnonzero(p.bad):
            rejects.add(u.path, u.first_row + pos + int(r) + 1 + header, p.reasons[int(r)],
                        _row_text(block, int(r)))
        table, ids = encode(p, fitted, vocab, rows)
        present += ids
        written += table.num_rows
        cut = np.searchsorted(table.column("row").to_numpy(), bounds, side="left")
        lo = 0
        for split, hi in zip(SPLITS, cut):
            writers[split].write(table.slice(lo, hi - lo))
            lo = hi
        pos += block.num_rows
        if progress:
            progress(block.num_rows)
    return written, present


def write_unit_part(u: Unit, out: str, fitted: FittedSchema, vocab: Vocabulary | None,
                    cfg: PreprocessConfig, delimiter: str, bounds: np.ndarray) -> FileResult:
    """One unit into parts of its own (``<split>/part-<unit>.parquet``,
    ``rejects/part-<unit>.tsv``): what a worker process or a Spark task does."""
    rejects = RejectLog(path=Path(out) / "rejects" / f"part-{u.index:05d}.tsv", max_fraction=1.0)
    writers = {s: SplitWriter(Path(out) / s / f"part-{u.index:05d}.parquet", cfg.row_group_size,
                              cfg.compression, keep_empty=False, schema=output_schema(fitted))
               for s in SPLITS}
    try:
        written, present = write_unit(u, fitted, vocab, cfg, delimiter, bounds, writers, rejects)
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
    vocab_feats = [f for f in schema.sparse if f.ids == "vocab"]
    counter = IdCounter(len(vocab_feats))
    sums = {f.name: np.zeros(3) for f in schema.dense if f.standardizes}
    for c, blocks in fits:
        for k in range(len(vocab_feats)):
            counter.merge(k, c.ids[k], c.counts[k])
        for block in blocks:
            for name, partial in block:
                sums[name] += partial
    vocab, vocab_path = None, None
    if vocab_feats:
        names = tuple(f.name for f in vocab_feats)
        existing = load_vocabulary(cfg.vocab.path, names) if cfg.vocab.path else None
        # each feature with its own threshold and cap (grown append-only from ``existing``)
        per = [build_vocabulary(_one(counter, k), VocabConfig(f.min_count, f.max_size),
                                _one_vocab(existing, k), features=(f.name,))
               for k, f in enumerate(vocab_feats)]
        vocab = Vocabulary([v.ids[0] for v in per], [v.counts[0] for v in per], names)
        vocab_path = vocab.save(out / VOCAB_NAME)
    sizes: dict[str, int] = {}
    vocab_sizes = dict(zip(vocab.features, vocab.table_sizes)) if vocab else {}
    bucketized = {d.name: d.boundaries for d in schema.dense if d.boundaries is not None}
    for f in schema.sparse_inputs:
        t = schema.table_of(f.table_name)
        if f.name in vocab_sizes:
            n = vocab_sizes[f.name]
        elif f.name in bucketized:
            n = len(bucketized[f.name]) + 1
        else:
            n = t.rows or cfg.max_table_size
        sizes.setdefault(f.table_name, n)
    rows_by_table = [sizes[n] for n in dict.fromkeys(f.table_name for f in schema.sparse_inputs)]
    return FittedSchema.fit(schema, rows_by_table, _stats(Fit(counter, sums), schema)), vocab, \
        vocab_path


def _needs_fit(schema: FeatureSchema) -> bool:
    return any(f.ids == "vocab" for f in schema.sparse) or any(f.standardizes
                                                               for f in schema.dense)


def preprocess_table_pyarrow(files: Sequence[str], out_dir: str | os.PathLike,
                             cfg: PreprocessConfig, schema: FeatureSchema, delimiter: str = ",",
                             progress: Callable[[int, int], None] | None = None
                             ) -> PreprocessReport:
    """``recscale.data.preprocess.preprocess_table`` on this host: in this process (one part
    per split), or with ``preprocess.workers`` > 1 in that many processes, one unit each at a
    time (a part per unit, the rows the same); ``files`` already expanded and checked
    (``source_files``, ``check_columns``)."""
    out = prepare_output(out_dir)
    units = plan_units(files, delimiter)
    total = int(sum(u.rows for u in units))
    bounds = split_bounds(total, cfg.splits)
    parallel = cfg.workers > 1 and len(units) > 1
    train = [u for u in units if u.row_base < bounds[0]] if _needs_fit(schema) else []
    fit_args = [(u, schema, cfg, delimiter, int(bounds[0])) for u in train]
    fits = _in_processes(fit_unit, fit_args, cfg.workers, lambda i: None) if parallel and \
        len(train) > 1 else [fit_unit(*a) for a in fit_args]
    fitted, vocab, vocab_path = fit_schema(schema, cfg, out, fits)
    if parallel:  # one part per unit, as Spark writes them; the threshold checked at the end
        def unit_done(i: int) -> None:
            if progress:
                progress(units[i].row_base + units[i].rows, total)

        results = _in_processes(write_unit_part, [
            (u, str(out), fitted, vocab, cfg, delimiter, bounds) for u in units], cfg.workers,
            unit_done)
        return finish_preprocess(out, files, cfg, total, results,
                                 np.asarray(fitted.table_rows, np.int64), vocab_path,
                                 fitted=fitted, file_schema=output_schema(fitted))
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
            w, ids = write_unit(u, fitted, vocab, cfg, delimiter, bounds, writers, rejects_log,
                                step)
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
                             file_schema=output_schema(fitted))


def _one(counter: IdCounter, k: int) -> IdCounter:
    c = IdCounter(1)
    c.ids[0], c.counts[0] = counter.ids[k], counter.counts[k]
    return c


def _one_vocab(existing, k: int):
    if existing is None:
        return None
    return Vocabulary([existing.ids[k]], [existing.counts[k]], (existing.features[k],))
