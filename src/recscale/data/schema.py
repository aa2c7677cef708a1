"""One file (over 500 lines): the schema's types check each other (a history takes its item
feature's table and id policy, shared tables agree, the fitted schema re-parses the schema), so
the feature kinds, the schema and its fitted form are read together.

The feature schema: which column is the label, which are dense features and how each is
transformed, which are categorical features (one id per row) or multi-hot features (a bag of ids
per row), and which embedding table each one looks its ids up in, with that table's rows and dim.

Declared in the ``features`` block of parameters_dlrm.yml (``criteo``, the default, is the preset
of Criteo's 13 counts and 26 ids), resolved by preprocessing (the tables' rows from the ids
policy and the data) and written into the dataset's manifest as the *fitted* schema
(``FittedSchema``), which every later stage reads: the loader, the model and its embedding
collections, the planner's table specs, scoring, the retrain and the machine's measurement.

Transforms of a dense feature, applied in order to its raw value (float64), then to float32; a
missing value is ``missing`` (after the transforms): ``log1p``; ``{"clip": [low, high]}`` (either
may be null: no bound); ``standardize`` (minus the mean, over the standard deviation, both of the
value so far over the train split's present rows, fitted by preprocessing and kept in the
manifest); ``{"bucketize": [b1, b2, ...]}`` (last only: the value's bucket, ``i`` where
``b_i <= x < b_{i+1}``, 0 below ``b1``, which makes the feature categorical: its own table of
``len(boundaries) + 1`` rows; a missing value is an empty bag).

Ids of a sparse feature (``ids``): ``hash`` (an integer id modulo the table's rows; a string id's
64-bit FNV-1a hash, ``table_parse.stable_hash``, modulo them), ``vocab`` (a frequency-thresholded vocabulary
of the train split's ids, ``min_count`` / ``max_size``, row 0 for every other id:
``recscale.data.vocab``) or ``index`` (the ids are rows already: one outside ``[0, rows)`` is a
rejected row). A multi-hot feature's list (a list column, or in text a string split at
``delimiter``) may hold at most ``max_len`` ids; a longer one is rejected (``truncate: reject``)
or cut to its first or last ``max_len`` (``keep_first`` / ``keep_last``).

A history feature (``kind: history``, ``key``, ``item``, ``time``, ``max_len``: default 10) is a
bag preprocessing builds: for each row, the ``item`` values of the previous rows of the same
``key`` strictly before the row's ``time``, the latest ``max_len`` of them
(``recscale.data.history``). It looks its ids up in the table of the feature that reads
``item`` (its id type and policy with it); a served model takes it as a list column of its own
name, as a multi-hot feature.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from recscale.config import Validated, check, check_choice, parse, to_dict
from recscale.data.label import LabelRule

TRANSFORMS = ("log1p", "clip", "standardize", "bucketize")
SPARSE_KINDS = ("categorical", "multi_hot", "history")
HISTORY_MAX_LEN = 10  # a history feature's default max_len
ID_TYPES = ("int", "hex", "string")  # hex: Criteo's 8-hex-digit ids
ID_POLICIES = ("hash", "vocab", "index")
TRUNCATE = ("reject", "keep_first", "keep_last")
POOLING = ("sum", "mean")


def _transform_name(t: Any) -> str:
    if isinstance(t, str):
        return t
    if isinstance(t, Mapping) and len(t) == 1:
        return next(iter(t))
    return repr(t)


@dataclass(frozen=True)
class DenseFeature(Validated):
    """A dense feature: its source ``column`` (default: its name), the value a missing row gets
    (after the transforms) and the transforms, in order."""

    name: str
    column: str = ""
    missing: float = 0.0
    transforms: tuple[Any, ...] = ("log1p",)

    @property
    def source(self) -> str:
        return self.column or self.name

    def validate(self, prefix: str = "features.dense") -> None:
        check(isinstance(self.name, str) and bool(self.name), f"{prefix}.name", self.name,
              "a non-empty name")
        for i, t in enumerate(self.transforms):
            key = f"{prefix}.transforms[{i}]"
            name = _transform_name(t)
            check_choice(key, name, TRANSFORMS)
            if name == "log1p":
                check(t == "log1p", key, t, "'log1p' (it takes no arguments)")
            if name in ("log1p", "standardize"):
                check(t == name, key, t, f"{name!r} (it takes no arguments)")
            if name == "clip":
                bounds = t["clip"] if isinstance(t, Mapping) else None
                check(isinstance(bounds, (list, tuple)) and len(bounds) == 2
                      and all(b is None or isinstance(b, (int, float)) for b in bounds)
                      and (None in bounds or bounds[0] <= bounds[1]), key, t,
                      "{clip: [low, high]} with low <= high (either null: no bound)")
            if name == "bucketize":
                b = t["bucketize"] if isinstance(t, Mapping) else None
                check(isinstance(b, (list, tuple)) and len(b) >= 1
                      and all(isinstance(v, (int, float)) for v in b)
                      and all(x < y for x, y in zip(b, b[1:])), key, t,
                      "{bucketize: [b1, b2, ...]}: at least one boundary, strictly increasing")
                check(i == len(self.transforms) - 1, key, t,
                      "the last transform (it makes the feature categorical)")

    @property
    def boundaries(self) -> tuple[float, ...] | None:
        """The bucketize boundaries (the feature is categorical), or None."""
        last = self.transforms[-1] if self.transforms else None
        if isinstance(last, Mapping) and "bucketize" in last:
            return tuple(float(b) for b in last["bucketize"])
        return None

    @property
    def standardizes(self) -> bool:
        return "standardize" in self.transforms

    def numeric(self, raw: np.ndarray, stats: Mapping[str, float] | None = None,
                until_standardize: bool = False) -> np.ndarray:
        """The transforms but ``bucketize`` on raw values (float64); ``stats``: the fitted mean
        and std of ``standardize``. ``until_standardize``: stop before it (what its statistics
        are fitted on)."""
        # float64 input is not copied: every step below makes a new array
        x = np.asarray(raw, dtype=np.float64)
        for t in self.transforms:
            if t == "log1p":
                x = np.log1p(x)
            elif t == "standardize":
                if until_standardize:
                    return x
                if stats is None:
                    raise ValueError(f"dense feature {self.name}: standardize has no fitted "
                                     "statistics (preprocessing fits them on the train split)")
                x = (x - stats["mean"]) / stats["std"]
            elif isinstance(t, Mapping) and "clip" in t:
                low, high = t["clip"]
                if low is not None:
                    x = np.maximum(x, float(low))
                if high is not None:
                    x = np.minimum(x, float(high))
        return x

    def apply(self, raw: np.ndarray, present: np.ndarray,
              stats: Mapping[str, float] | None = None) -> np.ndarray:
        """Raw values (any numeric dtype) -> the model's float32 input; rows not ``present`` get
        ``missing``. (A bucketized feature: ``bucket``.)"""
        out = self.numeric(raw, stats).astype(np.float32)
        out[~present] = np.float32(self.missing)
        return out

    def bucket(self, raw: np.ndarray, stats: Mapping[str, float] | None = None) -> np.ndarray:
        """A bucketized feature's raw values -> bucket indices (int64, 0..len(boundaries))."""
        x = self.numeric(raw, stats)
        return np.searchsorted(np.asarray(self.boundaries), x, side="right").astype(np.int64)


