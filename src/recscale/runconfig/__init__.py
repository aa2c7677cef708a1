"""The root configuration of a DLRM run, where every package that needs it can import it:
``DLRMConfig`` (every block of parameters_dlrm.yml: ``data``, ``preprocess``, ``sharding``,
``comms``, ``model``, ``train``, ``evaluate``), parsed once by the first node of each DLRM
pipeline, what it resolves to on a dataset (``recipe_for``: the model, ``plan_for_run``: the
sharding plan), and its own blocks (``TrainConfig`` with ``train.checkpoint``, ``train.dense_optimizer``
``train.validation``, ``train.early_stopping``, ``train.average`` and ``train.fault_injection``; ``EvaluateConfig``). The blocks of the other packages (data,
sharding, comms, model, embedding, launch) are theirs; this package only puts them together."""

from recscale.runconfig.dlrm import (
    DENSE_OPTIMIZERS,
    AverageConfig,
    CheckpointConfig,
    DenseOptimizerConfig,
    DLRMConfig,
    EarlyStoppingConfig,
    EvaluateConfig,
    FaultInjection,
    TrainConfig,
    ValidateConfig,
)
from recscale.runconfig.resolve import plan_for_run, recipe_for

__all__ = [
    "DENSE_OPTIMIZERS",
    "AverageConfig",
    "CheckpointConfig",
    "DLRMConfig",
    "DenseOptimizerConfig",
    "EarlyStoppingConfig",
    "EvaluateConfig",
    "FaultInjection",
    "TrainConfig",
    "ValidateConfig",
    "plan_for_run",
    "recipe_for",
]
