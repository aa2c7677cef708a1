"""Retraining, library side: partition ledger, promotion rule, warm-start sources, config errors,
synthetic days; plus the curves behind the pictures and the run tags of the hook."""

import json
import math
import os

import numpy as np
import pytest
import torch

from recscale.config import ConfigError, parse
from recscale.evaluate.curves import calibration_bins, roc_curve
from recscale.evaluate.metrics import auc_score, oracle_auc
from recscale.retrain import (
    PartitionLedger,
    RetrainConfig,
    WarmStart,
    decide_promotion,
    find_partitions,
    first_warm_start,
    state_dict_file_source,
)
from recscale.retrain.warm import save_latest
from tests.conftest import small_synthetic_config


def _days(root, numbers):
    root.mkdir(parents=True, exist_ok=True)
    for n in numbers:
        (root / f"day_{n}.tsv").write_bytes(os.urandom(int(n) + 1))


def test_partitions_come_in_natural_day_order_and_skip_files_being_written(tmp_path, seed):
    rng = np.random.default_rng(seed)
    days = [int(d) for d in rng.choice(40, size=8, replace=False)]
    _days(tmp_path, days)
    (tmp_path / "day_99.tsv.tmp").write_text("half")
    (tmp_path / ".day_98.tsv").write_text("hidden")
    found = find_partitions(tmp_path, "day_*.tsv")
    assert [p.name for p in found] == [f"day_{d}.tsv" for d in sorted(days)]
    assert find_partitions(tmp_path / "missing", "day_*.tsv") == []


def test_ledger_consumes_each_partition_once_and_survives_reopening(tmp_path, caplog, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 8))
    _days(tmp_path / "in", range(n))
    ledger = PartitionLedger(tmp_path / "state" / "ledger.json")
    found = find_partitions(tmp_path / "in", "day_*.tsv")
    k = int(rng.integers(1, n))
    first = ledger.new_partitions(found, limit=k)
    assert [p.name for p in first] == [p.name for p in found[:k]]
    ledger.record(first, model_version=1)
    again = PartitionLedger(tmp_path / "state" / "ledger.json")  # what the next run reads
    assert [p.name for p in again.new_partitions(found)] == [p.name for p in found[k:]]
    with pytest.raises(ValueError, match="already in the ledger"):
        again.record(first[:1])
    assert json.loads(again.path.read_text())["consumed"][0]["model_version"] == 1
    assert not [f for f in again.path.parent.iterdir() if f.name.endswith(".tmp")]
    # a consumed file rewritten later is reported, not consumed again
    (tmp_path / "in" / first[0].name).write_bytes(b"x" * (first[0].bytes + 5))
    refound = find_partitions(tmp_path / "in", "day_*.tsv")
    assert first[0].name not in {p.name for p in again.new_partitions(refound)}
    assert "changed since it was consumed" in caplog.text
    again.record(again.new_partitions(refound))
    assert again.new_partitions(find_partitions(tmp_path / "in", "day_*.tsv")) == []


def test_a_foreign_file_is_not_taken_for_a_ledger(tmp_path):
    p = tmp_path / "ledger.json"
    p.write_text(json.dumps({"consumed": []}))
    with pytest.raises(ValueError, match="not a retrain ledger"):
        PartitionLedger(p).entries()


def test_promotion_rule_compares_on_the_same_rows_with_the_required_gain(seed):
    rng = np.random.default_rng(seed)
    for _ in range(200):
        new, old = rng.uniform(0.5, 1.0, 2)
        gain = float(rng.choice([0.0, rng.uniform(-0.05, 0.05)]))
        d = decide_promotion(new, old, gain, "rows X")
        assert d.promote == (new >= old + gain)
        assert "rows X" in d.reason
        assert ("champion kept" in d.reason) == (not d.promote)
    assert decide_promotion(0.6, None).promote
    assert decide_promotion(0.7, 0.7).promote  # "at least the champion's"
    assert not decide_promotion(math.nan, 0.6).promote


