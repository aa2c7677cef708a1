"""Thin nodes: the model that scores raw rows, logged with every ``dlrm`` run; batch scoring of
raw files (``kedro run --pipeline=score``) with the logged or registered model."""

from __future__ import annotations

import functools
import logging
import resource
import shutil
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException

from recscale.config import ConfigError, parse, to_dict
from recscale.pipelines.common import as_metrics
from recscale.pipelines.scoring.model_log import log_scoring_model
from recscale.progress import Progress
from recscale.scoring.config import ScoreConfig
from recscale.scoring.files import score_files

log = logging.getLogger(__name__)


def parse_score_config(params: dict) -> ScoreConfig:
    return parse(ScoreConfig, params, "score")


def log_model(model_state: dict, resolved_config: dict, dataset_manifest: dict,
              cfg: ScoreConfig) -> str:
    """The trained model with its fitted schema and vocabulary, logged into the run as the
    model that scores raw rows; -> its URI (``runs:/<run_id>/model``)."""
    run = mlflow.active_run()
    if run is None:  # a pipeline run without kedro-mlflow (tests in one process)
        log.info("no active MLflow run: the model that scores raw rows is not logged")
        return ""
    info = log_scoring_model(model_state, resolved_config, dataset_manifest.get("vocabulary_path"),
                             to_dict(cfg.serving))
    uri = f"runs:/{run.info.run_id}/model"
    log.info("logged the model that scores raw rows: %s (%s); serve it with "
             "`mlflow models serve -m %s --env-manager local`", uri, info.model_uri, uri)
    return uri


def _latest_logged_model() -> str | None:
    try:
        runs = mlflow.search_runs(filter_string="attributes.status = 'FINISHED'",
                                  order_by=["attributes.start_time DESC"], max_results=50)
    except MlflowException:
        return None
    for run_id in runs.get("run_id", []):
        if mlflow.search_logged_models(filter_string=f"source_run_id = '{run_id}'",
                                       max_results=1, output_format="list"):
            return f"runs:/{run_id}/model"
    return None


def load_scoring_model(uri: str):
    """The pyfunc at ``uri`` -> its raw-row scorer; a URI that resolves to nothing fails naming
    what does exist."""
    try:
        model = mlflow.pyfunc.load_model(uri)
    except (MlflowException, OSError) as exc:
        latest = _latest_logged_model()
        hint = f"the newest run's model is {latest}" if latest else \
            "no run has logged one yet (`kedro run --pipeline=dlrm` does)"
        raise ConfigError(f"score.model={uri!r} cannot be loaded ({str(exc).splitlines()[0]}): "
                          f"set score.model to a logged model ({hint}), or register one with "
                          "the nightly retrain (kedro run --pipeline=dlrm_retrain)") from None
    scorer = getattr(model.unwrap_python_model(), "scorer", None)
    if scorer is None:
        raise ConfigError(f"score.model={uri!r} is not a recscale model that scores raw rows "
                          "(logged before it carried its preprocessing?)")
    return scorer


def local_scorer(path: str):
    """The scorer of a model downloaded to ``path`` (what each Spark task loads)."""
    return mlflow.pyfunc.load_model(path).unwrap_python_model().scorer


def score_raw(cfg: ScoreConfig):
    """Every row of ``score.data`` scored into ``score.output``; -> metrics and a report."""
    scorer, spark = load_scoring_model(cfg.model), None
    if cfg.engine == "spark":  # each task loads the model from a copy on the driver's disk
        from pyspark.sql import SparkSession

        from recscale.data.spark_session import make_spark_session

        spark = SparkSession.getActiveSession() or make_spark_session()
        local = Path(cfg.output).resolve().with_name(Path(cfg.output).name + ".model")
        shutil.rmtree(local, ignore_errors=True)
        local.mkdir(parents=True)
        scorer = functools.partial(local_scorer, mlflow.artifacts.download_artifacts(
            artifact_uri=cfg.model, dst_path=str(local)))
    files = cfg.data.expand()
    try:
        with Progress(None, "scoring rows", unit="row", mode=cfg.progress) as bar:
            rep = score_files(scorer, files, cfg.output, cfg.data.source, cfg.data.delimiter,
                              cfg.chunk_bytes, progress=bar.update, spark=spark)
    finally:
        if spark is not None:
            shutil.rmtree(local, ignore_errors=True)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    metrics = {"rows_read": rep.rows_read, "rows_scored": rep.rows_scored,
               "rows_rejected": rep.rows_rejected, "rows_per_s": rep.rows_per_s,
               "seconds": rep.seconds, "peak_rss_mb": peak_mb, **rep.metrics}
    if rep.rows_rejected:
        log.warning("%d of %d rows were not scored (%s): their reasons are in %s, column error",
                    rep.rows_rejected, rep.rows_read, ", ".join(
                        f"{k}: {v}" for k, v in sorted(rep.by_reason.items())), rep.out_path)
    if "auc" in rep.metrics:
        log.info("scored rows with labels: AUC %.4f, log loss %.4f", rep.metrics["auc"],
                 rep.metrics["log_loss"])
    report = {"model": cfg.model, "files": files, "output": rep.out_path,
              "rejected_by_reason": rep.by_reason, **metrics}
    return as_metrics(metrics), report
