"""The MLflow Model Registry side of retraining (Kedro side: the library never imports MLflow).

Versions of ``retrain.registered_model`` are the model that scores raw rows
(``recscale.pipelines.scoring.pyfunc_model``: weights, resolved config with the fitted schema,
vocabulary); the alias (``champion``)
points at the version that serves. Each version carries tags: its AUC on the rows it was
evaluated on, the champion's AUC on the same rows, the decision and why.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import mlflow
import torch
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from recscale.retrain.warm import WarmStart, WarmStartSource

log = logging.getLogger(__name__)

def champion_version(name: str, alias: str):
    """The ModelVersion the alias points at, or None (no registered model, or no alias yet)."""
    try:
        return MlflowClient().get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def load_version(name: str, version) -> WarmStart:
    """Download a registered version's state_dict (weights_only) and resolved config."""
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/{name}/{version.version}", dst_path=tmp))
        state = torch.load(local / "artifacts" / "state_dict.pt", map_location="cpu",
                           weights_only=True)
        config = json.loads((local / "artifacts" / "resolved_config.json").read_text())
    return WarmStart("champion", state, config, f"models:/{name}/{version.version}")


def champion_source(name: str, alias: str) -> WarmStartSource:
    def load() -> WarmStart | None:
        v = champion_version(name, alias)
        if v is None:
            return None
        ws = load_version(name, v)
        ws.detail = f"models:/{name}@{alias} (version {v.version})"
        return ws
    return load


def register(state: dict, resolved_config: dict, name: str, tags: dict[str, str],
             vocabulary_path: str | None, serving: dict):
    """Log the model that scores raw rows into the active run and register it as a new version
    of ``name``."""
    from recscale.pipelines.scoring.model_log import log_scoring_model

    info = log_scoring_model(state, resolved_config, vocabulary_path, serving,
                             registered_model_name=name)
    client = MlflowClient()
    version = str(info.registered_model_version)
    for k, v in tags.items():
        client.set_model_version_tag(name, version, k, str(v))
    return client.get_model_version(name, version)


def set_tags(name: str, version: str, tags: dict[str, str]) -> None:
    client = MlflowClient()
    for k, v in tags.items():
        client.set_model_version_tag(name, version, k, str(v))


def move_alias(name: str, alias: str, version: str) -> None:
    MlflowClient().set_registered_model_alias(name, alias, version)


def version_history(name: str) -> list[dict]:
    """Every retrained version, oldest first, with its evaluation tags (for the AUC picture)."""
    client = MlflowClient()
    rows = []
    for v in client.search_model_versions(f"name = '{name}'"):
        t = v.tags
        if "retrain.auc" not in t:
            continue
        rows.append({"version": int(v.version), "label": f"v{v.version} {t.get('retrain.newest', '')}",
                     "challenger_auc": float(t["retrain.auc"]),
                     "champion_auc": float(t["retrain.champion_auc"]) if t.get("retrain.champion_auc") else None,
                     "promoted": t.get("retrain.promoted") == "true"})
    return sorted(rows, key=lambda r: r["version"])


def tag_run(tags: dict[str, str]) -> None:
    if mlflow.active_run() is not None:
        mlflow.set_tags({k: str(v) for k, v in tags.items()})


def active_run_id() -> str | None:
    run = mlflow.active_run()
    return run.info.run_id if run is not None else None


def log_pictures(history: dict, scored: dict, name: str) -> None:
    """Loss, throughput, ROC and calibration of challenger vs champion, AUC across retrains."""
    from recscale.evaluate import plots

    figures = {
        "loss.png": plots.loss_figure(history, "retrain: training loss (warm start)"),
        "throughput.png": plots.throughput_figure(history, "retrain: throughput over training"),
        "roc.png": plots.roc_figure(scored, "ROC on the held-out rows of the newest day"),
        "calibration.png": plots.calibration_figure(scored, title="calibration, same rows"),
    }
    hist = version_history(name)
    if hist:
        figures["auc_history.png"] = plots.auc_history_figure(hist)
    for fname, fig in figures.items():
        mlflow.log_figure(fig, f"plots/{fname}")


def log_plan(plan) -> None:
    """The night's sharding plan: its JSON, report and chart, as a ``dlrm`` run logs them."""
    from recscale.sharding import save_chart

    if mlflow.active_run() is None:
        return
    mlflow.log_dict(plan.to_dict(), "sharding/sharding_plan.json")
    mlflow.log_text(plan.report(), "sharding/sharding_report.txt")
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / "sharding_plan.png"
        save_chart(plan, chart)
        mlflow.log_artifact(str(chart), "sharding")


def log_report(report: dict) -> None:
    mlflow.log_dict(report, "retrain/report.json")
