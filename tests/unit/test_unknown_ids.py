"""Ids unseen in training look up a trained row (recscale.data.unknown_ids,
recscale.embedding.unknown): the routing against a plain-Python reference, only on the train
split and the same on any world size or resume, the row counts and data-sized hashed tables of
preprocessing, the unknown row trained end to end, a new user's score depending on it, and
untrained rows filled from it."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from recscale.config import ConfigError, parse
from recscale.data.loader import LoaderConfig, list_row_groups, make_loader, read_row_group
from recscale.data.preprocess import preprocess_table
from recscale.data.processed import PreprocessConfig, load_manifest
from recscale.data.schema import FittedSchema, parse_features
from recscale.data.unknown_ids import (
    UnknownIdsConfig,
    UnknownRouter,
    count_train_rows,
    load_row_counts,
    route_uniform,
)
from recscale.embedding.tbe import table_init
from recscale.embedding.unknown import fill_untrained_rows
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig, recipe_for
from recscale.scoring import score_split
from recscale.train import train_dlrm
from recscale.train.rank import loader_data

M64 = (1 << 64) - 1


def mix(x: int) -> int:
    """splitmix64's finalizer, in Python integers (the reference)."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def ref_uniform(seed: int, row: int, feature: int, place: int) -> float:
    h = mix(mix(seed & M64) ^ (row & M64))
    h = mix(h ^ (((feature << 32) | place) & M64))
    return (h >> 11) / float(1 << 53)


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


SCHEMA = {
    "label": "y",
    "dense": [{"name": "price", "transforms": ["log1p"]},
              {"name": "band", "column": "price", "transforms": [{"bucketize": [2.0, 10.0]}]}],
    "sparse": [{"name": "user", "id_type": "string", "ids": "vocab"},
               {"name": "item", "ids": "hash"},
               {"name": "hist", "kind": "multi_hot", "table": "item", "ids": "hash", "max_len": 5},
               {"name": "gender", "id_type": "string", "ids": "hash"}],
    "tables": [{"name": "gender", "rows": 500, "dim": 4}]}


def make_log(path, rng, n: int, new_users_from: float = 0.8):
    """A click log in time order: the users of its last rows are new (never in the first
    ones)."""
    t = np.arange(n)
    cut = int(n * new_users_from)
    user = np.where(t < cut, rng.zipf(1.3, n) % 150, 1000 + rng.integers(0, 200, n))
    item = rng.zipf(1.4, n) % 90
    hist = [list(map(int, rng.integers(0, 90, rng.integers(0, 6)))) for _ in range(n)]
    gender = rng.choice(["f", "m", "x"], n)
    price = rng.lognormal(1.5, 1.0, n)
    logit = 0.8 * np.sin(user) + 0.6 * np.cos(item) - 0.3
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int8)
    pq.write_table(pa.table({"y": y, "user": [f"u{u}" for u in user], "item": item,
                             "hist": pa.array(hist, pa.list_(pa.int64())), "gender": gender,
                             "price": price}), path)


def build(tmp_path, rng, bags: bool = True) -> dict:
    make_log(tmp_path / "log.parquet", rng, 1500)
    out = tmp_path / "out"
    cfg = PreprocessConfig(output_dir=str(out), row_group_size=128, max_table_size=10_000)
    schema = dict(SCHEMA, sparse=[f for f in SCHEMA["sparse"] if bags or f["name"] != "hist"])
    rep = preprocess_table([tmp_path / "log.parquet"], out, cfg, parse_features(schema))
    return load_manifest(rep.manifest_path)


@pytest.fixture
def dataset(tmp_path, rng):
    return build(tmp_path, rng)


def read_split(manifest: dict, split: str) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in manifest["splits"][split]["files"]])


