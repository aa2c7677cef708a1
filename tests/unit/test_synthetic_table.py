"""The generator speaks any schema: every feature kind drawn with its id type, the planted
model's probabilities beside the file (its AUC the oracle's), the same bytes for the same config;
ids that arrive over time (most test users unseen under a time split, item popularity drifting),
attributes fixed per id, and noise features that the oracle ignores."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recscale.config import ConfigError, parse
from recscale.data.preprocess import preprocess_table
from recscale.data.processed import PreprocessConfig, load_manifest
from recscale.data.schema import parse_features
from recscale.data.synthetic_table import SchemaPlantedModel, TableSynthConfig, generate_table
from recscale.evaluate.metrics import auc_score, oracle_auc

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
    assert np.array_equal(np.load(rep.labels_path), y)
    assert oracle_auc(rep) == auc_score(y, probs) and 0.7 < oracle_auc(rep) < 1
    assert abs(y.mean() - 0.25) < 0.03
    # the same config: the same bytes (generated again, not reused)
    again = generate_table(SCHEMA, cfg(seed), tmp_path / "b.parquet")
    assert sha(again.path) == sha(rep.path) and sha(again.labels_path) == sha(rep.labels_path)
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


def planted_logit_fit(t: pa.Table, logit: np.ndarray, sparse: list[str], dense: list[str]):
    """Least squares of ``logit`` on the written columns as the planted additive form reads them:
    one column per id of each sparse feature (a bag's ids counted), log1p of each dense column
    and its missing flag, and a constant. Returns the residual's largest size and each block's
    coefficients."""
    blocks, names = [np.ones((t.num_rows, 1))], ["const"]
    for c in sparse:
        col = t.column(c).combine_chunks()
        if pa.types.is_list(col.type):
            lengths = pa.compute.fill_null(pa.compute.list_value_length(col), 0).to_numpy()
            values = np.array(pa.compute.list_flatten(col).to_pylist(), dtype=object)
        else:
            lengths = (~col.is_null().to_numpy(zero_copy_only=False)).astype(np.int64)
            values = np.array(col.drop_null().to_pylist(), dtype=object)
        uniq, inv = np.unique(values.astype(str), return_inverse=True)
        x = np.zeros((t.num_rows, len(uniq)))
        np.add.at(x, (np.repeat(np.arange(t.num_rows), lengths), inv), 1.0)
        blocks.append(x)
        names.append(c)
    for c in dense:
        v = t.column(c).to_numpy(zero_copy_only=False).astype(float)
        miss = np.isnan(v)
        blocks += [np.where(miss, 0, np.log1p(np.nan_to_num(v)))[:, None], miss[:, None] * 1.0]
        names += [c, c + ".missing"]
    x = np.concatenate(blocks, 1)
    coef = np.linalg.lstsq(x, logit, rcond=None)[0]
    sizes = np.cumsum([0] + [b.shape[1] for b in blocks])
    return np.abs(x @ coef - logit).max(), {n: coef[a:b] for n, a, b in
                                            zip(names, sizes[:-1], sizes[1:])}


def logit(p: np.ndarray) -> np.ndarray:
    return np.log(p) - np.log1p(-p)


def test_the_oracle_is_the_planted_additive_form_of_the_written_columns(tmp_path, seed):
    # no crosses: the oracle's logit is a constant, an effect per id (a bag's summed), and a
    # linear effect of log1p of each dense column: least squares on the written columns fits it
    # exactly. Two dense features of one column (price, band) see the value that is written.
    gen = parse(TableSynthConfig, {"num_rows": 3000, "seed": seed, "crosses": 0, "features": {
        "user": {"cardinality": 40}, "item": {"cardinality": 30}, "site": {"cardinality": 20},
        "tags": {"cardinality": 12, "pooling": 2.0}}}, "data.generator")
    rep = generate_table(SCHEMA, gen, tmp_path / "a.parquet")
    t = pq.read_table(rep.path)
    resid, _ = planted_logit_fit(t, logit(np.load(rep.oracle_path)),
                                 ["user", "item", "site", "tags"], ["price"])
    assert resid < 1e-3  # prices are written to 4 decimals


ARRIVING = parse_features({
    "label": "y",
    "dense": [{"name": "price"}, {"name": "noise_seconds"}],
    "sparse": [{"name": "user", "id_type": "string", "ids": "vocab"},
               {"name": "item", "ids": "vocab"},
               {"name": "age"},
               {"name": "genres", "kind": "multi_hot", "id_type": "string", "pooling": "mean"},
               {"name": "device", "id_type": "string"}]})


def arriving(seed: int, rows: int = 20_000, **over) -> TableSynthConfig:
    features = {"user": {"cardinality": 2000, "missing": 0.0, "lifetime": 0.1},
                "item": {"cardinality": 300, "missing": 0.0, "lifetime": 0.5},
                "age": {"of": "user", "cardinality": 7, "missing": 0.0},
                "genres": {"of": "item", "cardinality": 12, "pooling": 1.8},
                "price": {"of": "item", "missing": 0.0},
                "device": {"cardinality": 5, "effect": 0.0},
                "noise_seconds": {"effect": 0.0, "missing": 0.1}}
    features.update(over.pop("features", {}))
    return parse(TableSynthConfig, {"num_rows": rows, "seed": seed, "base_ctr": 0.3,
                                    "cross_pairs": [["age", "genres"]], "features": features,
                                    **over}, "data.generator")


def unseen_share(col: pa.ChunkedArray, n: int) -> float:
    """The share of the last tenth's rows whose id the first 80% never holds."""
    values = np.array(col.to_pylist(), dtype=object)
    train = set(values[: int(0.8 * n)].tolist())
    return float(np.mean([v not in train for v in values[int(0.9 * n):]]))


def test_arriving_ids_leave_most_test_users_unseen_under_a_time_split(tmp_path, seed):
    rep = generate_table(ARRIVING, arriving(seed), tmp_path / "a.parquet")
    t = pq.read_table(rep.path)
    users, items = unseen_share(t.column("user"), 20_000), unseen_share(t.column("item"), 20_000)
    assert 0.6 <= users <= 0.9  # the promise of docs/features.md (a real ratings log: 86%)
    assert 0.05 <= items <= 0.5 and items < users - 0.2
    # static ids (no lifetime): the test rows' users were nearly all seen
    static = generate_table(ARRIVING, arriving(seed, features={
        "user": {"cardinality": 2000, "missing": 0.0}, "item": {"cardinality": 300}}),
        tmp_path / "s.parquet")
    assert unseen_share(pq.read_table(static.path).column("user"), 20_000) < 0.1
    # every row draws only ids that have arrived by its time, and an attribute is fixed per id
    model = SchemaPlantedModel(ARRIVING, arriving(seed))
    arrival = model.arrivals["user"][0]
    ranks = np.array([int(s.rsplit("-", 1)[1]) for s in t.column("user").to_pylist()])
    assert np.all(arrival[ranks] <= np.arange(20_000) / 20_000)
    ages = {}
    for u, a in zip(ranks.tolist(), t.column("age").to_pylist()):
        assert ages.setdefault(u, a) == a
    genres = {}
    for i, g in zip(t.column("item").to_pylist(), t.column("genres").to_pylist()):
        assert genres.setdefault(i, g) == g


def test_arriving_ids_same_bytes_for_the_same_seed_and_a_sensible_oracle(tmp_path, seed):
    rep = generate_table(ARRIVING, arriving(seed), tmp_path / "a.parquet")
    again = generate_table(ARRIVING, arriving(seed), tmp_path / "b.parquet")
    assert sha(again.path) == sha(rep.path) and sha(again.oracle_path) == sha(rep.oracle_path)
    assert sha(generate_table(ARRIVING, arriving(seed + 1), tmp_path / "c.parquet").path) != \
        sha(rep.path)
    y = pq.read_table(rep.path, columns=["y"]).column("y").to_numpy()
    p = np.load(rep.oracle_path)
    assert oracle_auc(rep) == auc_score(y, p) and 0.7 < oracle_auc(rep) < 0.95
    assert abs(y.mean() - 0.3) < 0.03
    assert auc_score(y[18_000:], p[18_000:]) > 0.7  # the test split's rows too


def test_noise_features_have_no_effect_on_the_oracle(tmp_path, seed):
    # without crosses the oracle's logit is additive in the user, the item (age, genres and
    # price are functions of them) and the dense columns: the fit is exact, and the noise
    # features' coefficients are all equal (device) or zero (noise_seconds)
    rep = generate_table(ARRIVING, arriving(seed, rows=6000, cross_pairs=[], crosses=0),
                         tmp_path / "a.parquet")
    t = pq.read_table(rep.path)
    resid, coef = planted_logit_fit(t, logit(np.load(rep.oracle_path)),
                                    ["user", "item", "device"], ["price", "noise_seconds"])
    assert resid < 1e-3  # dense values are written to 4 decimals
    assert np.ptp(coef["device"]) < 1e-4 and len(coef["device"]) == 5
    assert abs(coef["noise_seconds"][0]) < 1e-4 and abs(coef["noise_seconds.missing"][0]) < 1e-4
    assert np.ptp(coef["user"]) > 0.5  # the fit does see the features that carry signal


def test_item_popularity_drifts_when_items_arrive(tmp_path, seed):
    def top(t, lo, hi, k=10):
        ids, counts = np.unique(np.array(t.column("item").to_pylist())[lo:hi], return_counts=True)
        return set(ids[np.argsort(-counts)[:k]].tolist())

    t = pq.read_table(generate_table(ARRIVING, arriving(seed), tmp_path / "a.parquet").path)
    assert len(top(t, 0, 2000) & top(t, 18_000, 20_000)) <= 5  # 0 to 3 over 30 seeds
    static = pq.read_table(generate_table(ARRIVING, arriving(seed, features={
        "item": {"cardinality": 300, "missing": 0.0}}), tmp_path / "s.parquet").path)
    assert len(top(static, 0, 2000) & top(static, 18_000, 20_000)) >= 7  # 8 to 10


def test_bad_arrival_and_attribute_settings_name_their_key():
    with pytest.raises(ConfigError, match=r"data.generator.features.age.lifetime=0.1"):
        arriving(0, features={"age": {"of": "user", "lifetime": 0.1}})
    with pytest.raises(ConfigError, match=r"data.generator.features.age.of='genres'"):
        SchemaPlantedModel(ARRIVING, arriving(0, features={"age": {"of": "genres"}}))
    with pytest.raises(ConfigError, match=r"data.generator.cross_pairs\[0\]"):
        SchemaPlantedModel(ARRIVING, arriving(0, cross_pairs=[["age", "colour"]]))
    with pytest.raises(ConfigError, match=r"data.generator.features.user.lifetime=-1"):
        arriving(0, features={"user": {"lifetime": -1}})
