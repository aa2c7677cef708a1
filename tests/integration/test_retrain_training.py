"""The retrain's warm starts where they train: a second retrain with a vocabulary keeps every
existing id's row and grows the model, and a warm start trains on the plan's tiers and returns an
in-memory CPU model."""

import numpy as np
import pytest
import torch

from recscale.config import parse
from recscale.data.criteo import SPARSE_NAMES
from recscale.retrain import WarmStart, first_warm_start, state_dict_file_source
from recscale.retrain.warm import save_latest
from tests.conftest import small_synthetic_config


def test_a_warm_start_trains_on_the_plans_tiers_and_returns_an_in_memory_cpu_model(
        parquet_dataset, tmp_path):
    """The retrain's training takes the one training path: the plan's memory tiers (here a RAM
    budget puts the largest tables on SSD) and an ordinary in-memory CPU model back, equal to
    the same warm start trained all in memory."""
    from recscale.embedding import FusedEmbeddingBags
    from recscale.retrain import DLRMRetrainConfig, train_warm

    train = {"batch_size_per_rank": 256, "max_steps": 4, "progress": "off", "seed": 2,
             "checkpoint": {"dir": None}}
    tiers = {"ram_budget_bytes": 2_000_000, "scratch_dir": str(tmp_path / "scratch"),
             "min_cache_rows": 256}
    model = {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}
    in_memory = parse(DLRMRetrainConfig, {"model": model, "train": train}, "")
    on_tiers = parse(DLRMRetrainConfig, {"model": model, "train": {**train, "tiers": tiers}}, "")
    first = train_warm(parquet_dataset, in_memory)
    warm = WarmStart("latest", first.model.state_dict(),
                     {"table_sizes": parquet_dataset["table_sizes"]}, "the first retrain")
    tiered = train_warm(parquet_dataset, on_tiers, warm)
    memory = train_warm(parquet_dataset, in_memory, warm)
    assert tiered.result.extra["tiers.lookups"] > 0 and tiered.result.extra["tiers.bytes_read.ssd"] > 0
    assert isinstance(tiered.model.embeddings, FusedEmbeddingBags)
    assert next(tiered.model.dense_parameters()).device.type == "cpu"
    a, b, c = tiered.model.state_dict(), memory.model.state_dict(), first.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)  # it trained on from the warm state
    assert not list((tmp_path / "scratch").glob("tiered-*"))  # scratch files released