# --- preprocessing: row counts and table sizes -----------------------------------------------------
def test_row_counts_equal_the_train_split_and_hashed_tables_are_sized_from_its_ids(
        dataset, tmp_path, rng):
    man = dataset
    fitted = FittedSchema.of(man)
    assert fitted.table_names == ("user", "item", "gender", "band")
    train = read_split(man, "train")
    counts = load_row_counts(man["row_counts_path"], fitted.table_names)
    item_ids = np.concatenate([train.column("item").to_numpy(),
                               np.concatenate([np.asarray(h, np.int64) for h in
                                               train.column("hist").to_pylist()])])
    for t, col in ((0, np.concatenate([np.asarray(v, np.int64) for v in
                                       train.column("user").to_pylist()])),
                   (1, item_ids)):
        u, c = np.unique(col, return_counts=True)
        assert counts[t][0].tolist() == u.tolist() and counts[t][1].tolist() == c.tolist()
    # the item table (no rows given) is 4x the distinct raw ids of the train split, item and
    # history together; the raw log's rows are the split's (none rejected)
    raw = pq.read_table(tmp_path / "log.parquet").slice(0, man["splits"]["train"]["rows"])
    distinct = set(raw.column("item").to_pylist()) | \
        {i for h in raw.column("hist").to_pylist() for i in h}
    assert man["table_sizes"][1] == 4 * len(distinct)
    assert man["table_sizes"][2] == 500 and man["train_rows_used"][2] == 3


def test_row_counts_of_a_table_far_larger_than_a_row_group_equal_numpy(tmp_path, rng):
    """A table of many rows is counted per row group by its ids (np.unique), not over all its
    rows (bincount): the same counts either way."""
    make_log(tmp_path / "log.parquet", rng, 1500)
    out = tmp_path / "out"
    schema = dict(SCHEMA, tables=[{"name": "gender", "rows": 200_000, "dim": 4}])
    rep = preprocess_table([tmp_path / "log.parquet"], out,
                           PreprocessConfig(output_dir=str(out), row_group_size=128,
                                            max_table_size=1_000_000), parse_features(schema))
    man = load_manifest(rep.manifest_path)
    fitted = FittedSchema.of(man)
    assert fitted.table_rows[2] == 200_000  # gender: 128 ids per row group, 200,000 rows
    train = read_split(man, "train")
    got = count_train_rows(man["splits"]["train"]["files"], fitted)
    for t, name in enumerate(("user", "item", "gender")):
        cols = [c for c in ("user", "item", "hist", "gender")
                if (c == name) or (c == "hist" and name == "item")]
        ids = np.concatenate([np.concatenate([np.asarray(v, np.int64).ravel()
                                              for v in train.column(c).to_pylist()])
                              for c in cols])
        u, c = np.unique(ids, return_counts=True)
        assert got[t][0].tolist() == u.tolist() and got[t][1].tolist() == c.tolist(), name


def test_a_table_far_larger_than_its_ids_warns_and_the_size_is_capped(tmp_path, rng, caplog):
    make_log(tmp_path / "log.parquet", rng, 400)
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        man = load_manifest(preprocess_table(
            [tmp_path / "log.parquet"], out,
            PreprocessConfig(output_dir=str(out), max_table_size=50), parse_features(SCHEMA)
        ).manifest_path)
    assert man["table_sizes"][1] == 50  # 4 x the distinct items, capped
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and "table gender" in r.getMessage()]
    assert warned == ["table gender has 500 rows but the train split's ids use 3 of them (more "
                      "than 10x): give it rows in features.tables, or leave them null to size "
                      "it from the data"]


