"""preprocess.splits by a time column and by source file, on both engines: every row lands in
the split its time or file says, with its input row number, the fit reads only train rows, and
the pyarrow engine (one process and worker processes) and Spark write the same splits. The
input is a log in no particular order (shuffled), as logs come."""

import csv

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recscale.config import ConfigError, parse
from recscale.data.preprocess import (
    SPLITS,
    PreprocessConfig,
    load_manifest,
    preprocess_criteo,
    preprocess_table,
)
from recscale.data.schema import parse_features

T0 = 1_767_225_600  # 2026-01-01 00:00:00 UTC


def _log(tmp_path, seed, n=1500):
    """A shuffled log in three files: two parquet files (a timestamp column, and seconds as
    integers) and a CSV of ISO date-times, with a few rows whose time is missing or bad.
    -> (files, every row's time in seconds in input order (nan: none), the users)."""
    rng = np.random.default_rng(seed)
    secs = (T0 + rng.integers(0, 30 * 86400, n) // 3600 * 3600).astype(np.int64)  # ties
    users = rng.integers(0, 80, n)
    items = rng.integers(0, 300, n)
    clicks = rng.integers(0, 2, n)
    cut = [0, 600, 1100, n]
    times = secs.astype(np.float64)
    a = slice(cut[0], cut[1])
    pq.write_table(pa.table({
        "click": clicks[a], "user": [f"u{u}" for u in users[a]], "item": items[a],
        "ts": pa.array(secs[a] * 1_000_000, pa.timestamp("us"))}),
        tmp_path / "a.parquet", row_group_size=250)
    b = slice(cut[1], cut[2])
    ts_b = pa.array(secs[b].tolist(), pa.int64())
    missing = np.arange(len(ts_b)) % 97 == 3
    ts_b = pa.array([None if m else int(v) for m, v in zip(missing, secs[b])], pa.int64())
    times[cut[1]:cut[2]][missing] = np.nan
    pq.write_table(pa.table({"click": clicks[b], "user": [f"u{u}" for u in users[b]],
                             "item": items[b], "ts": ts_b}), tmp_path / "b.parquet",
                   row_group_size=200)
    with open(tmp_path / "c.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["click", "user", "item", "ts"])
        for i in range(cut[2], n):
            stamp = np.datetime64(int(secs[i]), "s").astype(str).replace("T", " ")
            if i % 89 == 5:
                stamp, times[i] = "soon", np.nan
            w.writerow([clicks[i], f"u{users[i]}", items[i], stamp])
    return [str(tmp_path / f) for f in ("a.parquet", "b.parquet", "c.csv")], times, users


SCHEMA = parse_features({"label": "click",
                         "sparse": [{"name": "user", "id_type": "string", "ids": "vocab"},
                                    {"name": "item", "ids": "hash"}],
                         "tables": [{"name": "item", "rows": 97}]})


def _run(files, out, splits, engine="pyarrow", workers=1, spark=None):
    cfg = parse(PreprocessConfig, {"output_dir": str(out), "engine": engine, "workers": workers,
                                   "row_group_size": 128, "max_reject_fraction": 0.1,
                                   "splits": splits}, "preprocess")
    man = load_manifest(preprocess_table(files, out, cfg, SCHEMA, spark=spark).manifest_path)
    tables = {s: pa.concat_tables([pq.read_table(f) for f in man["splits"][s]["files"]])
              for s in SPLITS}
    return man, tables


def _expected(times, v, t):
    ok = ~np.isnan(times)
    return [np.flatnonzero(ok & (times < v)), np.flatnonzero(ok & (times >= v) & (times < t)),
            np.flatnonzero(ok & (times >= t))]


def test_a_time_split_puts_each_row_by_its_time_on_both_engines(spark, tmp_path, seed):
    files, times, users = _log(tmp_path, seed)
    v, t = T0 + 20 * 86400, T0 + 25 * 86400
    rule = {"by": "ts", "validation_from": "2026-01-21", "test_from": float(t)}
    got = {}
    for name, engine, workers in (("one", "pyarrow", 1), ("workers", "pyarrow", 2),
                                  ("spark", "spark", 1)):
        got[name] = _run(files, tmp_path / name, rule, engine, workers, spark)
    man, tables = got["one"]
    want = _expected(times, v, t)
    for k, s in enumerate(SPLITS):  # exactly the rows at or after each boundary, in input order
        assert tables[s].column("row").to_pylist() == want[k].tolist(), s
    # rows without a time are rejects naming the column; none is lost
    rejected = np.flatnonzero(np.isnan(times))
    assert man["rows_rejected"] == len(rejected) > 0
    assert man["rows_written"] + man["rows_rejected"] == len(times)
    lines = open(man["rejects_path"]).read().splitlines()[1:]
    assert any("preprocess.splits.by: ts=missing" in x for x in lines)
    assert any("preprocess.splits.by: ts='soon' is not a time" in x for x in lines)
    assert man["split_rule"] == {"by": "ts", "validation_from": float(v), "test_from": float(t),
                                 "fractions": None}
    # the user vocabulary counts train rows only
    vocab = pq.read_table(man["vocabulary_path"])
    assert sum(vocab.column("count").to_pylist()) == len(want[0])
    for other in ("workers", "spark"):
        m2, t2 = got[other]
        for s in SPLITS:
            assert t2[s].equals(tables[s]), (other, s)
        assert m2["split_rule"] == man["split_rule"]
        assert pq.read_table(m2["vocabulary_path"]).equals(vocab)


def test_fractions_of_the_rows_ordered_by_time_keep_ties_together(spark, tmp_path, seed):
    files, times, _ = _log(tmp_path, seed)
    rule = {"by": "ts", "fractions": [0.7, 0.15, 0.15]}
    man, tables = _run(files, tmp_path / "one", rule)
    ok = np.sort(times[~np.isnan(times)])
    v, t = ok[int(np.floor(0.7 * len(ok)))], ok[int(np.floor(0.85 * len(ok)))]
    assert (man["split_rule"]["validation_from"], man["split_rule"]["test_from"]) == (v, t)
    want = _expected(times, v, t)
    for k, s in enumerate(SPLITS):
        assert tables[s].column("row").to_pylist() == want[k].tolist(), s
    assert abs(len(want[0]) / len(ok) - 0.7) < 0.05  # hours tie many rows: near, not exact
    _, sp = _run(files, tmp_path / "spark", rule, "spark", spark=spark)
    for s in SPLITS:
        assert sp[s].equals(tables[s]), s


def test_a_file_split_puts_each_file_in_its_split(spark, tmp_path, seed):
    files, times, _ = _log(tmp_path, seed)
    rule = {"train": ["a.parquet", "b.*"], "test": ["*.csv"]}
    sizes = [600, 500, 400]
    starts = np.cumsum([0] + sizes)
    for name, engine in (("one", "pyarrow"), ("spark", "spark")):
        man, tables = _run(files, tmp_path / name, rule, engine, spark=spark)
        rows = {s: tables[s].column("row").to_numpy() for s in SPLITS}
        assert np.all(rows["train"] < starts[2]) and rows["validation"].size == 0
        assert np.all(rows["test"] >= starts[2]) and len(rows["test"]) == sizes[2]
        assert len(rows["train"]) == sizes[0] + sizes[1]  # ts is not read: no row rejected
        assert man["split_rule"] == {"files": {"train": ["a.parquet", "b.*"], "validation": [],
                                               "test": ["*.csv"]}}
    with pytest.raises(ConfigError, match=r"c\.csv matches no split's patterns"):
        _run(files, tmp_path / "x", {"train": ["*.parquet"]})
    with pytest.raises(ConfigError, match="the patterns of train and test"):
        _run(files, tmp_path / "y", {"train": ["*"], "test": ["*.csv"]})


def test_a_criteo_day_file_split_and_no_time_split(spark, tmp_path):
    rng = np.random.default_rng(3)
    files = []
    for d in range(3):
        lines = ["\t".join([str(rng.integers(0, 2))] + [str(rng.integers(0, 9))] * 13
                           + [f"{rng.integers(0, 2**32):08x}" for _ in range(26)])
                 for _ in range(40 + d)]
        p = tmp_path / f"day_{d:02d}.tsv"
        p.write_text("\n".join(lines) + "\n")
        files.append(str(p))
    rule = {"train": ["day_00.tsv", "day_01.tsv"], "validation": [], "test": ["day_02*"]}
    for engine in ("pyarrow", "spark"):
        cfg = parse(PreprocessConfig, {"splits": rule, "engine": engine, "ids": "vocab"},
                    "preprocess")
        man = load_manifest(preprocess_criteo(files, tmp_path / engine, cfg,
                                              spark=spark).manifest_path)
        assert {s: man["splits"][s]["rows"] for s in SPLITS} == \
            {"train": 81, "validation": 0, "test": 42}
        test_rows = pq.read_table(man["splits"]["test"]["files"]).column("row").to_pylist()
        assert test_rows == list(range(81, 123))
        counts = pq.read_table(man["vocabulary_path"]).column("count").to_numpy()
        assert counts.sum() == 81 * 26  # the vocabulary counted the train days only
    cfg = parse(PreprocessConfig, {"splits": {"by": "ts", "fractions": [0.8, 0.1, 0.1]}},
                "preprocess")
    with pytest.raises(ConfigError, match="no named time column"):
        preprocess_criteo(files, tmp_path / "t", cfg)


@pytest.mark.parametrize("splits, message", [
    ({"by": "ts", "validaton_from": 3, "test_from": 4}, "did you mean 'validation_from'"),
    ({"by": "ts"}, "either validation_from and test_from"),
    ({"by": "ts", "validation_from": 5, "test_from": 3}, "at or after validation_from"),
    ({"by": "ts", "validation_from": "tomorrow", "test_from": 3}, "an ISO date"),
    ({"train": []}, "at least one pattern"),
    ([0.5, 0.5], "a list of 3 items"),
])
def test_a_bad_split_rule_names_its_key(splits, message):
    with pytest.raises(ConfigError, match=message):
        parse(PreprocessConfig, {"splits": splits}, "preprocess")