@dataclass(frozen=True)
class SparseFeature(Validated):
    """A categorical (one id per row) or multi-hot (a bag of ids per row) feature: its source
    ``column`` (default: its name), how its raw ids are written (``int``, or ``hex`` for Criteo's
    8-hex-digit ids) and its ``table`` (default: a table of its own, named as the feature)."""

    name: str
    column: str = ""
    kind: Literal["categorical", "multi_hot", "history"] = "categorical"
    id_type: Literal["int", "hex", "string"] = "int"
    table: str = ""
    ids: Literal["hash", "vocab", "index"] = "hash"
    min_count: int = 1  # ids: vocab
    max_size: int | None = None  # ids: vocab (the most frequent kept; null: no cap)
    max_len: int | None = None  # multi_hot: most ids in a row's list (null: preprocess.max_bag_size)
    truncate: Literal["reject", "keep_first", "keep_last"] = "reject"
    delimiter: str = "|"  # multi_hot in a text source: the list's separator
    min_id: int | None = None  # id_type int: a smaller id rejects its row (null: any integer)
    pooling: Literal["sum", "mean"] = "sum"  # a bag's ids summed, or averaged (an empty bag: 0)
    # multi_hot: the column of each id's weight (a list as long as the ids', or in text a
    # string split at ``delimiter``); the bag is the weighted sum (or its mean). null: weight 1
    weights: str | None = None
    # kind: history: the columns of the rows' key (e.g. the user), item and time
    key: str | None = None
    item: str | None = None
    time: str | None = None

    @property
    def is_bag(self) -> bool:
        """A bag of ids per row (multi-hot, or a history)."""
        return self.kind != "categorical"

    @property
    def source(self) -> str:
        return self.column or self.name

    @property
    def table_name(self) -> str:
        return self.table or self.name

    def validate(self, prefix: str = "features.sparse") -> None:
        check(isinstance(self.name, str) and bool(self.name), f"{prefix}.name", self.name,
              "a non-empty name")
        check_choice(f"{prefix}.kind", self.kind, SPARSE_KINDS)
        check_choice(f"{prefix}.id_type", self.id_type, ID_TYPES)
        check_choice(f"{prefix}.ids", self.ids, ID_POLICIES)
        check_choice(f"{prefix}.truncate", self.truncate, TRUNCATE)
        check_choice(f"{prefix}.pooling", self.pooling, POOLING)
        check(self.min_count >= 1, f"{prefix}.min_count", self.min_count, ">= 1")
        check(self.max_size is None or self.max_size >= 1, f"{prefix}.max_size", self.max_size,
              "null or >= 1")
        check(self.max_len is None or self.max_len >= 1, f"{prefix}.max_len", self.max_len,
              "null or >= 1")
        check(self.is_bag or (self.max_len is None and self.truncate == "reject"),
              f"{prefix}.max_len", self.max_len, "unset for a categorical feature (one id a row)")
        check(isinstance(self.delimiter, str) and len(self.delimiter) >= 1,
              f"{prefix}.delimiter", self.delimiter, "a non-empty string")
        check(self.ids != "index" or self.id_type == "int", f"{prefix}.id_type", self.id_type,
              "'int' with ids: index (the ids are the table's rows)")
        check(self.min_id is None or self.id_type == "int", f"{prefix}.min_id", self.min_id,
              "null unless id_type is 'int'")
        for key in ("key", "item", "time"):
            value = getattr(self, key)
            if self.kind == "history":
                check(isinstance(value, str) and bool(value), f"{prefix}.{key}", value,
                      f"the column of the rows' {key} (kind: history)")
            else:
                check(value is None, f"{prefix}.{key}", value, "unset unless kind is history")
        check(self.weights is None or (self.kind == "multi_hot" and isinstance(self.weights, str)
                                       and bool(self.weights)), f"{prefix}.weights",
              self.weights, "null, or for a multi_hot feature the column of its ids' weights")

    @property
    def weights_column(self) -> str:
        """The processed parquet's column of this feature's id weights."""
        return f"{self.name}.weights"