def test_a_retrain_with_a_vocabulary_keeps_existing_ids_rows_and_grows_the_model(tmp_path):
    """Two retrains with ``ids: vocab``: the second grows the first's vocabulary (every id keeps
    its row), warm-starts from the first's model into the larger tables and trains; a vocabulary
    that does not match the warm model's tables fails naming the table and the sizes."""
    from recscale.data.synthetic import generate_criteo_tsv
    from recscale.data.vocab import VocabularyMismatch, load_vocabulary
    from recscale.retrain import (
        DLRMRetrainConfig,
        checkpoint_source,
        find_partitions,
        prepare_partitions,
        train_warm,
    )
    from recscale.retrain.data import vocabulary_file

    landing = tmp_path / "daily"
    syn = small_synthetic_config(num_rows=2500)
    generate_criteo_tsv(syn, landing / "day_00.tsv", day=0)
    generate_criteo_tsv(syn, landing / "day_01.tsv", day=1)
    parts = find_partitions(landing, "day_*.tsv")
    cfg = parse(DLRMRetrainConfig, {
        "preprocess": {"ids": "vocab", "vocab": {"min_count": 1}, "row_group_size": 1000},
        "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
        # the returned model's untrained rows take the unknown row (train.unknown_ids.fill)
        # while the checkpoint keeps training's state: the two warm starts compared below
        # start from the same rows only without it
        "train": {"batch_size_per_rank": 256, "progress": "off", "seed": 1,
                  "checkpoint": {"dir": None}, "unknown_ids": {"fill": False}},
        "retrain": {"work_dir": str(tmp_path / "work"), "model_dir": str(tmp_path / "models")}},
        "")
    m1 = prepare_partitions(parts[:1], WarmStart("cold"), cfg)
    v1 = load_vocabulary(m1["vocabulary_path"], SPARSE_NAMES)
    first = train_warm(m1, cfg, checkpoint_dir=str(tmp_path / "checkpoints"))
    save_latest(tmp_path / "models", first.model.state_dict(), {"table_sizes": m1["table_sizes"]})
    warm = first_warm_start([("latest", state_dict_file_source(tmp_path / "models"))])
    m2 = prepare_partitions(parts[1:], warm, cfg)
    v2 = load_vocabulary(m2["vocabulary_path"], SPARSE_NAMES)
    assert all(np.array_equal(b[:len(a)], a) for a, b in zip(v1.ids, v2.ids))  # same rows
    assert all(b >= a for a, b in zip(m1["table_sizes"], m2["table_sizes"]))
    assert sum(m2["table_sizes"]) > sum(m1["table_sizes"])  # day 1 brought new ids
    second = train_warm(m2, cfg, warm)
    assert second.table_sizes == tuple(m2["table_sizes"]) and second.result.steps > 0
    w1, w2 = first.model.embeddings.split_weights(), second.model.embeddings.split_weights()
    assert all(b.shape[0] == s for b, s in zip(w2, m2["table_sizes"]))
    assert any(not torch.equal(b[:a.shape[0]], a) for a, b in zip(w1, w2))  # trained on
    # from the first run's checkpoint (through its state_dict): the same grown run
    from_ckpt = train_warm(m2, cfg, checkpoint_source(tmp_path / "checkpoints")())
    a, b = from_ckpt.model.state_dict(), second.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the kept vocabulary of the warm model's sizes does not match its tables
    wrong = WarmStart("latest", None, {"table_sizes": [s + 1 for s in m1["table_sizes"]]}, "x")
    v1.save(vocabulary_file(tmp_path / "models", wrong.table_sizes))
    with pytest.raises(VocabularyMismatch, match=f"table C1 at {m1['table_sizes'][0]} rows but "
                                                 f"the warm start from latest has "
                                                 f"{m1['table_sizes'][0] + 1}"):
        prepare_partitions(parts[1:], wrong, cfg)


def test_a_schema_of_your_own_retrains_nightly_on_day_directories(tmp_path):
    """``features`` of your own: each night's partition is a directory of parquet parts
    (``day=N/``) read through the schema; night 2 grows night 1's vocabulary (its ids keep their
    rows), warm-starts into the grown tables and trains; every row of the day is accounted for."""
    import pyarrow.parquet as pq

    from recscale.data.schema import parse_features
    from recscale.data.synthetic_table import TableSynthConfig, generate_table
    from recscale.data.vocab import load_vocabulary
    from recscale.retrain import DLRMRetrainConfig, find_partitions, prepare_partitions, train_warm

    schema = {"label": "click", "dense": [{"name": "price", "transforms": ["log1p", "standardize"]}],
              "sparse": [{"name": "user", "id_type": "string"},
                         {"name": "item", "ids": "vocab"},
                         {"name": "tags", "kind": "multi_hot", "max_len": 4,
                          "truncate": "keep_first"}],
              "tables": [{"name": "user", "rows": 64}, {"name": "tags", "rows": 32}]}
    landing = tmp_path / "daily"
    for day, cards in ((1, 40), (2, 70)):  # day 2 brings items day 1 never had
        gen = parse(TableSynthConfig, {"num_rows": 1500, "seed": day, "features": {
            "item": {"cardinality": cards}, "tags": {"cardinality": 12, "pooling": 2.0}}}, "g")
        raw = generate_table(parse_features(schema), gen, tmp_path / f"raw{day}.parquet").path
        t = pq.read_table(raw)
        (landing / f"day={day}").mkdir(parents=True)
        pq.write_table(t.slice(0, 900), landing / f"day={day}" / "part-0.parquet")
        pq.write_table(t.slice(900), landing / f"day={day}" / "part-1.parquet")
    parts = find_partitions(landing, "day=*")
    assert [p.name for p in parts] == ["day=1", "day=2"] and parts[0].bytes > 0
    cfg = parse(DLRMRetrainConfig, {
        "features": schema, "preprocess": {"row_group_size": 500},
        "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
        "train": {"batch_size_per_rank": 256, "progress": "off", "seed": 1,
                  "checkpoint": {"dir": None}},
        "retrain": {"pattern": "day=*", "work_dir": str(tmp_path / "work"),
                    "model_dir": str(tmp_path / "models")}}, "")
    m1 = prepare_partitions(parts[:1], WarmStart("cold"), cfg)
    assert m1["lines_read"] == 1500 and m1["rows_written"] + m1["rows_rejected"] == 1500
    first = train_warm(m1, cfg)
    save_latest(tmp_path / "models", first.model.state_dict(),
                {"table_sizes": m1["table_sizes"], "schema": m1["schema"]})
    warm = first_warm_start([("latest", state_dict_file_source(tmp_path / "models"))])
    m2 = prepare_partitions(parts[1:], warm, cfg)
    assert m2["splits"]["test"]["rows"] == 150 and m2["newest"] == "day=2"
    v1 = load_vocabulary(m1["vocabulary_path"], ("item",))
    v2 = load_vocabulary(m2["vocabulary_path"], ("item",))
    assert np.array_equal(v2.ids[0][:len(v1.ids[0])], v1.ids[0]) and len(v2.ids[0]) > len(v1.ids[0])
    second = train_warm(m2, cfg, warm)
    items = m1["schema"]["tables"][1]["name"]
    assert items == "item" and second.table_sizes[1] > first.table_sizes[1] and second.result.steps


