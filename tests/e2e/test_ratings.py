"""The ratings example (conf/ratings) end to end from a project copy, at toy size: a log the
generator draws with users, items, a timestamp and a rating, in no particular order, with no
click column and no history. The label rule makes the clicks, the split is by time without
sorting the file, preprocessing builds each row's history, the model trains and beats the
baselines, and its logged model scores raw rows (batch scoring builds the history from the file
as preprocessing did; a request brings its own) exactly as the evaluation scored them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from recscale.data.processed import load_manifest
from tests.e2e.project import kedro, make_project_copy
from tests.history_reference import histories

pytestmark = pytest.mark.e2e

ROWS = 40000
TOY = f"data.generator.num_rows={ROWS},train.log_every=10"


@pytest.fixture(scope="session")  # made once, whatever runs between this file's tests
def ratings(tmp_path_factory):
    proj = make_project_copy(tmp_path_factory.mktemp("ratings"))
    kedro(proj, "run", "--pipelines=dlrm", "--env=ratings", f"--params={TOY}")
    return proj


def _run(proj, pipeline):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{proj}/mlruns/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["recscale"])
    return runs[runs["tags.kedro.pipeline"] == pipeline].iloc[0]


def test_the_ratings_log_is_split_by_time_and_trains_past_the_baselines(ratings, monkeypatch):
    proj = ratings
    monkeypatch.chdir(proj)  # the manifest's paths are the project's
    raw = pq.read_table(proj / "data/01_raw/ratings/table_00.parquet").to_pandas()
    assert "click" not in raw.columns and "recent" not in raw.columns
    assert set(raw["rating"]) == {1, 2, 3, 4, 5}
    assert (np.diff(raw["ts"].to_numpy()) < 0).mean() > 0.4  # as it comes: not in time order
    man = load_manifest(proj / "data/05_model_input/ratings")
    assert man["rows_written"] == ROWS and man["rows_rejected"] == 0
    rule = man["split_rule"]
    assert rule["by"] == "ts" and rule["fractions"] == [0.8, 0.1, 0.1]
    ts = raw["ts"].to_numpy()
    for split, want in (("train", ts < rule["validation_from"]),
                        ("validation", (ts >= rule["validation_from"]) & (ts < rule["test_from"])),
                        ("test", ts >= rule["test_from"])):
        rows = pq.read_table(man["splits"][split]["files"], columns=["row"]).column("row")
        assert sorted(rows.to_pylist()) == np.flatnonzero(want).tolist(), split
    run = _run(proj, "dlrm")
    assert run["metrics.test.auc"] <= run["metrics.test.oracle_auc"]
    assert run["metrics.test.lift.auc"] > 0 and run["metrics.test.lift.logloss"] > 0


def test_the_ratings_model_scores_raw_rows_as_the_evaluation(ratings, monkeypatch):
    import mlflow

    proj = ratings
    uri = f"runs:/{_run(proj, 'dlrm')['run_id']}/model"
    kept = pd.read_parquet(proj / "data/08_reporting/evaluation_scores.parquet")
    # batch: the raw log, its histories built from the file as preprocessing built them
    kedro(proj, "run", "--pipelines=score", "--env=ratings", f"--params=score.model={uri}")
    scores = pd.read_parquet(proj / "data/07_model_output/ratings_scores.parquet")
    assert scores["row"].tolist() == list(range(ROWS)) and scores["error"].isna().all()
    both = kept.merge(scores, on="row", suffixes=("_evaluated", "_scored"))
    assert len(both) == len(kept) > 0
    assert (both["score_evaluated"] - both["score_scored"]).abs().max() <= 1e-6
    # a request: raw rows bringing their own history (the user's last items before each row)
    raw = pq.read_table(proj / "data/01_raw/ratings/table_00.parquet").to_pandas()
    rows = kept["row"].to_numpy()[:300]
    frame = raw.iloc[rows].drop(columns=["rating"]).copy()
    frame["recent"] = histories(raw, "user_id", "item_id", "ts", 10, rows)
    assert frame["recent"].map(len).max() == 10
    monkeypatch.chdir(proj)
    out = mlflow.pyfunc.load_model(uri).predict(frame)
    assert out["error"].isna().all()
    want = kept.set_index("row").loc[rows, "score"].to_numpy()
    assert np.abs(out["probability"].to_numpy() - want).max() <= 1e-6