@dataclass(frozen=True)
class EmbeddingTable(Validated):
    """An embedding table: its ``rows`` (null: what the ids policy gives, the hash buckets or
    the vocabulary's size) and ``dim`` (null: ``model.embedding_dim``; a multiple of 4, as
    fbgemm's kernels need)."""

    name: str
    rows: int | None = None
    dim: int | None = None

    def validate(self, prefix: str = "features.tables") -> None:
        check(isinstance(self.name, str) and bool(self.name), f"{prefix}.name", self.name,
              "a non-empty name")
        check(self.rows is None or self.rows >= 1, f"{prefix}.rows", self.rows,
              "null or a positive integer")
        check(self.dim is None or (self.dim >= 4 and self.dim % 4 == 0), f"{prefix}.dim",
              self.dim, "null or a positive multiple of 4 (fbgemm's row alignment)")


@dataclass(frozen=True)
class FeatureSchema(Validated):
    """The ``features`` block: the label column, the dense and the sparse features, and the
    tables (a feature whose table is not listed gets one of its own, rows and dim from the
    defaults)."""

    label: str | LabelRule = "label"  # the 0/1 column, or {column, positive}: recscale.data.label
    dense: tuple[DenseFeature, ...] = ()
    sparse: tuple[SparseFeature, ...] = ()
    tables: tuple[EmbeddingTable, ...] = ()

    def __post_init__(self) -> None:
        # a history looks up the table of the feature that reads its item column, with that
        # feature's id type and policy, keeping the most recent ids
        by_column = {f.source: f for f in self.sparse if f.kind != "history"}
        resolved = []
        for f in self.sparse:
            item = by_column.get(f.item) if f.kind == "history" else None
            if item is not None:
                f = dataclasses.replace(
                    f, table=f.table or item.table_name, id_type=item.id_type, ids=item.ids,
                    min_count=item.min_count, max_size=item.max_size, min_id=item.min_id,
                    max_len=f.max_len or HISTORY_MAX_LEN, truncate="keep_last")
            elif f.kind == "history" and f.max_len is None:
                f = dataclasses.replace(f, max_len=HISTORY_MAX_LEN, truncate="keep_last")
            resolved.append(f)
        object.__setattr__(self, "sparse", tuple(resolved))
        super().__post_init__()

    @property
    def histories(self) -> tuple[SparseFeature, ...]:
        """The history features preprocessing builds (``recscale.data.history``)."""
        return tuple(f for f in self.sparse if f.kind == "history")

    def validate(self, prefix: str = "features") -> None:
        check(isinstance(self.label, LabelRule) or (isinstance(self.label, str) and bool(self.label)),
              f"{prefix}.label", self.label, "the label's column, or {column, positive}")
        check(len(self.sparse) >= 1, f"{prefix}.sparse", list(self.sparse),
              "at least one sparse feature")
        seen: dict[str, str] = {}
        for key, feats in (("dense", self.dense), ("sparse", self.sparse)):
            for i, f in enumerate(feats):
                where = f"{prefix}.{key}[{i}].name"
                check(f.name not in seen, where, f.name,
                      f"a name no other feature has (features.{seen.get(f.name)} has it)")
                seen[f.name] = f"{key}[{i}]"
        names = [t.name for t in self.tables]
        for i, t in enumerate(self.tables):
            check(names.count(t.name) == 1, f"{prefix}.tables[{i}].name", t.name,
                  "a name no other table has")
        for i, f in enumerate(self.sparse):
            if f.ids == "index":
                check(self.table_of(f.table_name).rows is not None,
                      f"{prefix}.tables", f.table_name,
                      f"an entry for table {f.table_name!r} with its rows (features.sparse[{i}] "
                      "takes its ids as rows: ids: index)")
        used = {f.table_name for f in self.sparse_inputs}
        for i, t in enumerate(self.tables):
            check(t.name in used, f"{prefix}.tables[{i}].name", t.name,
                  f"the table of a sparse feature (used: {', '.join(sorted(used))})")
        # features sharing a table must map equal raw ids to one row: one id type and policy
        # (and for a vocabulary, one threshold and cap: the table's vocabulary is built from
        # all of its features' ids)
        first: dict[str, tuple[int, SparseFeature]] = {}
        for i, f in enumerate(self.sparse):
            if f.table_name not in first:
                first[f.table_name] = (i, f)
                continue
            j, g = first[f.table_name]
            for key in ("id_type", "ids", "min_count", "max_size"):
                a, b = getattr(f, key), getattr(g, key)
                check(a == b, f"{prefix}.sparse[{i}].{key}", a,
                      f"{b!r}, as features.sparse[{j}] ({g.name}), which shares table "
                      f"{f.table_name!r} with it")
        for i, f in enumerate(self.dense):
            if f.boundaries is not None:
                check(f.name not in first, f"{prefix}.dense[{i}].name", f.name,
                      "a bucketized feature's table name (its own) that no sparse feature uses")

    @property
    def label_column(self) -> str:
        """The column the label is read from."""
        return self.label.column if isinstance(self.label, LabelRule) else self.label

    @property
    def label_rule(self) -> LabelRule | None:
        """Which values of ``label_column`` are clicks; None: it holds 0 and 1."""
        return self.label if isinstance(self.label, LabelRule) else None

    @property
    def dense_inputs(self) -> tuple[DenseFeature, ...]:
        """The dense features the model takes as numbers (not bucketized)."""
        return tuple(f for f in self.dense if f.boundaries is None)

    @property
    def sparse_inputs(self) -> tuple[SparseFeature, ...]:
        """The features the model looks up: the sparse ones, then the bucketized dense ones
        (their bucket is the id: a table of their own)."""
        return self.sparse + tuple(SparseFeature(f.name, column=f.source, ids="index")
                                   for f in self.dense if f.boundaries is not None)

    @property
    def vocab_tables(self) -> tuple[str, ...]:
        """The tables whose rows are a vocabulary (``ids: vocab``), in order of first use: one
        vocabulary per table, built from the ids of every feature that uses it."""
        return tuple(dict.fromkeys(f.table_name for f in self.sparse if f.ids == "vocab"))

    def vocab_index(self, f: SparseFeature) -> int:
        """The position of feature ``f``'s vocabulary (its table's) in ``vocab_tables``."""
        return self.vocab_tables.index(f.table_name)

    def table_of(self, name: str) -> EmbeddingTable:
        for t in self.tables:
            if t.name == name:
                return t
        return EmbeddingTable(name)


