"""Evaluation: click metrics (AUC, log loss, NE, calibration, accuracy), ROC and calibration
curves and their pictures, and the cheap baselines a model has to beat (``baselines.py``:
a logistic regression and the best single feature's click rate, fitted on batches a caller
streams in). Pure numpy/matplotlib: scoring a model on data is ``recscale.scoring.score_split``
(the one evaluation path), and ``recscale.scoring.baselines`` reads a dataset's splits for the
baselines."""

from recscale.evaluate.baselines import (
    BASELINES,
    BaselineConfig,
    FeatureLayout,
    fit_baselines,
    lift_metrics,
    score_baselines,
)
from recscale.evaluate.metrics import (
    auc_score,
    binary_entropy,
    binary_metrics,
    log_loss,
    metrics_with_oracle,
    oracle_auc,
)

__all__ = ["BASELINES", "BaselineConfig", "FeatureLayout", "auc_score", "binary_entropy",
           "binary_metrics", "fit_baselines", "lift_metrics", "log_loss", "metrics_with_oracle",
           "oracle_auc", "score_baselines"]
