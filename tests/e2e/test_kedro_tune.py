"""`kedro run --pipelines=tune` as a user runs it: trials as nested MLflow runs under the
pipeline's run (params, validation curves, state), the study's table and plots on the parent,
and the best trial written as a config env that `kedro run --env=<it>` trains to the same test
AUC; a bad tune block stops the run before any trial."""

import pytest
import yaml

from tests.e2e.project import kedro, make_project_copy

pytestmark = pytest.mark.e2e

STUDY = ("tune.study=e2e,tune.trials=3,tune.startup_trials=1,tune.min_points=1,"
         "tune.best_env=tuned_e2e")


def _runs(proj):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{proj}/mlruns/mlflow.db")
    return mlflow.search_runs(experiment_names=["recscale"], order_by=["start_time ASC"])


def test_a_study_logs_its_trials_and_its_best_env_reproduces_the_trial(tmp_path):
    proj = make_project_copy(tmp_path)
    kedro(proj, "run", "--pipelines=tune", "--env=test", f"--params={STUDY}", timeout=600)
    runs = _runs(proj)
    parent = runs[runs["tags.mlflow.runName"].str.startswith("tune @ test")]
    assert len(parent) == 1
    parent = parent.iloc[0]
    trials = runs[runs["tags.mlflow.parentRunId"] == parent["run_id"]]
    assert sorted(trials["tags.recscale.tune.trial"].astype(int)) == [0, 1, 2]
    assert set(trials["tags.recscale.tune.state"]) <= {"COMPLETE", "PRUNED"}
    assert trials["params.train.embedding_optimizer.learning_rate"].notna().all()
    assert parent["metrics.tune.trials"] == 3
    import mlflow

    client = mlflow.MlflowClient()
    first = trials.iloc[0]["run_id"]
    assert len(client.get_metric_history(first, "validation.auc")) >= 1  # the curve, per point
    logged = {a.path for a in client.list_artifacts(parent["run_id"], "tune")}
    assert {"tune/tune_trials.csv", "tune/tune_best.yml"} <= logged
    plots = {a.path for a in client.list_artifacts(parent["run_id"], "plots/tune")}
    assert "plots/tune/optimization_history.png" in plots
    best = yaml.safe_load((proj / "data/08_reporting/tune_best.yml").read_text())
    done = trials[trials["tags.recscale.tune.trial"].astype(int) == best["trial"]].iloc[0]
    assert done["metrics.test.auc"] == pytest.approx(best["test"]["auc"], abs=1e-12)
    assert parent["metrics.tune.best.test_auc"] == pytest.approx(best["test"]["auc"], abs=1e-12)
    env = proj / "conf/tuned_e2e/parameters_dlrm.yml"
    text = env.read_text()
    assert text.startswith("# The best trial of tune.study 'e2e'")
    lr = yaml.safe_load(text)["train"]["embedding_optimizer"]["learning_rate"]
    assert lr == best["params"]["train.embedding_optimizer.learning_rate"]
    assert (proj / "conf/tuned_e2e/parameters_score.yml").exists()  # the env's other files
    # the written env trains the trial's model: the same test AUC
    kedro(proj, "run", "--pipelines=dlrm", "--env=tuned_e2e", timeout=600)
    run = _runs(proj).iloc[-1]
    assert run["tags.mlflow.runName"].startswith("dlrm @ tuned_e2e")
    assert run["metrics.test.auc"] == pytest.approx(best["test"]["auc"], abs=1e-3)


def test_a_bad_tune_block_stops_the_run_before_any_work(tmp_path):
    proj = make_project_copy(tmp_path)
    res = kedro(proj, "run", "--pipelines=tune", "--env=test",
                "--params=tune.trails=3", check=False)
    assert res.returncode != 0
    assert "tune.trails" in res.stderr and "(did you mean 'trials'?)" in res.stderr, \
        res.stderr[-3000:]
    assert "Running node" not in res.stderr  # before any work: no data made
    # a misspelt key of the space, in an env's tune block
    (proj / "conf" / "badspace").mkdir()
    (proj / "conf" / "badspace" / "parameters_tune.yml").write_text(
        "tune:\n  space:\n    train.embeding_optimizer.learning_rate: {log_uniform: [0.01, 0.3]}\n")
    res = kedro(proj, "run", "--pipelines=tune", "--env=badspace", check=False)
    assert res.returncode != 0
    assert ("tune.space['train.embeding_optimizer.learning_rate'] at 0.01:" in res.stderr
            and "(did you mean 'embedding_optimizer'?)" in res.stderr), res.stderr[-3000:]
    assert "Running node" not in res.stderr