def criteo_schema(embedding_dim: int | None = None, kind: str = "categorical",
                  id_type: str = "hex", ids: str = "hash") -> FeatureSchema:
    """The Criteo preset: the label, 13 counts (missing 0; negatives clipped to 0, then log1p)
    and 26 ids (``hex``: Criteo's TSV; ``int``: the multi-hot parquet's; hashed, or with
    ``ids="vocab"`` through a vocabulary), each id feature its own table."""
    from recscale.data.criteo import DENSE_NAMES, SPARSE_NAMES

    return FeatureSchema(
        label="label",
        dense=tuple(DenseFeature(n, transforms=({"clip": [0, None]}, "log1p"))
                    for n in DENSE_NAMES),
        sparse=tuple(SparseFeature(n, kind=kind, id_type=id_type, ids=ids,
                                   min_id=0 if kind == "multi_hot" else None)
                     for n in SPARSE_NAMES),
        tables=tuple(EmbeddingTable(n, dim=embedding_dim) for n in SPARSE_NAMES)
        if embedding_dim else ())


PRESETS = ("criteo",)


@functools.lru_cache(maxsize=1)
def criteo_sparse_names() -> tuple[str, ...]:
    """The Criteo preset's id features, in order: what the Criteo TSV engines, their
    ``preprocess.table_sizes`` and the retrain's day files are laid out by."""
    return tuple(f.name for f in criteo_schema().sparse)


