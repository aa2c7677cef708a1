"""A user's own table through the feature schema: each feature kind against a numpy (or plain
Python) reference, the sources (parquet, a day-partitioned directory, delimited text), and each
bad input ending in its message or its reject line, every input row accounted for."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recscale.config import ConfigError, parse
from recscale.data.criteo import RejectedRowsError
from recscale.data.loader import LoaderConfig, make_loader
from recscale.data.preprocess import preprocess_table
from recscale.data.processed import PreprocessConfig, load_manifest
from recscale.data.schema import FittedSchema, parse_features
from recscale.data.table_parse import stable_hash


def fnv1a(s: str) -> int:
    """64-bit FNV-1a, the textbook loop (the reference for stable_hash)."""
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & (2**64 - 1)
    return h - 2**64 if h >= 2**63 else h


def rows_of(manifest: dict) -> dict[int, dict]:
    out = {}
    for s in ("train", "validation", "test"):
        for f in manifest["splits"][s]["files"]:
            for r in pq.read_table(f).to_pylist():
                out[r["row"]] = r
    return out


def read_rejects(manifest: dict) -> list[dict]:
    with open(manifest["rejects_path"]) as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


def cfg(out: Path, **kw) -> PreprocessConfig:
    return PreprocessConfig(output_dir=str(out), max_table_size=1000, row_group_size=97, **kw)


def test_stable_hash_is_fnv1a_of_the_utf8_bytes(rng):
    words = ["", "a", "user-17", "ünïcödé", "x" * 70] + \
        ["".join(rng.choice(list("abcdef0123"), rng.integers(0, 30))) for _ in range(200)]
    assert stable_hash(words).tolist() == [fnv1a(w) for w in words]
    assert stable_hash(pa.array(words[:3] + [None])).tolist()[:3] == [fnv1a(w) for w in words[:3]]


def test_dense_transforms_and_bucketize_equal_numpy(tmp_path, rng):
    n = 1000
    price = rng.lognormal(2, 1.5, n)
    price[rng.random(n) < 0.1] = np.nan  # missing
    temp = rng.normal(0, 30, n)
    pq.write_table(pa.table({"y": rng.integers(0, 2, n), "price": pa.array(price, from_pandas=True),
                             "temp": temp, "item": rng.integers(0, 50, n)}), tmp_path / "a.parquet")
    schema = parse_features({
        "label": "y",
        "dense": [{"name": "price", "missing": -1.0, "transforms": ["log1p", "standardize"]},
                  {"name": "temp", "transforms": [{"clip": [-20, 40]}]},
                  {"name": "price_bucket", "column": "price",
                   "transforms": [{"clip": [0, 50]}, {"bucketize": [1.0, 5.0, 25.0]}]}],
        "sparse": [{"name": "item", "ids": "hash"}]})
    man = load_manifest(preprocess_table([tmp_path / "a.parquet"], tmp_path / "out",
                                         cfg(tmp_path / "out"), schema).manifest_path)
    got = rows_of(man)
    assert len(got) == n and man["rows_rejected"] == 0
    train = np.arange(n) < man["splits"]["train"]["rows"]
    present = ~np.isnan(price)
    lp = np.log1p(price[train & present])
    mean, std = lp.mean(), lp.std()
    fitted = FittedSchema.of(man)
    assert fitted.stats["price"]["mean"] == pytest.approx(mean, rel=1e-12)
    assert fitted.stats["price"]["std"] == pytest.approx(std, rel=1e-9)
    want_price = np.where(present, (np.log1p(np.nan_to_num(price)) - mean) / std, -1.0)
    want_bucket = np.digitize(np.clip(price, 0, 50), [1.0, 5.0, 25.0])
    for r in range(n):
        assert got[r]["price"] == pytest.approx(np.float32(want_price[r]), abs=1e-6)
        assert got[r]["temp"] == np.float32(np.clip(temp[r], -20, 40))
        assert got[r]["price_bucket"] == (int(want_bucket[r]) if present[r] else None)
    assert man["dense_features"] == ["price", "temp"]
    assert man["sparse_features"] == ["item", "price_bucket"]
    # item gives no rows: hash_size_multiplier (4) x the distinct ids of the train split
    item = pq.read_table(tmp_path / "a.parquet").column("item").to_numpy()
    assert man["table_sizes"] == [4 * len(np.unique(item[train])), 4]


def test_ids_hash_vocab_and_index_equal_a_python_reference(tmp_path, rng):
    n = 600
    users = [f"user-{u}" for u in rng.zipf(1.5, n) % 200]
    shop = rng.integers(0, 1 << 40, n)
    slot = rng.integers(0, 12, n)
    slot[[5, 77]] = [12, -1]  # outside the table of 12 rows
    pq.write_table(pa.table({"label": rng.integers(0, 2, n).astype(np.int8), "user": users,
                             "shop": shop, "slot": slot}), tmp_path / "a.parquet")
    schema = parse_features({
        "sparse": [{"name": "user", "id_type": "string", "ids": "vocab", "min_count": 3},
                   {"name": "user_h", "column": "user", "id_type": "string", "ids": "hash"},
                   {"name": "shop", "ids": "hash"},
                   {"name": "slot", "ids": "index"}],
        "tables": [{"name": "user_h", "rows": 97, "dim": 8}, {"name": "slot", "rows": 12}]})
    man = load_manifest(preprocess_table([tmp_path / "a.parquet"], tmp_path / "out",
                                         cfg(tmp_path / "out"), schema).manifest_path)
    got = rows_of(man)
    rejects = read_rejects(man)
    assert [int(r["line"]) for r in rejects] == [6, 78]  # 1-based, as a text file's lines
    assert rejects[0]["reason"] == "id outside table: slot=12 is not in [0, 12) (table slot)"
    assert rejects[1]["reason"] == "id outside table: slot=-1 is not in [0, 12) (table slot)"
    assert sorted(got) == [r for r in range(n) if r not in (5, 77)]
    # the vocabulary: train rows that pass, ids seen >= 3 times, most frequent first, ties by id
    train = [r for r in range(480) if r in got]  # the first 80% of the rows, less the rejects
    counts = Counter(fnv1a(users[r]) for r in train)
    kept = sorted((k for k, c in counts.items() if c >= 3), key=lambda k: (-counts[k], k))
    row_of = {k: i + 1 for i, k in enumerate(kept)}
    assert man["table_sizes"] == [len(kept) + 1, 97, 1000, 12]
    for r, row in got.items():
        assert row["user"] == row_of.get(fnv1a(users[r]), 0)
        assert row["user_h"] == fnv1a(users[r]) % 97
        assert row["shop"] == int(shop[r]) % 1000
        assert row["slot"] == int(slot[r])
    assert FittedSchema.of(man).table_dims(16) == (16, 8, 16, 16)


def _bags_table(rng, n, lists):
    return pa.table({"label": rng.integers(0, 2, n), "hist": pa.array(lists, pa.list_(pa.int64())),
                     "item": rng.integers(0, 9, n)})


@pytest.mark.parametrize("truncate", ["keep_first", "keep_last", "reject"])
def test_multi_hot_lists_keep_their_end_or_are_rejected(tmp_path, rng, truncate):
    n = 300
    lists = [rng.integers(0, 10_000, rng.integers(0, 9)).tolist() for _ in range(n)]
    lists[3] = None
    lists[10] = [1, None, 2]
    pq.write_table(_bags_table(rng, n, lists), tmp_path / "a.parquet")
    schema = parse_features({"sparse": [{"name": "hist", "kind": "multi_hot", "max_len": 5,
                                         "truncate": truncate}, {"name": "item"}],
                             "tables": [{"name": "hist", "rows": 500}]})
    man = load_manifest(preprocess_table([tmp_path / "a.parquet"], tmp_path / "out",
                                         cfg(tmp_path / "out", max_reject_fraction=1.0),
                                         schema).manifest_path)
    got = rows_of(man)
    reasons = {int(r["line"]) - 1: r["reason"] for r in read_rejects(man)}
    assert reasons[10] == "null in list: hist holds a null id"
    long = {r for r in range(n) if lists[r] is not None and r != 10 and len(lists[r]) > 5}
    assert long, "the draw should hold lists longer than max_len"
    if truncate == "reject":
        for r in long:
            assert reasons[r] == (f"list too long: hist holds {len(lists[r])} ids, more than "
                                  "max_len=5 (truncate: reject)")
    assert set(got) | set(reasons) == set(range(n)) and not set(got) & set(reasons)
    for r, row in got.items():
        want = lists[r] or []
        if len(want) > 5:
            want = want[:5] if truncate == "keep_first" else want[-5:]
        assert row["hist"] == [v % 500 for v in want]
        assert row["item"] == [int(pq.read_table(tmp_path / "a.parquet")["item"][r].as_py())]
    sizes = [len(got[r]["hist"]) for r in sorted(got)]
    assert man["pooling_factors"][0] == pytest.approx(np.mean(sizes), abs=1e-6)


def test_delimited_text_with_a_header_day_partitions_and_reject_lines(tmp_path):
    lines = {"2026-01-01": [["1", "u1", "3.5", "4|5|6"], ["0", "u2", "", ""],
                            ["1", "u3", "1e2", "7"]],
             "2026-01-02": [["0", "u1", "abc", "1"], ["x", "u2", "1", "2"],
                            ["1", "u4", "2", "8|x"], ["0", "", "0.5", "9||9"],
                            ["1", "u5", "-7", "3"]]}
    text = tmp_path / "log.csv"
    with open(text, "w", newline="") as fh:
        w = csv.writer(fh, delimiter=";")
        w.writerow(["click", "user", "amount", "tags", "day"])
        for d, rows in lines.items():
            for r in rows:
                w.writerow(r + [d])
    # the rows that pass, typed, in a directory partitioned by day
    good = {"2026-01-01": lines["2026-01-01"], "2026-01-02": [lines["2026-01-02"][-1]]}
    for d, rows in good.items():
        (tmp_path / f"day={d}").mkdir()
        pq.write_table(pa.table({
            "click": [int(r[0]) for r in rows], "user": [r[1] for r in rows],
            "amount": pa.array([float(r[2]) if r[2] else None for r in rows], pa.float64()),
            "tags": pa.array([[int(t) for t in r[3].split("|")] if r[3] else [] for r in rows],
                             pa.list_(pa.int64()))}), tmp_path / f"day={d}" / "part.parquet")
    schema = parse_features({"label": "click",
                             "dense": [{"name": "amount", "transforms": []}],
                             "sparse": [{"name": "user", "id_type": "string"},
                                        {"name": "day", "id_type": "string"},
                                        {"name": "tags", "kind": "multi_hot", "max_len": 4}],
                             "tables": [{"name": "user", "rows": 50},
                                        {"name": "day", "rows": 7}, {"name": "tags", "rows": 20}]})
    out = tmp_path / "out_csv"
    rep = preprocess_table([text], out, cfg(out, max_reject_fraction=0.5), schema, delimiter=";")
    man = load_manifest(rep.manifest_path)
    rejects = read_rejects(man)
    assert [(int(r["line"]), r["reason"]) for r in rejects] == [
        (5, "bad dense value: amount='abc' is not a number"),  # the header is line 1
        (6, "bad label: click='x' is not a number"),
        (7, "bad id: tags='x' is not an integer"),
        (8, "bad id: tags='' is not an integer")]
    assert rep.lines_read == 8 and rep.rows_written == 4 and rep.rows_rejected == 4
    got = rows_of(man)
    assert sorted(got) == [0, 1, 2, 7]
    assert got[0]["tags"] == [4, 5, 6] and got[1]["tags"] == [] and got[2]["tags"] == [7]
    assert got[1]["amount"] == 0.0 and got[2]["amount"] == 100.0 and got[7]["amount"] == -7.0
    assert got[0]["user"] == [fnv1a("u1") % 50]
    assert got[0]["day"] == [fnv1a("2026-01-01") % 7]
    assert got[7]["day"] == [fnv1a("2026-01-02") % 7]
    out = tmp_path / "out_dir"
    rep = preprocess_table([tmp_path / "day=2026-01-01", tmp_path / "day=2026-01-02"], out,
                           cfg(out), schema)
    from_dir = rows_of(load_manifest(rep.manifest_path))
    assert [{**r, "row": None} for _, r in sorted(from_dir.items())] == \
        [{**r, "row": None} for _, r in sorted(got.items())]


def test_a_missing_or_mistyped_column_fails_before_any_work_naming_it(tmp_path, rng):
    pq.write_table(pa.table({"label": [0, 1], "price": [1.0, 2.0], "item": [1, 2]}),
                   tmp_path / "a.parquet")
    out = tmp_path / "out"
    base = {"dense": [{"name": "price"}], "sparse": [{"name": "item"}]}
    with pytest.raises(ConfigError) as e:
        preprocess_table([tmp_path / "a.parquet"], out, cfg(out),
                         parse_features({**base, "sparse": [{"name": "shop"}]}))
    assert str(e.value).startswith(f"{tmp_path / 'a.parquet'}: column 'shop' "
                                   "(features.sparse[0] (shop)) is missing")
    pq.write_table(pa.table({"label": [0, 1], "price": [1.0, 2.0], "item": ["a", "b"]}),
                   tmp_path / "b.parquet")
    with pytest.raises(ConfigError, match=r"b.parquet: column 'item' \(features.sparse\[0\] "
                       r"\(item\)\) has type string; expected integers \(id_type: int\)"):
        preprocess_table([tmp_path / "b.parquet"], out, cfg(out), parse_features(base))
    assert not (out / "_manifest.json").exists()


def test_numbers_stored_as_strings_in_parquet_parse_as_in_text(tmp_path, rng):
    n = 40
    price = np.abs(rng.normal(0, 3, n)).round(3)
    click = rng.integers(0, 2, n)
    item = rng.integers(0, 9, n)
    schema = parse_features({"dense": [{"name": "price"}], "sparse": [{"name": "item"}]})
    pq.write_table(pa.table({"label": click, "price": price, "item": item}), tmp_path / "n.parquet")
    as_text = {"label": [str(v) for v in click], "price": [str(v) for v in price], "item": item}
    as_text["price"][3], as_text["label"][5] = "abc", "x"  # rows 3 and 5 do not parse
    # spaces around a number, and a sign, as hand-written CSV has them: the same numbers
    as_text["price"][7], as_text["price"][9] = f" {price[7]}", f"+{price[9]} "
    as_text["label"][11] = f" {click[11]}\t"
    pq.write_table(pa.table(as_text), tmp_path / "s.parquet")
    assert pa.types.is_string(pq.read_schema(tmp_path / "s.parquet").field("price").type)
    ref = rows_of(load_manifest(preprocess_table(
        [tmp_path / "n.parquet"], tmp_path / "a", cfg(tmp_path / "a"), schema).manifest_path))
    man = load_manifest(preprocess_table([tmp_path / "s.parquet"], tmp_path / "b",
                                         cfg(tmp_path / "b", max_reject_fraction=0.1),
                                         schema).manifest_path)
    assert [r["reason"] for r in read_rejects(man)] == [
        "bad dense value: price='abc' is not a number", "bad label: label='x' is not a number"]
    got = rows_of(man)
    assert sorted(got) == sorted(set(ref) - {3, 5})
    # the same rows as the numeric file's, value for value
    assert all(got[r] == ref[r] for r in got)


def test_an_empty_or_header_only_input_is_named_before_any_work(tmp_path):
    schema = parse_features({"dense": [{"name": "price"}], "sparse": [{"name": "item"}]})
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as e:
        preprocess_table([empty], out, cfg(out), schema)
    assert str(e.value) == (f"{empty}: the file is empty (0 bytes): no header naming its columns "
                            "and no rows; remove it from the inputs or write its rows")
    header = tmp_path / "header.csv"
    header.write_text("label,price,item\n")
    with pytest.raises(ConfigError, match=r"^data.files: no rows to read: .*header.csv hold\(s\) "
                                          r"a header or schema and no rows$"):
        preprocess_table([header], out, cfg(out), schema)
    pq.write_table(pa.table({"label": pa.array([], pa.int64()), "price": pa.array([], pa.float64()),
                             "item": pa.array([], pa.int64())}), tmp_path / "none.parquet")
    with pytest.raises(ConfigError, match="no rows to read: .*none.parquet"):
        preprocess_table([tmp_path / "none.parquet"], out, cfg(out), schema)
    assert not (out / "_manifest.json").exists()
    # a header-only file beside one with rows is read as no rows
    (tmp_path / "rows.csv").write_text("label,price,item\n1,2.5,3\n0,1.0,4\n")
    rep = preprocess_table([header, tmp_path / "rows.csv"], out, cfg(out), schema)
    assert rep.rows_written == 2


def test_the_reject_threshold_stops_the_run_naming_the_rejects_file(tmp_path, rng):
    n = 100
    pq.write_table(pa.table({"label": [2] * 5 + [1] * (n - 5), "item": rng.integers(0, 9, n)}),
                   tmp_path / "a.parquet")
    out = tmp_path / "out"
    with pytest.raises(RejectedRowsError, match="rejected .more than max_reject_fraction=0.02"):
        preprocess_table([tmp_path / "a.parquet"], out, cfg(out, max_reject_fraction=0.02),
                         parse_features({"sparse": [{"name": "item"}]}))


def test_the_loader_reads_the_schema_s_features_and_one_step_trains(tmp_path, rng):
    from recscale.model.dlrm import ModelConfig
    from recscale.runconfig import TrainConfig
    from recscale.train.entry import train_dlrm

    n = 700
    pq.write_table(pa.table({
        "label": rng.integers(0, 2, n), "price": rng.random(n) * 10,
        "user": [f"u{i}" for i in rng.integers(0, 40, n)],
        "hist": pa.array([rng.integers(0, 99, rng.integers(0, 6)).tolist() for _ in range(n)],
                         pa.list_(pa.int64()))}), tmp_path / "a.parquet")
    schema = parse_features({"dense": [{"name": "price"}],
                             "sparse": [{"name": "user", "id_type": "string", "ids": "vocab"},
                                        {"name": "hist", "kind": "multi_hot"}],
                             "tables": [{"name": "hist", "rows": 64, "dim": 4}]})
    man = load_manifest(preprocess_table([tmp_path / "a.parquet"], tmp_path / "out",
                                         cfg(tmp_path / "out"), schema).manifest_path)
    loader = make_loader(man["splits"]["train"]["files"],
                         parse(LoaderConfig, {"batch_size": 128}, "loader"))
    batch = next(iter(loader))
    assert batch.sparse.keys == ("user", "hist") and batch.dense.shape == (128, 1)
    assert int(batch.sparse.values.max()) < 64
    model_cfg = parse(ModelConfig, {"embedding_dim": 8, "bottom_mlp": [8], "top_mlp": [8, 1],
                                    "interaction": "cat"}, "model")
    train_cfg = parse(TrainConfig, {"batch_size_per_rank": 128, "max_steps": 2,
                                    "progress": "off"}, "train")
    out = train_dlrm(man, model_cfg, train_cfg)
    assert out.result.steps == 2 and np.isfinite(out.result.final_loss)
    assert out.table_sizes == tuple(man["table_sizes"]) and man["table_sizes"][1] == 64
    pooled = out.model.embeddings.lookup(batch.sparse)
    assert pooled.shape == (128, 8 + 4)


def test_a_schema_of_your_own_reads_the_table_source_and_only_it():
    from recscale.runconfig import DLRMConfig

    own = {"sparse": [{"name": "item"}]}
    with pytest.raises(ConfigError, match="features=a schema is not allowed with "
                       "data.source='criteo_tsv'"):
        parse(DLRMConfig, {"features": own, "data": {"source": "criteo_tsv", "files": ["a"]}}, "")
    with pytest.raises(ConfigError, match="features='criteo' is not allowed with "
                       "data.source='table'"):
        parse(DLRMConfig, {"data": {"source": "table", "files": ["x.csv"]}}, "")
    cfg = parse(DLRMConfig, {"data": {"source": "table", "files": ["x.csv"]}, "features": own}, "")
    assert cfg.schema.sparse[0].name == "item"
    with pytest.raises(ConfigError, match=r"features.tables\[0\].dim=6"):
        parse(DLRMConfig, {"features": {**own, "tables": [{"name": "item", "dim": 6}]}}, "")


@pytest.mark.parametrize("bags", [False, True])
def test_the_loader_refuses_an_id_outside_its_table_naming_row_and_feature(tmp_path, rng, bags):
    from recscale.data.loader import IdOutOfRange

    n = 300
    items = rng.integers(0, 50, n)
    items[123] = 50  # one past the table of 50 rows
    col = pa.array([[int(v)] for v in items], pa.list_(pa.int64())) if bags else pa.array(items)
    users = pa.array([[1, 2]] * n, pa.list_(pa.int64())) if bags else pa.array([1] * n)
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"row": np.arange(n) + 1000, "label": np.zeros(n, np.int8),
                             "user": users, "item": col}), path, row_group_size=100)
    ok = make_loader([path], LoaderConfig(batch_size=64, table_rows=(10, 51)))
    assert sum(b.batch_size for b in ok) == n
    bad = make_loader([path], LoaderConfig(batch_size=64, table_rows=(10, 50)))
    with pytest.raises(IdOutOfRange, match=r"^row 1123 \(.*a.parquet, row group 1\): feature "
                       r"item has id 50, not a row of its table \(\[0, 50\)\)"):
        list(bad)


def test_hex_ids_read_as_their_value(rng):
    from recscale.data.table_parse import _hex_values

    words = [" 0", "ff", "DeadBeef", "0123456789abcdef", "7fffffffffffffff"] + \
        [f"{int(v):x}" for v in rng.integers(0, 2**62, 200)]
    want = [int(w, 16) for w in words]
    assert _hex_values(pa.array(words)).tolist() == want
    assert _hex_values(pa.array(["ffffffffffffffff"])).tolist() == [-1]  # the 64-bit pattern


def test_weights_follow_their_ids_and_a_shared_table_has_one_vocabulary(tmp_path, rng):
    """A weighted multi-hot list (keep_last) and a history sharing the item table's vocabulary:
    the written weights are the raw ones of the ids kept, in order; one raw id is one row for
    both features; a row whose weights do not match its ids is rejected with its reason; the
    loader's batches carry the weights (1 for unweighted features)."""
    n = 400
    tags = [rng.integers(0, 30, rng.integers(0, 7)).tolist() for _ in range(n)]
    tag_w = [np.round(rng.uniform(0.1, 3, len(t)), 3).tolist() for t in tags]
    tag_w[4] = tag_w[4] + [2.0]  # one weight too many
    tags[9] = tags[9] or [3]
    tag_w[9] = [None] * len(tag_w[9]) if tag_w[9] else [None]  # a null weight
    items = rng.integers(0, 50, n)
    hist = [rng.integers(0, 60, rng.integers(0, 5)).tolist() for _ in range(n)]
    pq.write_table(pa.table({"label": rng.integers(0, 2, n), "item": items,
                             "hist": pa.array(hist, pa.list_(pa.int64())),
                             "tags": pa.array(tags, pa.list_(pa.int64())),
                             "tag_w": pa.array(tag_w, pa.list_(pa.float64()))}),
                   tmp_path / "a.parquet")
    schema = parse_features({"sparse": [
        {"name": "item", "ids": "vocab", "table": "items"},
        {"name": "hist", "kind": "multi_hot", "ids": "vocab", "table": "items"},
        {"name": "tags", "kind": "multi_hot", "max_len": 4, "truncate": "keep_last",
         "weights": "tag_w", "pooling": "mean"}],
        "tables": [{"name": "tags", "rows": 100}]})
    man = load_manifest(preprocess_table([tmp_path / "a.parquet"], tmp_path / "out",
                                         cfg(tmp_path / "out"), schema).manifest_path)
    fitted = FittedSchema.of(man)
    assert fitted.table_names == ("items", "tags") and fitted.feature_tables() == (0, 0, 1)
    assert fitted.pooling() == ("sum", "sum", "mean") and fitted.weighted == ("tags",)
    reasons = {int(r["line"]) - 1: r["reason"] for r in read_rejects(man)}
    assert reasons[4] == f"bad weights: tags has {len(tags[4]) + 1} weights for {len(tags[4])} " \
                         "ids (column tag_w)"
    assert reasons[9] == "null in list: tag_w holds a null weight (tags)"
    got = rows_of(man)
    assert set(got) | set(reasons) == set(range(n)) and not set(got) & set(reasons)
    row_of_raw: dict[int, int] = {}
    for r, row in got.items():
        assert row["tags"] == [v % 100 for v in tags[r][-4:]]
        assert row["tags.weights"] == pytest.approx(tag_w[r][-4:], rel=1e-6)
        for raw, mapped in zip([int(items[r])] + hist[r], row["item"] + row["hist"]):
            assert row_of_raw.setdefault(raw, mapped) == mapped  # one row per raw id, both
    assert man["table_sizes"][0] == len(set(row_of_raw.values())) + (
        0 if 0 in row_of_raw.values() else 1)  # the vocabulary of both features, and its OOV
    batch = next(iter(make_loader(man["splits"]["train"]["files"],
                                  parse(LoaderConfig, {"batch_size": 64}, "loader"))))
    w = batch.sparse.weights
    assert w is not None and w.shape == batch.sparse.values.shape
    n_item_hist = int(batch.sparse.lengths[:2].sum())
    assert bool((w[:n_item_hist] == 1).all())
    first = [got[int(r)] for r in batch.row_ids]
    want = [x for row in first for x in row["tags.weights"]]
    np.testing.assert_allclose(w[n_item_hist:].numpy(), want, rtol=1e-6)


def test_weights_in_text_are_split_at_the_delimiter_and_a_non_number_is_a_reject(tmp_path):
    (tmp_path / "a.csv").write_text(
        "click,tags,tag_w\n1,3|4,0.5|2\n0,5,x\n1,,\n0,7|8|9,1|1.5|0.25\n")
    schema = parse_features({"label": "click", "sparse": [
        {"name": "tags", "kind": "multi_hot", "weights": "tag_w", "pooling": "mean"}],
        "tables": [{"name": "tags", "rows": 16}]})
    man = load_manifest(preprocess_table([tmp_path / "a.csv"], tmp_path / "out",
                                         cfg(tmp_path / "out", max_reject_fraction=1.0),
                                         schema).manifest_path)
    assert [(r["line"], r["reason"]) for r in read_rejects(man)] == [
        ("3", "bad weight: tag_w='x' is not a number")]
    got = rows_of(man)
    assert {r: (v["tags"], v["tags.weights"]) for r, v in got.items()} == {
        0: ([3, 4], [0.5, 2.0]), 2: ([], []), 3: ([7, 8, 9], [1.0, 1.5, 0.25])}