def test_retrain_config_errors_name_the_key_value_and_what_is_allowed():
    with pytest.raises(ConfigError, match=r"retrain.warm_start\[1\]='newest'.*'checkpoint', 'latest', 'champion'"):
        parse(RetrainConfig, {"warm_start": ["latest", "newest"]}, "retrain")
    with pytest.raises(ConfigError, match="retrain.alias='v3' is not allowed"):
        parse(RetrainConfig, {"alias": "v3"}, "retrain")
    with pytest.raises(ConfigError, match=r"retrain.eval_fraction=1.5 .*\(0, 1\)"):
        parse(RetrainConfig, {"eval_fraction": 1.5}, "retrain")
    with pytest.raises(ConfigError, match="unknown key retrain.landing"):
        parse(RetrainConfig, {"landing": "x"}, "retrain")


def test_warm_start_sources_are_tried_in_order_and_weights_round_trip(tmp_path, seed):
    state = {"w": torch.randn(int(np.random.default_rng(seed).integers(2, 9)), 3)}
    cfg = {"table_sizes": [5, 7], "model": {}, "train": {}}
    assert first_warm_start([("latest", state_dict_file_source(tmp_path))]).source == "cold"
    save_latest(tmp_path, state, cfg, version=4)
    calls = []

    def champion():
        calls.append("champion")
        return WarmStart("champion")

    ws = first_warm_start([("latest", state_dict_file_source(tmp_path)), ("champion", champion)])
    assert ws.source == "latest" and calls == []  # the first source with a model wins
    assert torch.equal(ws.state["w"], state["w"]) and ws.table_sizes == [5, 7]
    assert "version 4" in ws.detail
    assert first_warm_start([("champion", champion)]).source == "champion"


def test_synthetic_days_share_the_planted_model_with_fresh_rows(tmp_path, seed):
    from recscale.data.synthetic import generate_criteo_tsv

    cfg = small_synthetic_config(num_rows=int(np.random.default_rng(seed).integers(2000, 4000)))
    d0 = generate_criteo_tsv(cfg, tmp_path / "a" / "day_00.tsv")
    d0_again = generate_criteo_tsv(cfg, tmp_path / "b" / "day_00.tsv", day=0)
    d1 = generate_criteo_tsv(cfg, tmp_path / "a" / "day_01.tsv", day=1)
    d1_again = generate_criteo_tsv(cfg, tmp_path / "b" / "day_01.tsv", day=1)
    read = lambda r: open(r.path, "rb").read()  # noqa: E731
    assert read(d0) == read(d0_again) and d0.fingerprint == cfg.fingerprint()  # day 0 unchanged
    assert read(d1) == read(d1_again) and read(d1) != read(d0)
    assert d1.fingerprint != d0.fingerprint
    assert abs(oracle_auc(d1) - oracle_auc(d0)) < 0.05 and d1.cardinalities == d0.cardinalities
    with pytest.raises(ConfigError, match="day=-1 is not allowed"):
        generate_criteo_tsv(cfg, tmp_path / "x.tsv", day=-1)


def test_synthetic_day_node_writes_the_next_day(tmp_path, seed):
    from recscale.pipelines.retrain.nodes import parse_retrain_config, write_synthetic_day

    landing = tmp_path / "daily"
    start = int(np.random.default_rng(seed).integers(0, 12))
    if start:
        _days(landing, [f"{start:02d}"])
    data = {"synthetic": {"num_rows": 1500, "seed": 1, "cardinality_scale": 0.0005,
                          "keep_cardinality_below": 200}}
    cfg = parse_retrain_config(data, "criteo", {}, {}, {}, {}, {}, {}, {"landing_dir": str(landing)})
    rep = write_synthetic_day(cfg)
    assert rep["path"] == str(landing / f"day_{start + 1:02d}.tsv") and rep["num_rows"] == 1500