def parse_features(value: Any, prefix: str = "features") -> FeatureSchema:
    """The ``features`` block: a preset's name, or the schema itself."""
    if isinstance(value, FeatureSchema):
        return value
    if isinstance(value, str):
        check_choice(prefix, value, PRESETS)
        return criteo_schema()
    return parse(FeatureSchema, value, prefix)


# --- the fitted schema, in the manifest ------------------------------------------------------------
@dataclass(frozen=True)
class FittedSchema:
    """The schema as preprocessing resolved it on a dataset: every table with its rows (and dim,
    where the schema gives one), and which table each sparse feature looks up. What the manifest
    holds (``manifest["schema"]``) and every stage after preprocessing reads."""

    schema: FeatureSchema
    table_rows: tuple[int, ...]  # one per table of ``table_names``
    table_names: tuple[str, ...]
    # per standardized dense feature: its train split's {"mean", "std"} (of the value before it)
    stats: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @property
    def dense_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.schema.dense_inputs)

    @property
    def sparse_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.schema.sparse_inputs)

    @property
    def weighted(self) -> tuple[str, ...]:
        """The sparse features whose ids carry weights."""
        return tuple(f.name for f in self.schema.sparse_inputs if f.weights)

    @property
    def num_dense(self) -> int:
        return len(self.schema.dense_inputs)

    def table_dims(self, default_dim: int) -> tuple[int, ...]:
        """Each table's dim: its own, else ``default_dim`` (``model.embedding_dim``)."""
        return tuple(self.schema.table_of(n).dim or int(default_dim) for n in self.table_names)

    def feature_rows(self) -> tuple[int, ...]:
        """For each sparse feature, its table's rows (what every id must be below)."""
        return tuple(self.table_rows[t] for t in self.feature_tables())

    def feature_tables(self) -> tuple[int, ...]:
        """For each sparse feature, the index of its table."""
        return tuple(self.table_names.index(f.table_name) for f in self.schema.sparse_inputs)

    def pooling(self) -> tuple[str, ...]:
        """For each sparse feature, how its bag is pooled (``sum`` or ``mean``)."""
        return tuple(f.pooling for f in self.schema.sparse_inputs)

    def table_features(self) -> tuple[tuple[str, ...], ...]:
        """For each table, the features that look it up."""
        out: list[list[str]] = [[] for _ in self.table_names]
        for f, t in zip(self.sparse_names, self.feature_tables()):
            out[t].append(f)
        return tuple(tuple(x) for x in out)

    def to_dict(self) -> dict:
        out = {"schema": to_dict(self.schema), "tables": [
            {"name": n, "rows": int(r)} for n, r in zip(self.table_names, self.table_rows)]}
        if self.stats:
            out["stats"] = {k: {s: float(v) for s, v in d.items()} for k, d in self.stats.items()}
        return out

    @classmethod
    def fit(cls, schema: FeatureSchema, rows: Sequence[int],
            stats: Mapping[str, Mapping[str, float]] | None = None) -> FittedSchema:
        """``schema`` with its tables' rows (``rows``: one per table, in the order of the sparse
        features' first use; a table's own ``rows`` where it gives them) and the fitted
        statistics of its standardized dense features."""
        names = tuple(dict.fromkeys(f.table_name for f in schema.sparse_inputs))
        if len(rows) != len(names):
            raise ValueError(f"{len(rows)} table sizes for the {len(names)} tables "
                             f"{', '.join(names)}")
        missing = [f.name for f in schema.dense if f.standardizes and f.name not in (stats or {})]
        if missing:
            raise ValueError(f"no fitted statistics for standardized dense feature(s) {missing}")
        return cls(schema, tuple(int(schema.table_of(n).rows or r) for n, r in zip(names, rows)),
                   names, dict(stats or {}))

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> FittedSchema:
        """The fitted schema of a dataset's manifest, or of a trained model's resolved config
        (one written before the schema was: the Criteo preset with its table sizes)."""
        if "schema" in manifest:
            s = manifest["schema"]
            schema = parse(FeatureSchema, s["schema"], "schema")
            # the manifest's table_sizes are the tables' rows (a warm start's grown vocabulary
            # and a dataset's own agree on them; they win where a caller replaced them)
            rows = manifest.get("table_sizes") or [t["rows"] for t in s["tables"]]
            return cls(schema, tuple(int(r) for r in rows),
                       tuple(t["name"] for t in s["tables"]), s.get("stats", {}))
        # written before the schema was: the Criteo preset's dense features and id kind, one table
        # per entry of table_sizes (named as sparse_features says, where it does)
        kind = "multi_hot" if manifest.get("multi_hot") else "categorical"
        preset = criteo_schema(kind=kind, id_type="int" if kind == "multi_hot" else "hex")
        sizes = list(manifest["table_sizes"])
        names = list(manifest.get("sparse_features") or
                     [f.name for f in preset.sparse][:len(sizes)] or [])
        names += [f"C{i + 1}" for i in range(len(names), len(sizes))]
        dense = tuple(DenseFeature(n, transforms=preset.dense[0].transforms)
                      for n in manifest.get("dense_features", [f.name for f in preset.dense]))
        schema = FeatureSchema(label="label", dense=dense, sparse=tuple(
            SparseFeature(n, kind=kind, id_type=preset.sparse[0].id_type) for n in names))
        return cls.fit(schema, sizes)


