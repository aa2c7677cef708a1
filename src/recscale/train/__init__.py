"""Training: typed config, the one training loop and its runtimes, checkpoints, and the
train/evaluate entry points the Kedro nodes call."""

from recscale.train.api import (
    TrainOutcome,
    TrainResult,
    build_model_for,
    model_from_resolved,
    plan_for_run,
    resolved_config,
    train_dlrm,
)
from recscale.train.config import (
    DenseOptimizerConfig,
    DLRMConfig,
    EvaluateConfig,
    TrainConfig,
)
from recscale.train.evaluation import Scores, evaluate_dlrm, score_split
from recscale.train.step import NonFiniteLossError, TrainStep

__all__ = [
    "DLRMConfig",
    "DenseOptimizerConfig",
    "EvaluateConfig",
    "NonFiniteLossError",
    "Scores",
    "TrainConfig",
    "TrainOutcome",
    "TrainResult",
    "TrainStep",
    "build_model_for",
    "evaluate_dlrm",
    "model_from_resolved",
    "plan_for_run",
    "resolved_config",
    "score_split",
    "train_dlrm",
]
