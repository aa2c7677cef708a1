"""A schema of the user's own through `kedro run`: the clicklog env (its generator, its schema, the
fitted schema in MLflow) at toy size, and a SQLite database read through the Kedro catalog
(``data.source: dataset``, ``pandas.SQLTableDataset``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from recscale.data.preprocess import preprocess_table
from recscale.data.processed import PreprocessConfig, load_manifest
from recscale.data.schema import parse_features
from tests.e2e.project import kedro, make_project_copy

pytestmark = pytest.mark.e2e

TOY = ("data.generator.num_rows=60000,train.epochs=1,train.log_every=10,"
       "train.batch_size_per_rank=512")


def _runs(proj, pipeline="dlrm"):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{proj}/mlruns/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["recscale"])
    return runs[runs["tags.kedro.pipeline"] == pipeline], mlflow.MlflowClient()


@pytest.fixture(scope="session")  # made once, whatever runs between this file's tests
def clicklog(tmp_path_factory):
    proj = make_project_copy(tmp_path_factory.mktemp("clicklog"))
    kedro(proj, "run", "--pipelines=dlrm", "--env=clicklog", f"--params={TOY}")
    return proj


def test_the_clicklog_env_trains_on_its_schema_and_logs_the_fitted_schema(clicklog, tmp_path):
    proj = clicklog
    runs, client = _runs(proj)
    run = runs.iloc[0]
    assert run["metrics.data.rows_written"] == 60000 and run["metrics.data.rows_rejected"] == 0
    # learns: well above chance, at most the oracle's AUC (the full size: docs/results.md)
    assert 0.7 < run["metrics.test.auc"] <= run["metrics.test.oracle_auc"] + 0.01
    got = client.download_artifacts(run["run_id"], "data/fitted_schema.json", str(tmp_path))
    fitted = json.loads(Path(got).read_text())
    env = yaml.safe_load((proj / "conf/clicklog/parameters_dlrm.yml").read_text())
    assert [f["name"] for f in fitted["schema"]["sparse"]] == \
        [f["name"] for f in env["features"]["sparse"]]
    rows = {t["name"]: t["rows"] for t in fitted["tables"]}
    # one vocabulary for item_id and history (the same items): ids seen twice, and the OOV row
    assert 300 < rows.pop("items") <= 401
    assert rows == {"user_id": 60000, "device": 7, "genres": 4000, "interests": 4000,
                    "price_band": 6}
    assert set(fitted["stats"]) == {"price"} and fitted["stats"]["price"]["std"] > 0
    plan = client.download_artifacts(run["run_id"], "sharding/sharding_plan.json", str(tmp_path))
    tables = json.loads(Path(plan).read_text())["tables"]
    dims = {t["name"]: t["embedding_dim"] for t in tables}
    assert dims == {"t_user_id": 16, "t_items": 16, "t_device": 8, "t_genres": 8,
                    "t_interests": 8, "t_price_band": 4}
    assert {t["name"]: tuple(t["feature_names"]) for t in tables}["t_items"] == \
        ("item_id", "history")  # one table, both features


def test_the_clicklog_model_scores_raw_rows_as_the_evaluation_and_catches_skew(
        clicklog, tmp_path, monkeypatch):
    """The click log's logged model takes its raw rows (string user ids, integer item ids,
    lists of genres, interests with their weights, the history; raw prices): in process, from
    ``kedro run --pipeline=score`` and over HTTP its scores equal the evaluation path's on the
    test split, row by row. Its fitted statistic or a vocabulary entry changed in the saved
    model, the scores no longer match: the comparison catches training/serving skew."""
    import mlflow
    import torch

    from recscale.model import model_from_resolved
    from recscale.scoring import score_split
    from tests.e2e.serving import invoke, served

    proj = clicklog
    runs, client = _runs(proj)
    run_id = runs.iloc[0]["run_id"]
    uri = f"runs:/{run_id}/model"
    monkeypatch.chdir(proj)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp_path)))
    resolved = json.loads((local / "artifacts" / "resolved_config.json").read_text())
    state = torch.load(local / "artifacts" / "state_dict.pt", weights_only=True)
    man = load_manifest(proj / "data/05_model_input/clicklog")
    ref = score_split(model_from_resolved(resolved, state), man, "test", 4096)
    raw = proj / "data/01_raw/clicklog/table_00.parquet"
    frame = pq.read_table(raw).take(ref.rows).to_pandas().drop(columns=["click"])
    frame.index = ref.rows
    assert frame["user_id"].dtype != np.int64 and frame["genres"].map(len).max() > 1

    def diff(got) -> float:
        return float(np.abs(np.asarray(got, dtype=float) - ref.probs).max())

    out = mlflow.pyfunc.load_model(uri).predict(frame)
    assert np.array_equal(out["row"].to_numpy(), ref.rows) and diff(out["probability"]) <= 1e-6
    kedro(proj, "run", "--pipelines=score", "--env=clicklog", f"--params=score.model={uri}")
    scores = pq.read_table(proj / "data/07_model_output/clicklog_scores.parquet").to_pandas()
    assert scores["row"].tolist() == list(range(60000)) and scores["error"].isna().all()
    assert diff(scores["score"].to_numpy()[ref.rows]) <= 1e-6
    with served(proj, uri, tmp_path / "serve.log") as base:
        status, body = invoke(base, frame)
        assert status == 200, body
        assert diff([p["probability"] for p in body["predictions"]]) <= 1e-6
    # skew: the saved model with price's fitted mean moved, or two items' rows swapped
    stats = json.loads(json.dumps(resolved))
    stats["schema"]["stats"]["price"]["mean"] += 0.05
    (local / "artifacts" / "resolved_config.json").write_text(json.dumps(stats))
    assert diff(mlflow.pyfunc.load_model(str(local)).predict(frame)["probability"]) > 1e-4
    (local / "artifacts" / "resolved_config.json").write_text(json.dumps(resolved))
    assert diff(mlflow.pyfunc.load_model(str(local)).predict(frame)["probability"]) <= 1e-6
    vocab = pq.read_table(local / "artifacts" / "vocabulary.parquet").to_pandas()
    items = vocab.index[vocab["feature"] == "items"][:2]
    vocab.loc[items, "id"] = vocab.loc[items[::-1], "id"].to_numpy()
    vocab.to_parquet(local / "artifacts" / "vocabulary.parquet", index=False)
    assert diff(mlflow.pyfunc.load_model(str(local)).predict(frame)["probability"]) > 1e-4


SCHEMA = {"label": "clicked",
          "dense": [{"name": "price", "transforms": ["log1p", "standardize"]}],
          "sparse": [{"name": "user", "id_type": "string"}, {"name": "item"},
                     {"name": "tags", "kind": "multi_hot", "max_len": 3}],
          "tables": [{"name": "user", "rows": 64}, {"name": "item", "rows": 64},
                     {"name": "tags", "rows": 16, "dim": 8}]}


def test_a_sqlite_table_through_the_catalog_preprocesses_as_the_same_rows_in_a_file(
        tmp_path, seed):
    rng = np.random.default_rng(seed)
    n = 3000
    frame = pd.DataFrame({
        "clicked": rng.integers(0, 2, n),
        "price": np.where(rng.random(n) < 0.1, np.nan, rng.lognormal(2, 1, n)),
        "user": [f"u{i}" for i in rng.integers(0, 50, n)],
        "item": np.where(rng.random(n) < 0.05, np.nan, rng.integers(0, 1000, n)),  # nulls: float
        "tags": ["|".join(map(str, rng.integers(0, 30, rng.integers(0, 4)))) for _ in range(n)]})
    frame.loc[7, "tags"] = "1|2|3|4|5|6"  # longer than max_len 3 (truncate: reject)
    db = tmp_path / "clicks.db"
    with sqlite3.connect(db) as con:
        frame.to_sql("clicks", con, index=False)
    proj = make_project_copy(tmp_path)
    env = proj / "conf" / "sqlite"
    env.mkdir()
    (env / "catalog.yml").write_text(yaml.safe_dump({"raw_table": {
        "type": "pandas.SQLTableDataset", "table_name": "clicks", "credentials": "clicks_db"}}))
    (env / "credentials.yml").write_text(
        yaml.safe_dump({"clicks_db": {"con": f"sqlite:///{db}"}}))
    (env / "parameters_dlrm.yml").write_text(yaml.safe_dump({
        "data": {"source": "dataset", "raw_dir": "data/01_raw/sqlite"},
        "features": SCHEMA,
        "preprocess": {"output_dir": "data/05_model_input/sqlite", "row_group_size": 512},
        "model": {"embedding_dim": 8, "bottom_mlp": [8], "top_mlp": [8, 1],
                  "interaction": "cat"}}))
    kedro(proj, "run", "--pipelines=data_processing", "--env=sqlite")
    man = load_manifest(proj / "data/05_model_input/sqlite")
    assert man["lines_read"] == n and man["rows_written"] == n - 1 and man["rows_rejected"] == 1
    # the same rows from a parquet file of the frame, preprocessed by the library directly
    frame.to_parquet(tmp_path / "clicks.parquet", index=False)
    out = tmp_path / "direct"
    ref = load_manifest(preprocess_table([tmp_path / "clicks.parquet"], out, PreprocessConfig(
        output_dir=str(out), row_group_size=512), parse_features(SCHEMA)).manifest_path)
    for split in ("train", "validation", "test"):
        a, b = (pq.read_table(proj / m["splits"][split]["files"][0]) for m in (man, ref))
        assert a.equals(b), split
    assert man["schema"] == ref["schema"]
    with open(proj / man["rejects_path"]) as fh:
        assert fh.read().splitlines()[1].split("\t")[1:3] == [
            "8", "list too long: tags holds 6 ids, more than max_len=3 (truncate: reject)"]