def schema_change(old: FeatureSchema, new: FeatureSchema) -> str | None:
    """The first difference between the schema a model was trained on and a new dataset's, in
    words naming the feature (or the label, or the table), or None when they are the same. A
    table's rows may differ (a vocabulary grows; the table sizes are checked on their own)."""
    if old.label != new.label:
        what = "label column" if isinstance(old.label, str) and isinstance(new.label, str) \
            else "label"
        return f"the {what} is {to_dict(new.label)!r}, the model's is {to_dict(old.label)!r}"
    for key in ("dense", "sparse"):
        a, b = {f.name: f for f in getattr(old, key)}, {f.name: f for f in getattr(new, key)}
        for name in a:
            if name not in b:
                return f"{key} feature {name} of the model is not in the data's schema"
        for name in b:
            if name not in a:
                return f"{key} feature {name} is new (the model has no {name})"
            if a[name] != b[name]:
                was, now = to_dict(a[name]), to_dict(b[name])
                diff = sorted(k for k in was if was[k] != now.get(k))
                return (f"{key} feature {name} changed: "
                        + ", ".join(f"{k} {was[k]!r} -> {now[k]!r}" for k in diff))
        if list(a) != list(b):
            return f"the {key} features are in another order: {list(b)}, the model's {list(a)}"
    for name in dict.fromkeys(f.table_name for f in old.sparse_inputs):
        if old.table_of(name).dim != new.table_of(name).dim:
            return (f"table {name} has dim {new.table_of(name).dim}, the model's "
                    f"{old.table_of(name).dim}")
    return None
