"""`kedro run --pipelines=dlrm --env=test` end to end, in a copy of the project (own data, own MLflow)."""

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from tests.e2e.project import kedro, make_project_copy, run_in_process

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")  # made once, whatever runs between this file's tests
def finished_run(tmp_path_factory):
    proj = make_project_copy(tmp_path_factory.mktemp("e2e"))
    res = kedro(proj, "run", "--pipelines=dlrm", "--env=test")
    return proj, res


def _runs(proj, pipeline="dlrm"):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{proj}/mlruns/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["recscale"])
    return runs[runs["tags.kedro.pipeline"] == pipeline], mlflow.MlflowClient()


def test_dlrm_pipeline_records_params_metrics_history_and_model(finished_run):
    proj, res = finished_run
    assert "Pipeline execution completed successfully" in res.stderr + res.stdout
    # library warnings a user cannot act on stay out of the log (recscale.warning_filters)
    for chatter in ("Add type hints to the `predict` method", "register_new_resolver"):
        assert chatter not in res.stderr + res.stdout
    runs, client = _runs(proj)
    assert len(runs) == 1
    run = runs.iloc[0]
    run_id = run["run_id"]
    assert run["params.train.batch_size_per_rank"] == "512"
    assert run["params.train.embedding_optimizer.name"] == "exact_rowwise_adagrad"
    assert run["params.data.synthetic.num_rows"] == "20000"
    assert run["tags.kedro.env"] == "test"
    for m in ("test.auc", "test.log_loss", "test.normalized_entropy", "test.calibration",
              "test.oracle_auc", "data.rows_rejected", "train.throughput_samples_per_s"):
        assert f"metrics.{m}" in run, m
    assert run["metrics.data.rows_rejected"] == 0
    assert run["metrics.data.rows_written"] == 20000
    assert 0.6 < run["metrics.test.auc"] <= run["metrics.test.oracle_auc"] + 0.05
    history = client.get_metric_history(run_id, "train.loss")
    assert len(history) >= 5 and sorted(h.step for h in history) == [h.step for h in history]
    # the validation curves beside the training loss, the best step, the baselines and the lift
    val = client.get_metric_history(run_id, "validation.auc")
    assert [h.step for h in val] == [8, 16, 24, 32]  # per_epoch 4 of 32 steps
    assert run["metrics.train.best_step"] == max(val, key=lambda h: h.value).step
    assert len(client.get_metric_history(run_id, "validation.log_loss")) == len(val)
    for m in ("test.baseline.logreg.auc", "test.baseline.rate.auc", "test.lift.auc",
              "test.lift.logloss", "test.oracle_log_loss", "train.stopped_early_at"):
        assert f"metrics.{m}" in run, m
    assert len(client.get_metric_history(run_id, "train.samples_per_s")) == len(history)
    local = client.download_artifacts(run_id, "model/dlrm_state_dict.pt", str(proj / "dl"))
    state = torch.load(local, weights_only=True)
    assert "embeddings.tbe.weights_host" in state and "dense_arch.top.0.weight" in state
    assert {a.path for a in client.list_artifacts(run_id, "sharding")} == {
        "sharding/sharding_plan.json", "sharding/sharding_report.txt", "sharding/sharding_plan.png",
        "sharding/step_time_report.txt", "sharding/calibrated_topology.yml"}
    topo = client.download_artifacts(run_id, "sharding/calibrated_topology.yml", str(proj / "dl"))
    assert yaml.safe_load(Path(topo).read_text()) == {"calibrated": False, "planned_on": "cpu-local"}
    vocab = client.download_artifacts(run_id, "data/vocabulary.parquet", str(proj / "dl"))
    assert pq.read_table(vocab).num_rows == 0  # ids: hash, so no vocabulary rows
    report = client.download_artifacts(run_id, "sharding/step_time_report.txt", str(proj / "dl"))
    assert "step time per rank, predicted vs measured" in Path(report).read_text()
    plan_path = client.download_artifacts(run_id, "sharding/sharding_plan.json", str(proj / "dl"))
    from recscale.sharding import ShardingPlan

    plan = ShardingPlan.load(plan_path)
    assert len(plan.tables) == 26 and plan.world_size == 1
    # the run's sharding metrics are the logged plan's (its one rank's cost is its tables')
    assert plan.max_cost == pytest.approx(sum(s.cost for t in plan.tables for s in t.shards))
    assert run["metrics.sharding.max_cost_ms"] == pytest.approx(1e3 * plan.max_cost, rel=1e-9)
    assert run["metrics.sharding.max_over_mean"] == pytest.approx(plan.max_over_mean, rel=1e-12)
    cfg = client.download_artifacts(run_id, "config/resolved_config.json", str(proj / "dl"))
    assert '"embedding_optimizer"' in Path(cfg).read_text()


