"""Thin evaluation node: the trained model as its resolved config describes it, scored on the
split (the one evaluation path), with its ROC (AUC) and calibration pictures."""

from __future__ import annotations

import logging

import numpy as np

from recscale.evaluate import metrics_with_oracle, plots
from recscale.model import model_from_resolved
from recscale.pipelines.common import as_metrics
from recscale.runconfig import DLRMConfig
from recscale.scoring import score_split

log = logging.getLogger(__name__)


def evaluate_model(model_state: dict, resolved_config: dict, dataset_manifest: dict,
                   raw_manifest: dict, cfg: DLRMConfig):
    split = cfg.evaluate.split
    model = model_from_resolved(resolved_config, model_state)
    oracle = np.load(raw_manifest["oracle_path"], mmap_mode="r") if "oracle_path" in raw_manifest else None
    s = score_split(model, dataset_manifest, split, cfg.evaluate.batch_size)
    metrics = metrics_with_oracle(s.labels, s.probs, s.rows, oracle)
    if "oracle_auc" in metrics:
        log.info("%s split: AUC %.4f, oracle AUC %.4f on the same rows (gap %.4f)", split,
                 metrics["auc"], metrics["oracle_auc"], metrics["oracle_auc"] - metrics["auc"])
    else:
        log.info("%s split: AUC %.4f", split, metrics["auc"])
    scored = {"model": (s.labels, s.probs)}
    figures = {"roc.png": plots.roc_figure(scored, f"ROC on the {split} split"),
               "calibration.png": plots.calibration_figure(scored, title=f"calibration, {split} split")}
    return as_metrics(metrics), {"split": split, **metrics}, figures
