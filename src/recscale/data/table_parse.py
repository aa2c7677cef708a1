"""A block of a table's rows -> ``Parsed`` (``recscale.data.encode``): raw dense values with
their presence, each sparse feature's raw ids as int64 keys (integers as they are, strings by
their stable hash, hex digits by value), lists cut by their truncation rule, and every row that
cannot be used marked with its reason: a label that is not 0 or 1, a dense value that is not a
number, an id not of its ``id_type``, an id below ``min_id`` or outside its table (``ids:
index``), a null inside a list, a list too long. Vectorised over the block (Arrow compute and
numpy); Python runs once per rejected row only."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recscale.data.criteo import HEX_LUT
from recscale.data.encode import Parsed
from recscale.data.label import non_binary_error
from recscale.data.schema import FeatureSchema, SparseFeature

_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
_INTEGER = r"^\s*[-+]?\d+\s*$"
_HEX = r"^\s*[0-9a-fA-F]{1,16}\s*$"
_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def stable_hash(values: Sequence[str]) -> np.ndarray:
    """64-bit FNV-1a of each string's UTF-8 bytes, as int64 (the same on every machine, process
    and engine, unlike Python's ``hash``). Vectorised over the strings, one pass per byte
    position."""
    arr = pa.array(values, type=pa.large_string()) if not isinstance(values, pa.Array) \
        else values.cast(pa.large_string())
    n = len(arr)
    h = np.full(n, _FNV_OFFSET, dtype=np.uint64)
    if n == 0:
        return h.view(np.int64)
    arr = arr.fill_null("")
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None \
        else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    with np.errstate(over="ignore"):
        for k in range(int(lengths.max(initial=0))):
            live = lengths > k
            h[live] = (h[live] ^ data[starts[live] + k].astype(np.uint64)) * _FNV_PRIME
    return h.view(np.int64)


def _strings(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return col if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) \
        else pc.cast(col, pa.string())


def _floats(col: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Values -> (float64, 0 where absent; present; bad: a string neither empty nor a
    number)."""
    bad = np.zeros(len(col), bool)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        # the pattern allows spaces around a number (" 5" after a comma); Arrow's cast does not
        trimmed = pc.utf8_trim_whitespace(col)
        empty = pc.fill_null(pc.equal(trimmed, ""), True)
        ok = pc.fill_null(pc.match_substring_regex(col, _NUMBER), False)
        bad = ~np.asarray(pc.or_(empty, ok).to_numpy(zero_copy_only=False), dtype=bool)
        col = pc.if_else(ok, trimmed, pa.scalar(None, col.type))
    x = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
    present = ~np.isnan(x)
    return np.where(present, x, 0.0), present, bad


def _numbers(col, name: str, p: Parsed, what: str) -> tuple[np.ndarray, np.ndarray]:
    """A column -> (float64 values, present); a value that is not a number rejects its row."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    x, present, bad = _floats(col)
    if bad.any():
        vals = col.to_numpy(zero_copy_only=False)
        p.reject(bad, lambda r: f"{what}: {name}={str(vals[r])[:40]!r} is not a number")
    return x, present


def reject_values(where: np.ndarray, out: np.ndarray, shown: np.ndarray, p: Parsed,
                  reason: Callable[[object], str]) -> None:
    """The rows holding a value flagged in ``out`` are rejected (``where[i]``: the block row of
    value ``i``), ``reason(value)`` naming each row's first such value."""
    bad = np.zeros(p.n, bool)
    bad[where[out]] = True
    first: dict[int, object] = {}
    for i in np.flatnonzero(out):
        first.setdefault(int(where[i]), shown[i])
    p.reject(bad, lambda r: reason(first[r]))


