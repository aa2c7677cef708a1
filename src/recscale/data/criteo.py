"""The Criteo click-log TSV format: encode, and a streaming reader that never drops a row silently.

A line is ``label<TAB>I1..I13<TAB>C1..C26``: label 0/1, 13 integer counts, 26 categorical ids as
8-hex-digit strings; an empty field is a missing value. The reader works on fixed-size byte chunks
(memory bounded by ``chunk_bytes`` whatever the file size). Field counts and stray bytes are checked
with numpy over the raw bytes, so every line keeps its exact line number; well-formed lines are parsed
by pyarrow's CSV reader; value checks are vectorised per column. A line that fails any check is
written to the rejects file with its line number and the reason.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

log = logging.getLogger(__name__)

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE
DENSE_NAMES = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
SPARSE_NAMES = tuple(f"C{i}" for i in range(1, NUM_SPARSE + 1))
COLUMN_NAMES = ("label",) + DENSE_NAMES + SPARSE_NAMES

_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
# byte -> nibble value; 255 marks a byte that is not a hex digit
HEX_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    HEX_LUT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    HEX_LUT[_c] = 10 + _i


class RejectedRowsError(RuntimeError):
    """Too many input rows could not be parsed (more than the configured fraction)."""


@dataclass
class CriteoBlock:
    """Parsed rows in columnar numpy form. Missing values are marked by the masks.

    ``line``: 1-based line number in its file; ``dense``: int64 [n, 13] (0 where missing);
    ``sparse``: uint32 [n, 26] raw 32-bit ids (0 where missing).
    """

    line: np.ndarray
    label: np.ndarray
    dense: np.ndarray
    dense_present: np.ndarray
    sparse: np.ndarray
    sparse_present: np.ndarray

    def __len__(self) -> int:
        return int(self.label.shape[0])


def hex8(values: np.ndarray) -> pa.Array:
    """uint32 array -> pyarrow string array of 8 lowercase hex digits, built without Python loops."""
    v = values.astype(np.uint32, copy=False)
    shifts = np.arange(28, -4, -4, dtype=np.uint32)
    nibbles = (v[:, None] >> shifts[None, :]) & 0xF
    data = _HEX_DIGITS[nibbles].tobytes()
    offsets = np.arange(0, 8 * (len(v) + 1), 8, dtype=np.int32)
    return pa.StringArray.from_buffers(len(v), pa.py_buffer(offsets.tobytes()), pa.py_buffer(data))


def encode_tsv(block: CriteoBlock) -> bytes:
    """Serialise rows in the Criteo TSV format (what the reader reads back exactly)."""
    cols = [pa.array(block.label.astype(np.int64))]
    for j in range(NUM_DENSE):
        cols.append(pa.array(block.dense[:, j], mask=~block.dense_present[:, j]))
    for j in range(NUM_SPARSE):
        arr = hex8(block.sparse[:, j])
        cols.append(pc.if_else(pa.array(block.sparse_present[:, j]), arr, pa.scalar(None, pa.string())))
    table = pa.Table.from_arrays(cols, names=list(COLUMN_NAMES))
    out = io.BytesIO()
    pacsv.write_csv(
        table,
        out,
        pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none"),
    )
    return out.getvalue()


@dataclass
class RejectLog:
    """Counts rejected lines and writes them (line number, reason, text) to a TSV file."""

    path: Path | None
    total_lines: int | None = None
    max_fraction: float = 0.01
    count: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    _fh: io.TextIOBase | None = None

    def add(self, source: str, line: int, reason: str, text: bytes) -> None:
        self.count += 1
        kind = reason.split(":")[0]
        self.by_reason[kind] = self.by_reason.get(kind, 0) + 1
        if self.path is not None:
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
                self._fh.write("file\tline\treason\ttext\n")
            shown = text[:500].decode("utf-8", "backslashreplace").replace("\t", "\\t")
            self._fh.write(f"{source}\t{line}\t{reason}\t{shown}\n")
        if self.total_lines and self.count > self.max_fraction * self.total_lines:
            self.close()
            raise RejectedRowsError(
                f"{self.count} of {self.total_lines} input lines rejected (more than "
                f"max_reject_fraction={self.max_fraction}); last: {source} line {line}: {reason}. "
                f"See {self.path} for every rejected line and its reason."
            )

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def count_lines(path: str | os.PathLike, chunk_bytes: int = 1 << 24) -> int:
    """Number of lines (a last line without newline counts), in bounded memory."""
    n = 0
    last = b"\n"
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def _line_chunks(path: str | os.PathLike, chunk_bytes: int) -> Iterator[tuple[int, bytes]]:
    """Yield (first line number, bytes of whole lines incl. final newline) chunks."""
    line_no = 1
    rest = b""
    with open(path, "rb") as fh:
        while True:
            data = fh.read(chunk_bytes)
            if not data:
                break
            data = rest + data
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            chunk, rest = data[: cut + 1], data[cut + 1 :]
            yield line_no, chunk
            line_no += chunk.count(b"\n")
    if rest:
        yield line_no, rest + b"\n"


def _parse_hex(col: pa.ChunkedArray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (uint32 values, present mask, bad mask) for a string column of 8-hex-digit ids."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    present = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    lengths = pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
    bad = present & (lengths != 8)
    good = present & ~bad
    if not good.any():
        return np.zeros(n, np.uint32), present & ~bad, bad
    filled = pc.if_else(pa.array(good), arr, pa.scalar("00000000"))
    if isinstance(filled, pa.ChunkedArray):
        filled = filled.combine_chunks()
    offsets = np.frombuffer(filled.buffers()[1], dtype=np.int32)[filled.offset : filled.offset + n + 1]
    raw = np.frombuffer(filled.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    nib = HEX_LUT[raw.reshape(n, 8)]
    nonhex = (nib == 255).any(axis=1)
    bad |= good & nonhex
    nib = np.where(nib == 255, 0, nib).astype(np.uint32)
    shifts = np.arange(28, -4, -4, dtype=np.uint32)
    values = (nib << shifts[None, :]).sum(axis=1, dtype=np.uint64).astype(np.uint32)
    present = present & ~bad
    return np.where(present, values, 0).astype(np.uint32), present, bad


def _parse_int(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (int64 values, present mask, bad mask) for a string column of decimal integers.

    A value is an integer when it matches ``^[+-]?[0-9]{1,18}$`` (at most 18 digits always fit
    int64), whatever else the chunk holds; a leading ``+`` is dropped before the cast (Arrow's
    cast refuses it). Both engines parse with this code (the Spark engine in its tasks)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    present = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    ok = pc.match_substring_regex(arr, r"^[+-]?[0-9]{1,18}$").fill_null(True)
    bad = ~ok.to_numpy(zero_copy_only=False)
    good = pc.if_else(ok, arr, pa.scalar(None, pa.string())) if bad.any() else arr
    ints = pc.cast(pc.replace_substring_regex(good, r"^\+", ""), pa.int64())
    present &= ~bad
    return ints.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), present, bad


def _parse_block(buf: bytes, first_line: int, source: str, rejects: RejectLog) -> CriteoBlock:
    """Parse whole lines in ``buf``; rejected lines go to ``rejects``."""
    b = np.frombuffer(buf, dtype=np.uint8)
    nl = np.flatnonzero(b == 10)
    n_lines = len(nl)
    starts = np.concatenate(([0], nl[:-1] + 1))
    # per-line counts of tabs and of bytes that cannot appear in a Criteo line (positions ->
    # line index -> bincount: no per-byte int64 arrays, so memory stays a small multiple of the
    # chunk)
    def per_line(mask: np.ndarray) -> np.ndarray:
        pos = np.flatnonzero(mask)
        return np.bincount(np.searchsorted(nl, pos), minlength=n_lines)[:n_lines]

    n_tabs = per_line(b == 9)
    n_stray = per_line((b >= 127) | ((b < 32) & (b != 9) & (b != 10)))
    empty = nl == starts
    ok = (~empty) & (n_tabs == NUM_FIELDS - 1) & (n_stray == 0)
    lines = first_line + np.arange(n_lines, dtype=np.int64)

    def text(i: int) -> bytes:
        return bytes(b[starts[i] : nl[i]])

    found: list[tuple[int, str, bytes]] = []  # (line, reason, text): recorded in line order
    for i in np.flatnonzero(~ok):
        if empty[i]:
            reason = "empty line"
        elif n_stray[i]:
            reason = "bad byte: non-printable or non-ASCII character"
        else:
            reason = f"field count: expected {NUM_FIELDS} tab-separated fields, found {n_tabs[i] + 1}"
        found.append((int(lines[i]), reason, text(i)))

    if not ok.any():
        _record(rejects, source, found)
        return _empty_block()
    if ok.all():
        good_buf = buf
    else:
        line_of_byte = np.repeat(np.arange(n_lines), nl - starts + 1)
        good_buf = b[ok[line_of_byte]].tobytes()
    good_idx = np.flatnonzero(ok)
    table = pacsv.read_csv(
        io.BytesIO(good_buf),
        read_options=pacsv.ReadOptions(column_names=list(COLUMN_NAMES), use_threads=True),
        parse_options=pacsv.ParseOptions(
            delimiter="\t", quote_char=False, double_quote=False, escape_char=False,
            newlines_in_values=False, ignore_empty_lines=False,
        ),
        convert_options=pacsv.ConvertOptions(
            column_types={c: pa.string() for c in COLUMN_NAMES},
            strings_can_be_null=True,
            null_values=[""],
            quoted_strings_can_be_null=False,
        ),
    )
    n = table.num_rows
    assert n == len(good_idx), (n, len(good_idx))
    bad_reason = np.full(n, -1, dtype=np.int64)  # index of first bad column, -1 if row is fine

    label_col = table.column("label").combine_chunks()
    label_ok = pc.is_in(label_col, pa.array(["0", "1"])).fill_null(False).to_numpy(zero_copy_only=False)
    label = (pc.equal(label_col, "1").fill_null(False).to_numpy(zero_copy_only=False)).astype(np.int8)
    bad_reason[~label_ok] = 0

    dense = np.zeros((n, NUM_DENSE), np.int64)
    dense_present = np.zeros((n, NUM_DENSE), bool)
    for j, name in enumerate(DENSE_NAMES):
        dense[:, j], dense_present[:, j], bad = _parse_int(table.column(name))
        bad_reason[(bad_reason < 0) & bad] = 1 + j
    sparse = np.zeros((n, NUM_SPARSE), np.uint32)
    sparse_present = np.zeros((n, NUM_SPARSE), bool)
    for j, name in enumerate(SPARSE_NAMES):
        sparse[:, j], sparse_present[:, j], bad = _parse_hex(table.column(name), n)
        bad_reason[(bad_reason < 0) & bad] = 1 + NUM_DENSE + j

    keep = bad_reason < 0
    for r in np.flatnonzero(~keep):
        c = int(bad_reason[r])
        name = COLUMN_NAMES[c]
        value = table.column(name)[int(r)].as_py()
        if c == 0:
            reason = f"label: must be 0 or 1, got {value!r}"
        elif c <= NUM_DENSE:
            reason = f"{name}: not an integer: {value!r}"
        else:
            reason = f"{name}: not an 8-digit hex id: {value!r}"
        found.append((int(lines[good_idx[r]]), reason, text(int(good_idx[r]))))
    _record(rejects, source, found)
    return CriteoBlock(
        line=lines[good_idx][keep],
        label=label[keep],
        dense=dense[keep],
        dense_present=dense_present[keep],
        sparse=sparse[keep],
        sparse_present=sparse_present[keep],
    )


def _criteo_text(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column of Criteo values (numbers or text) as the TSV field a line would hold: missing
    as empty, a float holding a whole number as that integer (a frame's count column with gaps
    is float), a line break inside a value as a carriage return (so it stays one line, and the
    reader rejects it as a bad byte)."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_floating(col.type):
        x = col.to_numpy(zero_copy_only=False)
        whole = np.isfinite(x) & (np.floor(x) == x) & (np.abs(x) < 2.0**62)
        ints = pa.array(np.where(whole, x, 0).astype(np.int64)).cast(pa.string())
        col = pc.if_else(pa.array(whole), ints, pc.cast(col, pa.string()))
    elif pa.types.is_boolean(col.type):
        col = pc.cast(pc.cast(col, pa.int8()), pa.string())
    elif not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        col = pc.cast(col, pa.string())
    col = pc.replace_substring(pc.cast(col, pa.string()), "\n", "\r")
    return pc.fill_null(col, "")


def criteo_rows(t: pa.Table, labels: bool) -> tuple[CriteoBlock, dict[int, str]]:
    """Rows of Criteo's 40 columns in a table (a served model's request, a scored table's
    block) read by this reader, as if they were TSV lines: -> the rows it accepts (``line``:
    the row's position + 1) and why each other row is rejected, by position (the same reasons
    preprocessing writes to rejects.tsv). ``labels=False``: the rows bring no label."""
    n = t.num_rows
    cols = [_criteo_text(t.column(c)) if c != "label" or labels else pa.array(["0"] * n)
            for c in COLUMN_NAMES]
    lines = pc.binary_join_element_wise(*cols, "\t")
    buf = ("\n".join(lines.to_pylist()) + "\n").encode() if n else b""
    found = _Found()
    block = _parse_block(buf, 1, "rows", found) if n else _empty_block()
    return block, found.reasons


class _Found:
    """Collects a block's rejected lines' reasons (a RejectLog's ``add``), by row position."""

    def __init__(self):
        self.reasons: dict[int, str] = {}

    def add(self, source: str, line: int, reason: str, text: bytes) -> None:
        self.reasons[line - 1] = reason


def _record(rejects: RejectLog, source: str, found: list[tuple[int, str, bytes]]) -> None:
    """A chunk's rejected lines in line order (whichever check caught them), so the rejects file
    reads in input order whatever the chunk size or engine."""
    for line, reason, text in sorted(found, key=lambda f: f[0]):
        rejects.add(source, line, reason, text)


def _empty_block() -> CriteoBlock:
    return CriteoBlock(
        line=np.zeros(0, np.int64),
        label=np.zeros(0, np.int8),
        dense=np.zeros((0, NUM_DENSE), np.int64),
        dense_present=np.zeros((0, NUM_DENSE), bool),
        sparse=np.zeros((0, NUM_SPARSE), np.uint32),
        sparse_present=np.zeros((0, NUM_SPARSE), bool),
    )


def read_criteo_tsv(
    path: str | os.PathLike,
    rejects: RejectLog | None = None,
    chunk_bytes: int = 1 << 25,
    before_line: int | None = None,
) -> Iterator[CriteoBlock]:
    """Stream a Criteo TSV file as parsed blocks of at most ``chunk_bytes`` of input each.

    Every line either appears in a yielded block (with its line number) or is recorded in
    ``rejects``; nothing is dropped silently. Memory stays bounded by a few times ``chunk_bytes``.
    ``before_line``: the caller needs only the lines before this one (1-based); reading stops at
    the first chunk that starts at or after it (the last block read may hold later lines).
    """
    if chunk_bytes < 1024:
        raise ValueError(f"chunk_bytes={chunk_bytes} is too small: expected at least 1024")
    rejects = rejects if rejects is not None else RejectLog(path=None, max_fraction=1.0)
    source = str(path)
    for first_line, buf in _line_chunks(path, chunk_bytes):
        if before_line is not None and first_line >= before_line:
            return
        block = _parse_block(buf, first_line, source, rejects)
        if len(block):
            yield block
