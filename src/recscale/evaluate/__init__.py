"""Evaluation: click metrics (AUC, log loss, NE, calibration, accuracy), ROC and calibration
curves and their pictures. Pure numpy/matplotlib: scoring a model on data is
``recscale.train.evaluate_dlrm`` (the one evaluation path), which calls these."""

from recscale.evaluate.metrics import (
    auc_score,
    binary_entropy,
    binary_metrics,
    log_loss,
    metrics_with_oracle,
)

__all__ = ["auc_score", "binary_entropy", "binary_metrics", "log_loss", "metrics_with_oracle"]