def test_a_retrain_with_a_time_split_holds_out_the_nights_latest_rows(tmp_path, seed):
    """``preprocess.splits`` by a time column: the night's held-out rows are the latest by
    time (as many as ``retrain.eval_fraction`` of the newest partition), wherever they stand
    in the files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recscale.retrain import DLRMRetrainConfig, find_partitions, prepare_partitions

    rng = np.random.default_rng(seed)
    landing = tmp_path / "daily"
    times = {}
    for day in (1, 2):
        n = 1000
        ts = (day * 86400 + rng.permutation(n) * 60).astype(np.int64)  # shuffled, no ties
        times[day] = ts
        (landing / f"day={day}").mkdir(parents=True)
        pq.write_table(pa.table({"click": rng.integers(0, 2, n), "user": rng.integers(0, 50, n),
                                 "ts": ts}), landing / f"day={day}" / "part-0.parquet")
    cfg = parse(DLRMRetrainConfig, {
        "features": {"label": "click", "sparse": [{"name": "user"}]},
        "preprocess": {"splits": {"by": "ts", "fractions": [0.8, 0.1, 0.1]}},
        "retrain": {"pattern": "day=*", "work_dir": str(tmp_path / "work"),
                    "model_dir": str(tmp_path / "models"), "eval_fraction": 0.2}}, "")
    m = prepare_partitions(find_partitions(landing, "day=*"), WarmStart("cold"), cfg)
    test = pq.read_table(m["splits"]["test"]["files"]).column("row").to_numpy()
    latest = np.argsort(np.concatenate([times[1], times[2]]))[-200:]
    assert sorted(test.tolist()) == sorted(latest.tolist())
    assert m["split_rule"]["by"] == "ts" and m["splits"]["validation"]["rows"] == 0


def test_a_warm_start_trains_without_the_table_reset(monkeypatch, tmp_path):
    """train.reinit_embeddings starts later epochs' tables from a fresh build's values: on a
    warm start that would discard the warm model's rows, so the retrain turns it off there (and
    keeps it for a cold start)."""
    from recscale.retrain import DLRMRetrainConfig
    from recscale.retrain import warm as warm_mod

    seen = []
    monkeypatch.setattr(warm_mod, "train_dlrm", lambda m, model, train, **kw: seen.append(train))
    cfg = parse(DLRMRetrainConfig, {"train": {"epochs": 2, "reinit_embeddings": True},
                                    "retrain": {"work_dir": str(tmp_path / "w"),
                                                "model_dir": str(tmp_path / "m")}}, "")
    manifest = {"table_sizes": [4, 4]}
    warm_mod.train_warm(manifest, cfg, WarmStart("cold"), plan=object())
    warm_mod.train_warm(manifest, cfg, WarmStart("latest", state={"w": torch.zeros(1)}),
                        plan=object())
    assert [t.reinit_embeddings for t in seen] == [True, False]
    assert all(t.epochs == 2 for t in seen)
