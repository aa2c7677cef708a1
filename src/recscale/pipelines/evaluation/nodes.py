"""Thin evaluation node: the trained model as its resolved config describes it, scored on the
split (the one evaluation path), beside the baselines of ``evaluate.baselines`` (fitted on the
train split, scored on the same rows) and the oracle where the data is synthetic, with the ROC
(AUC) and calibration pictures of all of them, and every row's score (row, label, score)."""

from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

from recscale.evaluate import lift_metrics, metrics_with_oracle, plots
from recscale.model import model_from_resolved
from recscale.pipelines.common import as_metrics
from recscale.runconfig import DLRMConfig
from recscale.scoring import score_split
from recscale.scoring.baselines import baselines_on_split

log = logging.getLogger(__name__)


def evaluate_model(model_state: dict, resolved_config: dict, dataset_manifest: dict,
                   raw_manifest: dict, cfg: DLRMConfig):
    split = cfg.evaluate.split
    model = model_from_resolved(resolved_config, model_state)
    oracle = np.load(raw_manifest["oracle_path"], mmap_mode="r") if "oracle_path" in raw_manifest else None
    s = score_split(model, dataset_manifest, split, cfg.evaluate.batch_size)
    metrics = metrics_with_oracle(s.labels, s.probs, s.rows, oracle)
    scored = {"model": (s.labels, s.probs)}
    report: dict = {}
    if cfg.evaluate.baselines:
        start = time.perf_counter()
        b = baselines_on_split(dataset_manifest, split, cfg.evaluate.baselines,
                               cfg.evaluate.batch_size, rows=s.rows)
        lift = lift_metrics(s.labels, s.probs, b.scores.probs)
        metrics.update({k: v for k, v in lift.items() if k != "best"})
        report["baselines"] = {"best": lift["best"], "fitted": b.fitted.info,
                               "seconds": time.perf_counter() - start}
        scored.update({n: (s.labels, p) for n, p in b.scores.probs.items()})
    aucs = [f"model AUC {metrics['auc']:.4f}"] + [
        f"{n} {metrics[f'baseline.{n}.auc']:.4f}" for n in cfg.evaluate.baselines
        if f"baseline.{n}.auc" in metrics]
    if "oracle_auc" in metrics:
        aucs.append(f"oracle {metrics['oracle_auc']:.4f}")
    log.info("%s split, %d rows: %s", split, s.labels.size, ", ".join(aucs))
    losses = [f"model {metrics['log_loss']:.4f}"] + [
        f"{n} {metrics[f'baseline.{n}.logloss']:.4f}" for n in cfg.evaluate.baselines
        if f"baseline.{n}.logloss" in metrics]
    if "oracle_log_loss" in metrics:
        losses.append(f"oracle {metrics['oracle_log_loss']:.4f}")
    log.info("%s split log loss: %s", split, ", ".join(losses))
    if "lift.auc" in metrics:
        log.info("lift over the best baseline: AUC %+.4f (%s), log loss %+.4f (%s)",
                 metrics["lift.auc"], lift["best"]["auc"], metrics["lift.logloss"],
                 lift["best"]["logloss"])
    curves = dict(scored)
    if oracle is not None and s.labels.size:
        curves["oracle"] = (s.labels, np.asarray(oracle)[s.rows])
    figures = {"roc.png": plots.roc_figure(curves, f"ROC on the {split} split"),
               "calibration.png": plots.calibration_figure(scored, title=f"calibration, {split} split")}
    # every row's score, as the evaluation scored it: what a served model's or the score
    # pipeline's output is compared with, by ``row``
    scores = pd.DataFrame({"row": s.rows.astype(np.int64), "label": s.labels.astype(np.int8),
                           "score": s.probs.astype(np.float64)})
    return as_metrics(metrics), {"split": split, **metrics, **report}, figures, scores
