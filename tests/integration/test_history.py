"""History features built by preprocessing equal a pandas reference on a shuffled log, in one
process, in worker processes and on Spark, with the key's rows spread over several partitions;
the ids are looked up in the item's table."""

import csv

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recscale.config import ConfigError
from recscale.data import history
from recscale.data.preprocess import SPLITS, PreprocessConfig, load_manifest, preprocess_table
from recscale.data.schema import parse_features
from tests.history_reference import histories

MAX_LEN = 4


def _log(tmp_path, seed, n=1200):
    """A shuffled log (users, items, hours with ties, a few rows without a user or time) in a
    parquet file and a CSV."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({
        "click": rng.integers(0, 2, n),
        "user": [None if rng.random() < 0.03 else f"u{u}" for u in rng.integers(0, 50, n)],
        "item": rng.integers(0, 60, n),
        "ts": (rng.integers(0, 400, n) * 3600).astype(float)})
    df.loc[rng.random(n) < 0.03, "ts"] = np.nan
    a, b = df.iloc[:700], df.iloc[700:]
    pq.write_table(pa.Table.from_pandas(a, preserve_index=False), tmp_path / "a.parquet",
                   row_group_size=150)
    with open(tmp_path / "b.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["click", "user", "item", "ts"])
        for r in b.itertuples():
            w.writerow([r.click, "" if pd.isna(r.user) else r.user, r.item,
                        "" if np.isnan(r.ts) else int(r.ts)])
    return [str(tmp_path / "a.parquet"), str(tmp_path / "b.csv")], df


SCHEMA = {"label": "click",
          "sparse": [{"name": "user", "id_type": "string", "ids": "vocab"},
                     {"name": "item", "ids": "vocab"},
                     {"name": "recent", "kind": "history", "key": "user", "item": "item",
                      "time": "ts", "max_len": MAX_LEN}]}


def test_histories_equal_pandas_on_a_shuffled_log_on_both_engines(spark, tmp_path, seed,
                                                                 monkeypatch):
    monkeypatch.setattr(history, "PARTITION_ROWS", 300)  # 4 partitions by user
    files, df = _log(tmp_path, seed)
    schema = parse_features(SCHEMA)
    assert schema.sparse[2].table_name == "item" and schema.sparse[2].ids == "vocab"
    want = histories(df, "user", "item", "ts", MAX_LEN)
    got = {}
    for name, engine, workers in (("one", "pyarrow", 1), ("workers", "pyarrow", 2),
                                  ("spark", "spark", 1)):
        out = tmp_path / name
        cfg = PreprocessConfig(output_dir=str(out), engine=engine, workers=workers,
                               row_group_size=100, splits=(0.6, 0.2, 0.2))
        man = load_manifest(preprocess_table(files, out, cfg, schema, spark=spark).manifest_path)
        got[name] = pa.concat_tables([pq.read_table(man["splits"][s]["files"]) for s in SPLITS])
        assert not (out / "_history").exists()
        assert man["rows_rejected"] == 0
    t = got["one"]
    rows = t.column("row").to_numpy()
    assert sorted(rows.tolist()) == list(range(len(df)))
    # the item column's ids: the raw item -> its row of the item table
    item_id = dict(zip(df["item"].to_numpy()[rows], [x[0] for x in t.column("item").to_pylist()]))
    hist = t.column("recent").to_pylist()
    for r, h in zip(rows, hist):
        assert h == [item_id[i] for i in want[r]], r
    assert sum(len(h) > 0 for h in hist) > len(df) // 2
    assert max(len(h) for h in hist) == MAX_LEN
    for other in ("workers", "spark"):
        assert got[other].equals(t), other


def test_a_history_needs_its_columns(tmp_path):
    pq.write_table(pa.table({"click": [0, 1], "user": ["a", "b"], "item": [1, 2]}),
                   tmp_path / "a.parquet")
    with pytest.raises(ConfigError, match=r"column 'ts' \(features.sparse\[2\] \(recent\)"
                       r".time\) is missing"):
        preprocess_table([str(tmp_path / "a.parquet")], tmp_path / "out",
                         PreprocessConfig(output_dir=str(tmp_path / "out")),
                         parse_features(SCHEMA))
    with pytest.raises(ConfigError, match=r"features.sparse\[0\].key=None is not allowed"):
        parse_features({"label": "c", "sparse": [{"name": "h", "kind": "history", "item": "i",
                                                   "time": "t"}]})
    with pytest.raises(ConfigError, match="unset unless kind is history"):
        parse_features({"label": "c", "sparse": [{"name": "h", "key": "u"}]})
