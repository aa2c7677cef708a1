"""`kedro run --pipelines=hf --env=test` end to end, in a copy of the project (own MLflow store)."""

import json
from pathlib import Path

import pytest
import torch

from tests.e2e.project import kedro, make_project_copy, run_in_process

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")  # made once, whatever runs between this file's tests
def finished_run(tmp_path_factory):
    proj = make_project_copy(tmp_path_factory.mktemp("e2e_hf"))
    res = kedro(proj, "run", "--pipelines=hf", "--env=test")
    assert res.returncode == 0, f"kedro run failed:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    return proj, res


def test_hf_pipeline_logs_histories_diagnostics_and_the_comparison_chart(finished_run):
    import mlflow

    proj, res = finished_run
    assert "Pipeline execution completed successfully" in res.stderr + res.stdout
    mlflow.set_tracking_uri(f"sqlite:///{proj}/mlruns/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["recscale"])
    assert len(runs) == 1
    run = runs.iloc[0]
    client = mlflow.MlflowClient()
    assert run["params.hf.train.global_batch_size"] == "1600"
    assert run["params.hf.optimizer.curvature"] == "gn"
    assert run["tags.kedro.env"] == "test"
    assert run["metrics.mnist.data.train_examples"] == 1600
    report = json.loads(Path(client.download_artifacts(
        run["run_id"], "hf/hf_mnist_report.json", str(proj / "dl"))).read_text())
    for o in ("hf", "sgd", "adam"):
        # the report's test error, and better than chance (9 in 10 wrong with 10 classes)
        assert run[f"metrics.mnist.test.{o}.error"] == report["optimizers"][o]["test"]["error"]
        assert run[f"metrics.mnist.test.{o}.error"] < 0.85, o
        for series in ("val_error", "train_loss", "val_error_by_centipass", "val_error_by_wall_ms"):
            h = client.get_metric_history(run["run_id"], f"mnist.{o}.{series}")
            assert len(h) >= 2, (o, series)
    cg = client.get_metric_history(run["run_id"], "mnist.hf.cg_iters")
    assert len(cg) == 4 and all(m.value >= 1 for m in cg)
    for name in ("mnist.hf.damping", "mnist.hf.negative_curvature_events", "mnist.hf.rho"):
        assert len(client.get_metric_history(run["run_id"], name)) == 4, name
    assert run["metrics.mnist.target_val_error"] == run["metrics.mnist.sgd.best_val_error"]
    assert {a.path for a in client.list_artifacts(run["run_id"], "hf")} == {
        "hf/hf_mnist_comparison.png", "hf/hf_mnist_report.json", "hf/hf_mnist_state_dict.pt"}
    # the logged HF weights give the logged test error on the run's test split
    from recscale.data.idx import read_idx
    from recscale.hf import load_model
    from recscale.pipelines.hf import nodes as N
    from tests.unit.test_hf_nodes import RAW, _params

    job = N.parse_mnist_job(_params("hf"))
    splits, _ = N.preprocess_mnist(read_idx(RAW / "mnist" / "t10k-images-idx3-ubyte.gz"),
                                   read_idx(RAW / "mnist" / "t10k-labels-idx1-ubyte.gz"), job)
    state = torch.load(client.download_artifacts(run["run_id"], "hf/hf_mnist_state_dict.pt",
                                                 str(proj / "dl")), weights_only=True)
    x, y = torch.as_tensor(splits["x_test"]), torch.as_tensor(splits["y_test"])
    with torch.no_grad():
        wrong = int((load_model(state, splits, job.model)(x).argmax(1) != y).sum())
    assert run["metrics.mnist.test.hf.error"] == pytest.approx(wrong / len(y), abs=1e-12)


def test_a_bad_hf_parameter_fails_before_training_with_the_key_named():
    """In process (Kedro's runner): the config node fails first, so no training node ran."""
    from recscale.config import ConfigError

    with pytest.raises(ConfigError, match=r"hf.optimizer.solver='minres' is not allowed: expected "
                                          r"one of 'cg', 'bicgstab'"):
        run_in_process("hf", params={"hf": {"optimizer": {"solver": "minres"}}},
                       inputs={"hf_mnist_images": None, "hf_mnist_labels": None})
