"""Thin evaluation node: rebuild the model from the resolved config, score a split, draw its
ROC (AUC) and calibration pictures."""

from __future__ import annotations

import numpy as np

from recscale.config import parse
from recscale.evaluate import plots
from recscale.evaluate.scoring import metrics_with_oracle, score_split
from recscale.model import ModelConfig
from recscale.pipelines.common import as_metrics
from recscale.train import TrainConfig, build_model_for


def evaluate_model(model_state: dict, resolved_config: dict, dataset_manifest: dict,
                   raw_manifest: dict, evaluate_params: dict):
    split = evaluate_params.get("split", "test")
    if split not in dataset_manifest["splits"]:
        raise ValueError(f"evaluate.split={split!r} is not allowed: expected one of "
                         f"{', '.join(dataset_manifest['splits'])}")
    model_cfg = parse(ModelConfig, resolved_config["model"], "model")
    train_cfg = parse(TrainConfig, resolved_config["train"], "train")
    model = build_model_for(dataset_manifest, model_cfg, train_cfg)
    model.load_state_dict(model_state)
    oracle = np.load(raw_manifest["oracle_path"], mmap_mode="r") if "oracle_path" in raw_manifest else None
    labels, probs, rows = score_split(model, dataset_manifest, split, train_cfg.eval_batch_size)
    metrics = metrics_with_oracle(labels, probs, rows, oracle)
    report = {"split": split, **metrics}
    scored = {"model": (labels, probs)}
    figures = {"roc.png": plots.roc_figure(scored, f"ROC on the {split} split"),
               "calibration.png": plots.calibration_figure(scored, title=f"calibration, {split} split")}
    return as_metrics(metrics), report, figures
