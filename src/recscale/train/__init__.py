"""Training: typed config, the train loop, launch, and the train/evaluate entry points."""

from recscale.train.api import TrainOutcome, build_model_for, evaluate_dlrm, train_dlrm
from recscale.train.config import DenseOptimizerConfig, TrainConfig
from recscale.train.loop import NonFiniteLossError, TrainResult, TrainStep, predict

__all__ = [
    "DenseOptimizerConfig",
    "NonFiniteLossError",
    "TrainConfig",
    "TrainOutcome",
    "TrainResult",
    "TrainStep",
    "build_model_for",
    "evaluate_dlrm",
    "predict",
    "train_dlrm",
]