def test_a_bad_parameter_fails_before_training_with_the_key_named():
    """In process (Kedro's runner): the config node is the first node, so nothing ran."""
    from recscale.config import ConfigError

    with pytest.raises(ConfigError, match="train.batch_size_per_rank=0 is not allowed: expected a "
                                          "positive integer"):
        run_in_process("training", params={"train": {"batch_size_per_rank": 0}},
                       inputs={"dataset_manifest": {}, "sharding_plan": {}})


def test_two_ranks_from_kedro_record_the_sharded_run(tmp_path):
    proj = make_project_copy(tmp_path)
    kedro(proj, "run", "--pipelines=dlrm", "--env=test",
          "--params=train.launch.world_size=2,comms.forward=fp16,comms.backward=bf16,"
          "comms.dense_allreduce=bf16")
    runs, client = _runs(proj)
    run = runs.iloc[0]
    assert run["params.train.launch.world_size"] == "2"
    assert (run["params.comms.forward"], run["params.comms.backward"]) == ("fp16", "bf16")
    assert run["params.comms.dense_allreduce"] == "bf16"
    for name in ("output", "output_grad", "dense_allreduce", "input"):
        assert run[f"metrics.train.rank0.bytes_per_step.{name}"] > 0
    assert run["metrics.train.world_size"] == 2
    assert run["metrics.sharding.world_size"] == 2
    assert run["metrics.train.samples"] == run["metrics.data.rows_train"]  # no row dropped
    for rank in (0, 1):
        assert run[f"metrics.train.rank{rank}.comm_ms"] > 0
        assert run[f"metrics.train.rank{rank}.compute_ms"] > 0
        assert run[f"metrics.train.rank{rank}.bytes_sent_per_step"] > 0
    assert run["metrics.test.auc"] > 0.6
    assert len(client.get_metric_history(run["run_id"], "train.loss")) >= 2