def test_roc_area_is_the_auc_and_calibration_bins_cover_every_row(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(500, 5000))
    p = rng.random(n).round(int(rng.integers(1, 4)))  # ties included
    y = (rng.random(n) < p).astype(np.int8)
    fpr, tpr = roc_curve(y, p, max_points=10**6)
    assert fpr[0] == tpr[0] == 0 and fpr[-1] == tpr[-1] == 1
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
    area = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
    assert area == pytest.approx(auc_score(y, p), abs=1e-9)
    bins = int(rng.integers(2, 20))
    pred, obs, count = calibration_bins(y, p, bins)
    assert count.sum() == n and len(pred) == bins
    assert np.average(pred, weights=count) == pytest.approx(p.mean())
    assert np.average(obs, weights=count) == pytest.approx(y.mean())
    with pytest.raises(ValueError, match="both classes"):
        roc_curve(np.ones(5), rng.random(5))


def test_pictures_are_figures_for_every_kind_of_input(seed):
    from recscale.evaluate import plots

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 300)
    scored = {"a": (y, rng.random(300)), "b": (y, rng.random(300))}
    hist = {"loss": [{"step": s, "value": float(v)} for s, v in enumerate(rng.random(5))]}
    figs = [plots.loss_figure(hist), plots.throughput_figure({}), plots.roc_figure(scored),
            plots.calibration_figure(scored),
            plots.auc_history_figure([{"label": "v1", "challenger_auc": 0.7, "champion_auc": None,
                                       "promoted": True},
                                      {"label": "v2", "challenger_auc": 0.72,
                                       "champion_auc": 0.71, "promoted": True}])]
    for f in figs:
        assert f.axes and f.canvas.get_width_height()[0] > 0


def test_run_tags_name_the_run_after_pipeline_env_and_given_params(seed):
    from recscale.hooks import run_tags

    lr = float(np.random.default_rng(seed).uniform(0.01, 0.5))
    t = run_tags({"pipeline_names": ["dlrm"], "env": "sweep_optimizer",
                  "runtime_params": {"train": {"embedding_optimizer": {"learning_rate": lr}}}})
    given = f"train.embedding_optimizer.learning_rate={lr}"
    assert t == {"kedro.env": "sweep_optimizer", "kedro.pipeline": "dlrm",
                 "kedro.runtime_params": given, "mlflow.runName": f"dlrm @ sweep_optimizer {given}"}
    assert run_tags({"pipeline_names": None, "env": None}) == {
        "kedro.env": "local", "kedro.pipeline": "__default__", "mlflow.runName": "__default__ @ local"}


def test_growing_tables_keeps_old_rows_and_their_optimizer_state_and_inits_new_rows_fresh():
    """A warm start into larger tables (a grown vocabulary): every old row's weights and
    row-wise Adagrad state bitwise, every new row exactly a fresh model's of the new sizes,
    zero optimizer state there; shrinking fails naming the table and both sizes."""
    from recscale.model import ModelConfig, load_state_into
    from recscale.runconfig import TrainConfig, recipe_for

    model_cfg = ModelConfig(embedding_dim=4, bottom_mlp=(8, 4), top_mlp=(4, 1))
    train_cfg = parse(TrainConfig, {"seed": 5}, "train")
    names = [f"C{i + 1}" for i in range(26)]
    old_sizes = [3 + i for i in range(26)]
    new_sizes = [s + (i % 3) * 4 for i, s in enumerate(old_sizes)]  # some grow, some do not
    old = recipe_for({"table_sizes": old_sizes}, model_cfg, train_cfg).build()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained look: weights and optimizer state unlike any init
        for w, states in zip(old.embeddings.split_weights(),
                             old.embeddings.split_optimizer_states()):
            w.copy_(torch.randn(w.shape, generator=g))
            for s in states:
                s.copy_(torch.rand(s.shape, generator=g) + 0.5)
    manifest = {"table_sizes": new_sizes, "sparse_features": names}
    recipe = recipe_for(manifest, model_cfg, train_cfg)
    grown = recipe.build()
    load_state_into(grown, old.state_dict(), recipe, old_sizes, names)
    fresh = recipe.build()
    tables = zip(old.embeddings.split_weights(), old.embeddings.split_optimizer_states(),
                 grown.embeddings.split_weights(), grown.embeddings.split_optimizer_states(),
                 fresh.embeddings.split_weights(), fresh.embeddings.split_optimizer_states())
    for ow, os_, gw, gs, fw, fs in tables:
        n = ow.shape[0]
        assert torch.equal(gw[:n], ow) and torch.equal(gw[n:], fw[n:])
        assert torch.equal(gs[0][:n], os_[0]) and torch.equal(gs[0][n:], fs[0][n:])
        assert not gs[0][n:].any()
    assert any(gw.shape[0] > ow.shape[0] for ow, gw in zip(old.embeddings.split_weights(),
                                                           grown.embeddings.split_weights()))
    a, b = grown.dense.state_dict(), old.dense.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    bigger = [s + 1 for s in new_sizes]
    with pytest.raises(ValueError, match="table C1 would shrink from 4 to 3 rows"):
        load_state_into(grown, recipe.with_tables(bigger).build().state_dict(), recipe,
                        bigger, names)


