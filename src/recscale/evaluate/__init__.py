"""Evaluation: click metrics (AUC, log loss, NE, calibration, accuracy) and batch prediction."""

from recscale.evaluate.metrics import auc_score, binary_entropy, binary_metrics, log_loss

__all__ = ["auc_score", "binary_entropy", "binary_metrics", "log_loss"]
