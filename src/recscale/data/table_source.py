"""Where a table of the user's own comes from, and what it must hold: the files of a source
(parquet files, directories of them with ``key=value`` folders as columns, delimited text with a
header), the check of every file's columns against the feature schema before any work, row
counts, reading in bounded memory (a parquet row group, or ``chunk_bytes`` of text at a time),
and the rows a Kedro catalog dataset loaded, written to parquet (``write_rows``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from recscale.config import ConfigError
from recscale.data.schema import FeatureSchema

TEXT_SUFFIXES = (".csv", ".tsv", ".txt")


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
        if os.path.getsize(path) == 0:
            raise ConfigError(f"{path}: the file is empty (0 bytes): no header naming its columns "
                              "and no rows; remove it from the inputs or write its rows")
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


def file_columns(path: str, delimiter: str) -> list[str]:
    """The columns a file holds (a text file's header; a parquet file's, with its ``key=value``
    folders)."""
    return list(_file_schema(path, delimiter).names)


def needed_columns(schema: FeatureSchema, build: bool = False) -> list[str]:
    """The source columns the schema reads (each once, in the schema's order). ``build``: the
    columns preprocessing builds the history features from (their key, item and time), in
    place of the history columns a served model takes."""
    return list(dict.fromkeys(c for c, _, _ in _needs(schema, build)))


def _needs(schema: FeatureSchema, build: bool = False) -> list[tuple[str, str, str]]:
    """(column, the feature that reads it, what it must hold)."""
    out = [(schema.label_column, "features.label",
            "number" if schema.label_rule is None else "label")]
    out += [(f.source, f"features.dense[{i}] ({f.name})", "number")
            for i, f in enumerate(schema.dense)]
    for i, f in enumerate(schema.sparse):
        who = f"features.sparse[{i}] ({f.name})"
        if build and f.kind == "history":
            out += [(f.key, f"{who}.key", "key"), (f.time, f"{who}.time", "time"),
                    (f.item, f"{who}.item", "integer" if f.id_type == "int" else "string")]
            continue
        what = "list" if f.is_bag else ("integer" if f.id_type == "int" else "string")
        out.append((f.source, who, what))
        if f.weights:
            out.append((f.weights, f"features.sparse[{i}].weights ({f.name})", "numbers"))
    return out


def _holds(t: pa.DataType, what: str, text: bool) -> bool:
    if text:  # every value of a text file is a string, parsed row by row
        return True
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        # strings: ids and delimited lists as they are; numbers (a label, a dense value, weights)
        # parsed as a text file's are, a value that is not a number rejecting its row
        return what in ("string", "list", "number", "numbers", "label", "key", "time")
    if what == "label":  # read by a label rule: numbers, text or true/false
        return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
    if what == "number":
        return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
    if what == "key":
        return not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_struct(t))
    if what == "time":
        return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_timestamp(t) \
            or pa.types.is_date(t)
    if what == "integer":  # floats too: a database's integer column with nulls reads as float
        return pa.types.is_integer(t) or pa.types.is_floating(t)
    if what == "string":
        return pa.types.is_integer(t)
    if what == "numbers":
        return pa.types.is_string(t) or pa.types.is_large_string(t) or (
            (pa.types.is_list(t) or pa.types.is_large_list(t))
            and (pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)))
    if what == "list":
        return (pa.types.is_list(t) or pa.types.is_large_list(t)) and \
            (pa.types.is_integer(t.value_type) or pa.types.is_string(t.value_type)
             or pa.types.is_large_string(t.value_type))
    return False


def check_columns(files: Sequence[str], schema: FeatureSchema, delimiter: str,
                  time_column: str | None = None) -> None:
    """Every file holds every column preprocessing reads (the schema's, with what its
    histories are built from, and ``time_column``: the split's), of a type that can hold it;
    else a ConfigError naming the column, the file and the type expected."""
    needs = _needs(schema, build=True)
    if time_column:
        needs.append((time_column, "preprocess.splits.by", "time"))
    expected = {"key": "a value per row (a number or a string)",
                "time": "numbers, timestamps, dates, or text holding them",
"number": "a number (integer or float)",
                "label": "numbers, strings or booleans (read by features.label.positive)", "integer": "integers (id_type: int)",
                "string": "strings or integers (id_type: string)",
                "list": "a list of integers or strings, or a delimited string (multi_hot)",
                "numbers": "a list of numbers, or a delimited string (the ids' weights)"}
    for f in files:
        if not os.path.exists(f):
            raise ConfigError(f"data.files: {f!r} does not exist")
        have = _file_schema(f, delimiter)
        for col, who, what in needs:
            if col not in have.names:
                raise ConfigError(f"{f}: column {col!r} ({who}) is missing; expected "
                                  f"{expected[what]}. The file's columns: {', '.join(have.names)}")
            t = have.field(col).type
            if not _holds(t, what, is_text(f)):
                raise ConfigError(f"{f}: column {col!r} ({who}) has type {t}; expected "
                                  f"{expected[what]}")
    if files and not any(_has_rows(f, delimiter) for f in files):
        raise ConfigError(f"data.files: no rows to read: {', '.join(map(str, files[:3]))}"
                          f"{' ...' if len(files) > 3 else ''} hold(s) a header or schema and no "
                          "rows")


def _has_rows(path: str, delimiter: str) -> bool:
    """Whether a file holds at least one row (a text file: its first block only)."""
    if not is_text(path):
        return pq.ParquetFile(path).metadata.num_rows > 0
    return any(b.num_rows for b in _text_batches(path, delimiter, None, 1 << 16))


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


def read_text_blocks(path: str, columns: Sequence[str], delimiter: str,
                     chunk_bytes: int) -> Iterator[pa.Table]:
    """A text file's rows, in order, in blocks of about ``chunk_bytes`` holding ``columns``
    (every value a string)."""
    for b in _text_batches(path, delimiter, list(dict.fromkeys(columns)), chunk_bytes):
        yield pa.Table.from_batches([b])


def read_row_group(path: str, index: int, columns: Sequence[str]) -> pa.Table:
    """Row group ``index`` of a parquet file with ``columns``, its ``key=value`` folders as
    string columns where it lacks them."""
    cols = list(dict.fromkeys(columns))
    pf = pq.ParquetFile(path)
    own = [c for c in cols if c in pf.schema_arrow.names]
    t = pf.read_row_group(index, columns=own)
    for k, v in partition_columns(path).items():
        if k in cols and k not in own:
            t = t.append_column(k, pa.array([v] * t.num_rows, pa.string()))
    return t


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