# --- routing --------------------------------------------------------------------------------------
@pytest.mark.parametrize("bags", [True, False], ids=["bags", "one-hot"])
def test_routing_equals_the_reference_and_only_changes_train_batches(tmp_path, rng, bags):
    man = build(tmp_path, rng, bags)
    fitted = FittedSchema.of(man)
    counts = load_row_counts(man["row_counts_path"], fitted.table_names)
    n_of = [dict(zip(r.tolist(), c.tolist())) for r, c in counts]
    # band: a bucketized feature, no unknown id
    routable = [f.ids in ("hash", "vocab") for f in fitted.schema.sparse_inputs]
    assert routable[-1] is False and len(routable) == (5 if bags else 4)
    tables = fitted.feature_tables()
    k, seed = 1.5, 11
    train_cfg = parse(TrainConfig, {"batch_size_per_rank": 100, "seed": seed,
                                    "unknown_ids": {"k": k}, "progress": "off"}, "train")
    data = loader_data(man, train_cfg, 0, 1, torch.device("cpu"))
    plain = make_loader(man["splits"]["train"]["files"], LoaderConfig(batch_size=100))
    routed_n, seen = {}, {}
    for got, want in zip(data.open(), plain, strict=True):
        assert torch.equal(got.row_ids, want.row_ids) and torch.equal(got.labels, want.labels)
        assert torch.equal(got.sparse.lengths, want.sparse.lengths)
        vals, lens = want.sparse.values.tolist(), want.sparse.lengths.tolist()
        expect, pos = [], 0
        for j in range(len(lens)):  # feature-major: feature j's bags, row by row
            for i, length in enumerate(lens[j]):
                for p in range(length):
                    v = vals[pos]
                    pos += 1
                    n = n_of[tables[j]].get(v, 0)
                    hit = routable[j] and v != 0 and n > 0 and \
                        ref_uniform(seed, int(want.row_ids[i]), j, p) * n < k
                    expect.append(0 if hit else v)
                    if routable[j] and v != 0:
                        key = min(n, 4)
                        seen[key] = seen.get(key, 0) + 1
                        routed_n[key] = routed_n.get(key, 0) + hit
        assert got.sparse.values.tolist() == expect
    # frequency-aware: ids seen once or with k/n >= 1 always go, frequent ones rarely
    assert routed_n[1] == seen[1] and seen[1] > 10
    assert 0 < routed_n[4] / seen[4] < 0.4
    # validation and test are read as written (the scoring path's loader has no routing)
    for split in ("validation", "test"):
        t = read_split(man, split)
        batches = list(make_loader(man["splits"][split]["files"],
                                   LoaderConfig(batch_size=10_000)))
        assert batches[0].sparse.values[:len(t)].tolist() == \
            t.column("user").to_numpy().tolist()[:len(t)]


def test_routing_is_the_same_on_any_world_size_slice_and_resume(dataset):
    man = dataset
    train_cfg = parse(TrainConfig, {"batch_size_per_rank": 64, "progress": "off"}, "train")
    cpu = torch.device("cpu")

    def rows_and_ids(batches):
        out = {}
        for b in batches:
            vals = b.sparse.values.tolist()
            lens = b.sparse.lengths.tolist()
            pos = 0
            for j in range(len(lens)):
                for i, length in enumerate(lens[j]):
                    out[(int(b.row_ids[i]), j)] = vals[pos: pos + length]
                    pos += length
        return out

    one = rows_and_ids(loader_data(man, train_cfg, 0, 1, cpu).open())
    two = {}
    for r in range(2):
        two.update(rows_and_ids(loader_data(man, train_cfg, r, 2, cpu).open()))
    assert one == two and len(one) == 5 * man["splits"]["train"]["rows"]
    # a loader resumed mid-epoch yields the batches the uninterrupted one did
    data = loader_data(man, train_cfg, 0, 1, cpu)
    loader = data.open()
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    rest = [b.sparse.values.tolist() for b in it]
    again = data.open()
    again.load_state_dict(state)
    assert [b.sparse.values.tolist() for b in again] == rest
    # a row position interval (a resharded epoch) routes its rows as the whole epoch does
    part = rows_and_ids(data.open([[100, 300]]))  # the train split's rows are numbered from 0
    assert part == {key: v for key, v in one.items() if 100 <= key[0] < 300}


def test_route_uniform_is_the_reference_hash(rng):
    rows = rng.integers(0, 1 << 40, 200)
    feats = rng.integers(0, 30, 200)
    places = rng.integers(0, 50, 200)
    got = route_uniform(7, rows, feats, places)
    assert got.tolist() == [ref_uniform(7, int(r), int(f), int(p))
                            for r, f, p in zip(rows, feats, places)]
    assert 0.4 < float(route_uniform(3, np.arange(20000), np.zeros(20000), np.zeros(20000))
                       .mean()) < 0.6


def test_unknown_ids_config_names_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError, match=r"train\.unknown_ids\.routing.*'sometimes'"):
        parse(TrainConfig, {"unknown_ids": {"routing": "sometimes"}}, "train")
    with pytest.raises(ConfigError, match=r"train\.unknown_ids\.k.*> 0"):
        parse(TrainConfig, {"unknown_ids": {"k": 0}}, "train")
    assert TrainConfig().unknown_ids == UnknownIdsConfig("frequency", 1.0, True)