def _hex_values(s: pa.Array) -> np.ndarray:
    """Strings of 1-16 hex digits (already checked) -> their values, as int64 (the 64-bit
    pattern): left-padded to 16 digits, one table lookup per byte."""
    padded = pc.utf8_lpad(pc.utf8_trim_whitespace(s), 16, "0").cast(pa.large_string())
    offsets = np.frombuffer(padded.buffers()[1], dtype=np.int64)[
        padded.offset: padded.offset + len(padded) + 1]
    raw = np.frombuffer(padded.buffers()[2], dtype=np.uint8)[offsets[0]: offsets[-1]]
    nib = HEX_LUT[raw.reshape(len(padded), 16)].astype(np.uint64)
    shifts = np.arange(60, -4, -4, dtype=np.uint64)
    return np.bitwise_or.reduce(nib << shifts[None, :], axis=1).view(np.int64)


def _keys(values: pa.Array, f: SparseFeature, where: np.ndarray, p: Parsed) -> np.ndarray:
    """Raw ids (int or string values) -> int64 keys; a value not of ``id_type`` rejects its row
    (``where[i]``: the block row of value ``i``)."""
    if f.id_type == "int" and pa.types.is_integer(values.type):
        return values.cast(pa.int64()).to_numpy(zero_copy_only=False)
    if f.id_type == "int" and pa.types.is_floating(values.type):
        x = values.to_numpy(zero_copy_only=False).astype(np.float64)
        whole = np.isfinite(x) & (x == np.round(x)) & (np.abs(x) < 2.0**63)
        if not whole.all():
            reject_values(where, ~whole, x, p,
                          lambda v: f"bad id: {f.name}={float(v)!r} is not an integer")
        return np.where(whole, x, 0).astype(np.int64)
    s = _strings(values)
    if f.id_type == "string":
        return stable_hash(s)
    pattern = _INTEGER if f.id_type == "int" else _HEX
    ok = np.asarray(pc.fill_null(pc.match_substring_regex(s, pattern), False)
                    .to_numpy(zero_copy_only=False), dtype=bool)
    if not ok.all():
        kind = "an integer" if f.id_type == "int" else "hexadecimal"
        reject_values(where, ~ok, s.to_numpy(zero_copy_only=False), p,
                      lambda v: f"bad id: {f.name}={str(v)[:40]!r} is not {kind}")
    good = pc.if_else(pa.array(ok), s, pa.scalar("0", s.type))
    if f.id_type == "int":
        return pc.cast(pc.utf8_trim_whitespace(good), pa.int64()).to_numpy(zero_copy_only=False)
    return _hex_values(good)


def _lists(col, delimiter: str) -> tuple[np.ndarray, pa.Array]:
    """A list column, or a text column of delimited lists (empty: null) -> (each row's length,
    int64; the values flattened)."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = pc.if_else(pc.fill_null(pc.equal(pc.utf8_trim_whitespace(col), ""), True),
                         pa.scalar(None, col.type), col)
        col = pc.split_pattern(col, delimiter)
    lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
    return lengths.astype(np.int64), pc.list_flatten(col)


def _bags(col, f: SparseFeature, max_bag: int, p: Parsed,
          weights: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A sparse feature's column -> (lengths, keys); ``weights``: [the weights column] for a
    weighted feature, replaced by its weights aligned with the keys kept."""
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
    lengths, flat = _lists(col, f.delimiter)
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
    if weights is not None:  # the same ids kept: the same weights
        weights.append(_weights(weights.pop(), f, lengths, p)[keep])
    lengths = np.bincount(row_of[keep], minlength=p.n).astype(np.int64)
    return lengths, keys