def test_the_runs_model_scores_raw_rows_as_the_evaluation_in_process_in_batch_and_over_http(
        finished_run, tmp_path, monkeypatch):
    """The model the run logged takes raw Criteo rows (counts as numbers, ids as hex strings):
    its scores in process (pyfunc ``predict``), from ``kedro run --pipeline=score`` and from the
    real ``mlflow models serve`` equal the evaluation path's on the test split, row by row."""
    import json

    import mlflow
    import numpy as np

    from recscale.data.processed import load_manifest
    from recscale.model import model_from_resolved
    from recscale.scoring import score_split
    from tests.conftest import criteo_frame
    from tests.doc_snippets import run_snippet
    from tests.e2e.serving import invoke, served

    proj, _ = finished_run
    runs, client = _runs(proj)
    run_id = runs.iloc[0]["run_id"]
    uri = f"runs:/{run_id}/model"
    monkeypatch.chdir(proj)  # the manifest names its files from the project
    state = torch.load(client.download_artifacts(run_id, "model/dlrm_state_dict.pt", str(tmp_path)),
                       weights_only=True)
    resolved = json.loads(Path(client.download_artifacts(
        run_id, "config/resolved_config.json", str(tmp_path))).read_text())
    man = load_manifest(proj / "data/05_model_input/criteo_parquet_test")
    ref = score_split(model_from_resolved(resolved, state), man, "test", 4096)
    raw = proj / "data/01_raw/synthetic_test/day_00.tsv"
    frame = criteo_frame([raw], ref.rows).drop(columns=["label"])
    # in process
    served_model = mlflow.pyfunc.load_model(uri)
    out = served_model.predict(frame)
    assert np.array_equal(out["row"].to_numpy(), ref.rows) and out["error"].isna().all()
    assert np.abs(out["probability"].to_numpy(float) - ref.probs).max() <= 1e-6
    # a request without a column: every row says so in one line, from the model itself; a
    # request without rows: no rows back
    lacking = served_model.predict(frame.iloc[:4].drop(columns=["C3"]))
    assert lacking["probability"].isna().all() and lacking["error"].nunique() == 1
    assert lacking["error"].iloc[0].startswith("the rows lack column(s) C3; the model reads I1, ")
    assert len(served_model.predict(frame.iloc[0:0])) == 0
    # batch: every line of the raw day, the test split's rows among them (written where
    # docs/serving.md's snippet reads them: score.output's default)
    kedro(proj, "run", "--pipelines=score", "--env=test",
          f"--params=score.model={uri},score.output=data/07_model_output/scores.parquet")
    scores = pq.read_table(proj / "data/07_model_output/scores.parquet").to_pandas()
    assert scores["row"].tolist() == list(range(20000)) and scores["error"].isna().all()
    assert np.abs(scores["score"].to_numpy()[ref.rows] - ref.probs).max() <= 1e-6
    assert np.array_equal(scores["label"].to_numpy()[ref.rows], ref.labels.astype(np.int8))
    # the run kept the evaluation's score of every test row: the batch scores match it by row
    kept = pq.read_table(client.download_artifacts(
        run_id, "reports/evaluation_scores.parquet", str(tmp_path))).to_pandas()
    assert np.array_equal(kept["row"].to_numpy(), ref.rows)
    assert np.array_equal(kept["label"].to_numpy(), ref.labels.astype(np.int8))
    assert np.array_equal(kept["score"].to_numpy(), ref.probs.astype(np.float64))
    joined = kept.merge(scores, on="row", suffixes=("_evaluated", "_scored"))
    assert len(joined) == len(kept)
    assert (joined["score_evaluated"] - joined["score_scored"]).abs().max() <= 1e-6
    # docs/serving.md's snippets as written, from the project's root (its own store, not ours)
    printed = run_snippet("serving.predict", cwd=proj).stdout.splitlines()
    assert printed[0].split() == ["row", "probability", "error"] and len(printed) == 6, printed
    assert all(line.split()[-1] == "None" for line in printed[1:]), printed
    printed = run_snippet("serving.compare", cwd=proj).stdout.split()
    assert float(printed[-1]) <= 1e-6, printed
    score_run = _runs(proj, "score")[0].iloc[0]
    assert score_run["metrics.score.rows_scored"] == 20000
    assert score_run["metrics.score.rows_rejected"] == 0 and score_run["params.score.model"] == uri
    # served over HTTP: the same scores; a bad row comes back with its reason; the limit holds
    with served(proj, uri, tmp_path / "serve.log") as base:
        status, body = invoke(base, frame)
        assert status == 200, body
        got = body["predictions"]
        assert [p["row"] for p in got] == list(range(len(frame)))
        assert np.abs(np.array([p["probability"] for p in got]) - ref.probs).max() <= 1e-6
        bad = frame.iloc[:3].astype({"C3": object})
        bad.iloc[1, bad.columns.get_loc("C3")] = "not-hex"
        status, body = invoke(base, bad)
        assert status == 200
        assert [p["error"] for p in body["predictions"]] == [
            None, "C3: not an 8-digit hex id: 'not-hex'", None]  # preprocessing's reason
        assert body["predictions"][1]["probability"] is None
        status, body = invoke(base, frame.iloc[0:0])
        assert status == 200 and body["predictions"] == [], body
        status, body = invoke(base, frame.iloc[:2].drop(columns=["C3"]))
        assert status == 200 and [p["error"][:31] for p in body["predictions"]] == [
            "the rows lack column(s) C3; the"] * 2, body
        many = criteo_frame([raw], range(2501)).drop(columns=["label"])
        status, body = invoke(base, many)
        assert status == 400 and "score.serving.max_request_rows=2500" in body["message"], body
