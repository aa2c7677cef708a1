"""The feature schema: which column is the label, which are dense features and how each is
transformed, which are categorical features (one id per row) or multi-hot features (a bag of ids
per row), and which embedding table each one looks its ids up in, with that table's rows and dim.

Declared in the ``features`` block of parameters_dlrm.yml (``criteo``, the default, is the preset
of Criteo's 13 counts and 26 ids), resolved by preprocessing (the tables' rows from the ids
policy and the data) and written into the dataset's manifest as the *fitted* schema
(``FittedSchema``), which every later stage reads: the loader, the model and its embedding
collections, the planner's table specs, scoring, the retrain and the machine's measurement.

Transforms of a dense feature, applied in order to its raw value (float64), then to float32; a
missing value is ``missing`` (after the transforms): ``log1p``; ``{"clip": [low, high]}`` (either
may be null: no bound).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from recscale.config import ConfigError, Validated, check, check_choice, parse, to_dict

TRANSFORMS = ("log1p", "clip")
SPARSE_KINDS = ("categorical", "multi_hot")
ID_TYPES = ("int", "hex")  # hex: Criteo's 8-hex-digit ids


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
            if name == "clip":
                bounds = t["clip"] if isinstance(t, Mapping) else None
                check(isinstance(bounds, (list, tuple)) and len(bounds) == 2
                      and all(b is None or isinstance(b, (int, float)) for b in bounds)
                      and (None in bounds or bounds[0] <= bounds[1]), key, t,
                      "{clip: [low, high]} with low <= high (either null: no bound)")

    def apply(self, raw: np.ndarray, present: np.ndarray) -> np.ndarray:
        """Raw values (any numeric dtype) -> the model's float32 input; rows not ``present`` get
        ``missing``."""
        x = raw.astype(np.float64)
        for t in self.transforms:
            if t == "log1p":
                x = np.log1p(x)
            else:  # clip
                low, high = t["clip"]
                if low is not None:
                    x = np.maximum(x, float(low))
                if high is not None:
                    x = np.minimum(x, float(high))
        out = x.astype(np.float32)
        out[~present] = np.float32(self.missing)
        return out


@dataclass(frozen=True)
class SparseFeature(Validated):
    """A categorical (one id per row) or multi-hot (a bag of ids per row) feature: its source
    ``column`` (default: its name), how its raw ids are written (``int``, or ``hex`` for Criteo's
    8-hex-digit ids) and its ``table`` (default: a table of its own, named as the feature)."""

    name: str
    column: str = ""
    kind: Literal["categorical", "multi_hot"] = "categorical"
    id_type: Literal["int", "hex"] = "int"
    table: str = ""

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

    label: str = "label"
    dense: tuple[DenseFeature, ...] = ()
    sparse: tuple[SparseFeature, ...] = ()
    tables: tuple[EmbeddingTable, ...] = ()

    def validate(self, prefix: str = "features") -> None:
        check(isinstance(self.label, str) and bool(self.label), f"{prefix}.label", self.label,
              "the label's column")
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
        used = {f.table_name for f in self.sparse}
        for i, t in enumerate(self.tables):
            check(t.name in used, f"{prefix}.tables[{i}].name", t.name,
                  f"the table of a sparse feature (used: {', '.join(sorted(used))})")
        by_table: dict[str, list[str]] = {}
        for f in self.sparse:
            by_table.setdefault(f.table_name, []).append(f.name)
        for i, f in enumerate(self.sparse):
            if len(by_table[f.table_name]) > 1:
                others = [n for n in by_table[f.table_name] if n != f.name]
                raise ConfigError(
                    f"{prefix}.sparse[{i}].table={f.table_name!r} is not allowed yet: "
                    f"features {f.name} and {', '.join(others)} would share it; give each "
                    "feature its own table")

    def table_of(self, name: str) -> EmbeddingTable:
        for t in self.tables:
            if t.name == name:
                return t
        return EmbeddingTable(name)


def criteo_schema(embedding_dim: int | None = None, kind: str = "categorical",
                  id_type: str = "hex") -> FeatureSchema:
    """The Criteo preset: the label, 13 counts (missing 0; negatives clipped to 0, then log1p)
    and 26 ids (``hex``: Criteo's TSV; ``int``: the multi-hot parquet's), each id feature its
    own table."""
    from recscale.data.criteo import DENSE_NAMES, SPARSE_NAMES

    return FeatureSchema(
        label="label",
        dense=tuple(DenseFeature(n, transforms=({"clip": [0, None]}, "log1p"))
                    for n in DENSE_NAMES),
        sparse=tuple(SparseFeature(n, kind=kind, id_type=id_type) for n in SPARSE_NAMES),
        tables=tuple(EmbeddingTable(n, dim=embedding_dim) for n in SPARSE_NAMES)
        if embedding_dim else ())


PRESETS = ("criteo",)


def parse_features(value: Any, prefix: str = "features") -> FeatureSchema:
    """The ``features`` block: a preset's name, or the schema itself."""
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

    @property
    def dense_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.schema.dense)

    @property
    def sparse_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.schema.sparse)

    @property
    def num_dense(self) -> int:
        return len(self.schema.dense)

    def table_dims(self, default_dim: int) -> tuple[int, ...]:
        """Each table's dim: its own, else ``default_dim`` (``model.embedding_dim``)."""
        return tuple(self.schema.table_of(n).dim or int(default_dim) for n in self.table_names)

    def feature_tables(self) -> tuple[int, ...]:
        """For each sparse feature, the index of its table."""
        return tuple(self.table_names.index(f.table_name) for f in self.schema.sparse)

    def to_dict(self) -> dict:
        return {"schema": to_dict(self.schema), "tables": [
            {"name": n, "rows": int(r)} for n, r in zip(self.table_names, self.table_rows)]}

    @classmethod
    def fit(cls, schema: FeatureSchema, rows: Sequence[int]) -> FittedSchema:
        """``schema`` with its tables' rows (``rows``: one per table, in the order of the sparse
        features' first use; a table's own ``rows`` where it gives them)."""
        names = tuple(dict.fromkeys(f.table_name for f in schema.sparse))
        if len(rows) != len(names):
            raise ValueError(f"{len(rows)} table sizes for the {len(names)} tables "
                             f"{', '.join(names)}")
        return cls(schema, tuple(int(schema.table_of(n).rows or r) for n, r in zip(names, rows)),
                   names)

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
                       tuple(t["name"] for t in s["tables"]))
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


def check_dot_dims(dims: Sequence[int], names: Sequence[str], bottom: int | None = None,
                   key: str = "model.interaction") -> None:
    """The ``dot`` interaction multiplies every pair of pooled vectors (and each with the bottom
    MLP's output, ``bottom`` wide): they need one dim. The error names the first table that
    differs."""
    want = dims[0] if bottom is None else bottom
    for name, d in zip(names, dims):
        if d != want:
            first = "the bottom MLP's output" if bottom is not None else f"table {names[0]}"
            raise ConfigError(f"{key}='dot' is not allowed with tables of different dims: table "
                              f"{name} has dim {d}, {first} {want}; use 'cat' or 'dcn', or give "
                              "every table that one dim")