def _weights(col, f: SparseFeature, lengths: np.ndarray, p: Parsed) -> np.ndarray:
    """A weighted feature's weights column -> float64 weights, one per id (before truncation);
    a row whose weights are not numbers, hold a null or are not as many as its ids is
    rejected."""
    n_w, flat = _lists(col, f.delimiter)
    short = n_w != lengths
    p.reject(short, lambda r: f"bad weights: {f.name} has {n_w[r]} weights for {lengths[r]} ids "
             f"(column {f.weights})")
    where = np.repeat(np.arange(p.n), n_w)
    x, present, _ = _floats(flat)
    nulls = ~np.asarray(flat.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if nulls.any():
        reject_values(where, nulls, nulls, p,
                      lambda v: f"null in list: {f.weights} holds a null weight ({f.name})")
    bad = (~present | ~np.isfinite(x)) & ~nulls  # not a number (or empty, or not finite)
    if bad.any():
        shown = flat.to_numpy(zero_copy_only=False)
        reject_values(where, bad, shown, p,
                      lambda v: f"bad weight: {f.weights}={str(v)[:40]!r} is not a number")
    if short.any():  # align: the rows whose counts differ keep no weights (they are rejected)
        out = np.zeros(int(lengths.sum()), np.float64)
        ok_rows = ~short
        src = np.repeat(ok_rows, n_w)
        dst = np.repeat(ok_rows, lengths)
        out[dst] = x[src]
        return out
    return x


def _labels(col, schema: FeatureSchema, p: Parsed) -> np.ndarray:
    """The label column -> 0/1 clicks: read by the schema's rule, or as 0/1 numbers. A row with
    no label, or one the rule cannot read, is rejected; a column of other numbers (ratings,
    counts) stops preprocessing, saying which rule to write."""
    name, rule = schema.label_column, schema.label_rule
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if rule is None or rule.numeric:
        lab, present = _numbers(col, name, p, "bad label")
        if rule is not None:
            ok = present
            click = rule.clicks_of_numbers(lab)
        else:
            ok = present & ((lab == 0) | (lab == 1))
            other = present & ~ok
            if present.sum() >= 20 and other.sum() * 2 > present.sum():  # ratings, counts: no clicks
                raise non_binary_error(name, [float(v) for v in dict.fromkeys(lab[other])])
            click = lab == 1
        p.reject(~ok & ~p.bad, lambda r: f"bad label: {name}="
                 f"{f'{lab[r]:g}' if present[r] else 'missing'}"
                 f"{' is not 0 or 1' if rule is None else ''}")
        return np.where(ok, click, 0).astype(np.int8)
    text = pc.utf8_trim_whitespace(_strings(col))
    present = np.asarray(pc.fill_null(pc.not_equal(text, ""), False).to_numpy(
        zero_copy_only=False), dtype=bool)
    values = np.asarray(text.fill_null("").to_numpy(zero_copy_only=False), dtype=object)
    p.reject(~present & ~p.bad, lambda r: f"bad label: {name}=missing")
    return (present & rule.clicks_of_text(values)).astype(np.int8)


def parse_block(t: pa.Table, schema: FeatureSchema, max_bag: int, label: bool = True) -> Parsed:
    """``label=False``: rows to score, without a label column (every label 0)."""
    n = t.num_rows
    p = Parsed(n, np.zeros(n, np.int8), [], [], np.zeros(n, bool))
    if label:
        p.label = _labels(t.column(schema.label_column), schema, p)
    for f in schema.dense:
        p.dense.append(_numbers(t.column(f.source), f.name, p, "bad dense value"))
    for j, f in enumerate(schema.sparse):
        w = [t.column(f.weights)] if f.weights else None
        lengths, keys = _bags(t.column(f.source), f, max_bag, p, w)
        if w is not None:
            p.weights[j] = w[0].astype(np.float32)
        if f.min_id is not None and (keys < f.min_id).any():
            reject_values(np.repeat(np.arange(p.n), lengths), keys < f.min_id, keys, p,
                          lambda v, f=f: f"negative id: {f.name}={int(v)}" if f.min_id == 0
                          else f"id below min_id: {f.name}={int(v)} < {f.min_id}")
        if f.ids == "index":
            _check_range(lengths, keys, f, int(schema.table_of(f.table_name).rows), p)
        p.keys.append((lengths, keys))
    return p


def _check_range(lengths: np.ndarray, keys: np.ndarray, f: SparseFeature, size: int,
                 p: Parsed) -> None:
    """``ids: index``: an id outside [0, size) rejects its row (before anything is fitted)."""
    out = (keys < 0) | (keys >= size)
    if out.any():
        reject_values(np.repeat(np.arange(p.n), lengths), out, keys, p,
                      lambda v: f"id outside table: {f.name}={int(v)} is not in [0, {size}) "
                      f"(table {f.table_name})")
