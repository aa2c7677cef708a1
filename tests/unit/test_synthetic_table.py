"""The generator speaks any schema: every feature kind drawn with its id type, the planted
model's probabilities beside the file (its AUC the oracle's), the same bytes for the same config."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recscale.config import parse
from recscale.data.preprocess import preprocess_table
from recscale.data.processed import PreprocessConfig, load_manifest
from recscale.data.schema import parse_features
from recscale.data.synthetic_table import TableSynthConfig, generate_table
from recscale.evaluate.metrics import auc_score

SCHEMA = parse_features({
    "label": "y",
    "dense": [{"name": "price", "transforms": ["log1p", "standardize"]},
              {"name": "band", "column": "price", "transforms": [{"bucketize": [3.0, 30.0]}]}],
    "sparse": [{"name": "user", "id_type": "string"},
               {"name": "item", "ids": "vocab"},
               {"name": "site", "id_type": "hex"},
               {"name": "tags", "kind": "multi_hot", "max_len": 6, "truncate": "keep_last"}],
    "tables": [{"name": "user", "rows": 400}, {"name": "tags", "rows": 64, "dim": 8}]})


def cfg(seed: int, rows: int = 6000) -> TableSynthConfig:
    return parse(TableSynthConfig, {"num_rows": rows, "seed": seed, "features": {
        "user": {"cardinality": 100}, "item": {"cardinality": 50, "missing": 0.0},
        "tags": {"cardinality": 30, "pooling": 3.0}}}, "data.generator")


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_every_feature_kind_is_drawn_as_its_schema_says(tmp_path, seed):
    rep = generate_table(SCHEMA, cfg(seed), tmp_path / "a.parquet")
    t = pq.read_table(rep.path)
    assert t.column_names == ["y", "price", "user", "item", "site", "tags"]
    assert t.schema.field("user").type == pa.string()
    assert t.schema.field("site").type == pa.string()
    assert t.schema.field("item").type == pa.int64()
    assert t.schema.field("tags").type == pa.list_(pa.string()) or \
        pa.types.is_list(t.schema.field("tags").type)
    assert all(len(s) == 8 for s in t.column("site").drop_null().to_pylist())
    assert t.column("item").null_count == 0 and 0 < t.column("user").null_count < 6000 * 0.05
    lengths = pa.compute.list_value_length(t.column("tags")).to_numpy(zero_copy_only=False)
    assert 2.7 < np.nanmean(lengths) < 3.3
    probs = np.load(rep.oracle_path)
    y = t.column("y").to_numpy()
    assert rep.oracle_auc == auc_score(y, probs) and 0.7 < rep.oracle_auc < 1
    assert abs(y.mean() - 0.25) < 0.03
    # the same config: the same bytes (generated again, not reused)
    again = generate_table(SCHEMA, cfg(seed), tmp_path / "b.parquet")
    assert sha(again.path) == sha(rep.path) and again.oracle_auc == rep.oracle_auc
    assert sha(generate_table(SCHEMA, cfg(seed + 1), tmp_path / "c.parquet").path) != sha(rep.path)


def test_generated_rows_preprocess_with_every_row_kept_and_their_oracle_aligned(tmp_path, seed):
    rep = generate_table(SCHEMA, cfg(seed, 3000), tmp_path / "a.parquet")
    out = tmp_path / "out"
    man = load_manifest(preprocess_table([rep.path], out, PreprocessConfig(
        output_dir=str(out), max_table_size=500), SCHEMA).manifest_path)
    assert man["rows_written"] == 3000 and man["rows_rejected"] == 0
    rows = np.concatenate([pq.read_table(f, columns=["row"]).column("row").to_numpy()
                           for s in ("train", "validation", "test")
                           for f in man["splits"][s]["files"]])
    assert rows.tolist() == list(range(3000))
    assert man["sparse_features"] == ["user", "item", "site", "tags", "band"]
    assert man["table_sizes"][0] == 400 and man["table_sizes"][-1] == 3