def test_the_retrain_takes_a_schema_of_its_own_and_directories_as_partitions(tmp_path):
    from recscale.config import parse
    from recscale.retrain import find_partitions
    from recscale.retrain.config import DLRMRetrainConfig

    cfg = parse(DLRMRetrainConfig, {"features": {"sparse": [{"name": "item"}]},
                                    "retrain": {"pattern": "day=*"}}, "")
    assert [f.name for f in cfg.schema.sparse] == ["item"]
    for day in ("day=2", "day=10", "day=3.tmp"):
        (tmp_path / day).mkdir()
        (tmp_path / day / "part-0.parquet").write_bytes(b"x" * 7)
    (tmp_path / "day=4").mkdir()  # empty: still being written
    (tmp_path / "day=2" / "_SUCCESS").write_bytes(b"")
    parts = find_partitions(tmp_path, "day=*")
    assert [(p.name, p.bytes) for p in parts] == [("day=2", 7), ("day=10", 7)]


def test_a_warm_start_of_another_schema_is_refused_naming_the_feature():
    """The retrain keeps its model's schema: the data's fitted schema against the one the
    warm-start model was trained on (its resolved config), before any training."""
    from recscale.data.schema import FittedSchema, criteo_schema
    from recscale.retrain import DLRMRetrainConfig
    from recscale.retrain.warm import train_warm

    old = criteo_schema()
    new = criteo_schema(ids="vocab")  # C1..C26 through a vocabulary: its rows mean other ids
    sizes = [8] * len(old.sparse)
    warm = WarmStart("champion", {}, {"table_sizes": sizes,
                                      "schema": FittedSchema.fit(old, sizes).to_dict()})
    manifest = {"table_sizes": sizes, "schema": FittedSchema.fit(new, sizes).to_dict(),
                "ids": "vocab", "sparse_features": [f.name for f in new.sparse]}
    with pytest.raises(ConfigError, match=r"the warm start from champion was trained on another "
                                          r"feature schema: sparse feature C1 changed: ids "
                                          r"'hash' -> 'vocab'"):
        train_warm(manifest, parse(DLRMRetrainConfig, {}, ""), warm)


def test_a_warm_start_pins_hashed_tables_without_rows_to_the_warm_models_rows():
    """Preprocessing sizes a hashed table without ``rows`` from the data's distinct ids; a
    retrain must hash into the rows the warm model trained, so those tables take its sizes;
    tables with rows of their own and vocabulary tables keep theirs."""
    from recscale.data.schema import parse_features
    from recscale.retrain.data import hashed_tables_at

    schema = parse_features({
        "label": "click",
        "sparse": [{"name": "user", "ids": "vocab"}, {"name": "item", "ids": "hash"},
                   {"name": "hist", "kind": "multi_hot", "table": "items2", "ids": "hash"},
                   {"name": "city", "ids": "hash"}],
        "tables": [{"name": "items2", "dim": 8}, {"name": "city", "rows": 50}]})
    pinned = hashed_tables_at(schema, [1000, 777, 333, 50])
    rows = {t.name: (t.rows, t.dim) for t in pinned.tables}
    assert rows == {"items2": (333, 8), "city": (50, None), "item": (777, None)}
    assert "user" not in rows  # the vocabulary grows append-only instead