def test_the_router_refuses_columns_of_another_schema(dataset):
    man = dataset
    fitted = FittedSchema.of(man)
    router = UnknownRouter(fitted, load_row_counts(man["row_counts_path"], fitted.table_names),
                           1.0, 0)
    c = read_row_group(list_row_groups(man["splits"]["train"]["files"])[0])
    c.keys = ("a",) + tuple(c.keys[1:])
    with pytest.raises(ValueError, match="not the fitted schema's"):
        router(c)


# --- training: the unknown row trains; a new user's score depends on it ---------------------------
MODEL = {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1], "interaction": "cat"}


def _train(man, **unknown):
    model_cfg = parse(ModelConfig, MODEL, "model")
    train_cfg = parse(TrainConfig, {"batch_size_per_rank": 128, "epochs": 2, "progress": "off",
                                    "checkpoint": {"dir": None}, "unknown_ids": unknown},
                      "train")
    out = train_dlrm(man, model_cfg, train_cfg)
    return out, model_cfg, train_cfg


def test_the_unknown_row_trains_and_a_new_users_score_depends_on_it(dataset):
    man = dataset
    # without routing (the problem): with min_count 1 no train id maps to row 0
    off, _, train_cfg = _train(man, routing="off")
    user0 = off.model.embeddings.split_weights()[0][0].detach().clone()
    assert torch.equal(user0, table_init(train_cfg.seed, 0, man["table_sizes"][0], 8)[0])
    out, model_cfg, train_cfg = _train(man)
    w = out.model.embeddings.split_weights()[0]
    init = table_init(train_cfg.seed, 0, *w.shape)
    assert not torch.equal(w[0], init[0])  # the unknown row trained
    # the test split's users are new: they map to row 0, and their scores follow row 0
    test = read_split(man, "test")
    new = test.column("user").to_numpy() == 0
    assert new.all()
    before = score_split(out.model, man, "test", 256).probs
    with torch.no_grad():
        w[0] += 0.5 * torch.randn(w.shape[1])
    after = score_split(out.model, man, "test", 256).probs
    assert (np.abs(after - before) > 1e-6).all()
    # and equal a model whose row 0 is the trained vector, the rest of the table changed
    with torch.no_grad():
        w[1:] = 0.0
    assert np.array_equal(score_split(out.model, man, "test", 256).probs, after)


# --- filling untrained rows -----------------------------------------------------------------------
def test_untrained_rows_of_hashed_and_vocab_tables_get_the_trained_unknown_row(dataset, rng):
    man = dataset
    fitted = FittedSchema.of(man)
    model_cfg = parse(ModelConfig, MODEL, "model")
    train_cfg = parse(TrainConfig, {"seed": 5}, "train")
    model = recipe_for(man, model_cfg, train_cfg).build()
    weights = model.embeddings.split_weights()
    touched = []
    with torch.no_grad():
        for w in weights:  # "training": some rows (row 0 among them) move
            rows = np.flatnonzero(rng.random(w.shape[0]) < 0.3)
            rows = np.union1d(rows, [0])
            w[torch.from_numpy(rows)] += torch.from_numpy(
                rng.normal(0, 0.1, (len(rows), w.shape[1])).astype(np.float32))
            touched.append(rows)
    before = [w.detach().clone() for w in weights]
    filled = fill_untrained_rows(model.embeddings, fitted, train_cfg.seed)
    after = model.embeddings.split_weights()
    for t, name in enumerate(fitted.table_names):
        moved = np.zeros(before[t].shape[0], bool)
        moved[touched[t]] = True
        if name == "band":  # index ids: no unknown row, left alone
            assert torch.equal(after[t], before[t]) and name not in filled
            continue
        assert filled[name] == int((~moved).sum())
        assert torch.equal(after[t][torch.from_numpy(moved)], before[t][torch.from_numpy(moved)])
        assert (after[t][torch.from_numpy(~moved)] == before[t][0]).all()
    # a table whose unknown row never trained is left alone; fill: false does nothing
    fresh = recipe_for(man, model_cfg, train_cfg).build()
    start = [w.detach().clone() for w in fresh.embeddings.split_weights()]
    assert fill_untrained_rows(fresh.embeddings, fitted, train_cfg.seed) == {}
    assert fill_untrained_rows(model.embeddings, fitted, train_cfg.seed,
                               UnknownIdsConfig(fill=False)) == {}
    assert all(torch.equal(a, b) for a, b in zip(start, fresh.embeddings.split_weights()))
