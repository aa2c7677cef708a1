"""Scheduled retraining, library side (no Kedro, no MLflow): which raw partitions are new (a
durable ledger), where a warm start comes from, the data of a retrain, training from that state,
and challenger vs champion on the same rows with the promotion rule. The Kedro pipeline
``dlrm_retrain`` (recscale.pipelines.retrain) wires these to the MLflow registry.
"""

from recscale.retrain.config import DLRMRetrainConfig, RetrainConfig
from recscale.retrain.data import prepare_partitions
from recscale.retrain.partitions import Partition, PartitionLedger, find_partitions
from recscale.retrain.promotion import Comparison, Decision, compare_with_champion, decide_promotion
from recscale.retrain.warm import (
    WarmStart,
    checkpoint_source,
    first_warm_start,
    save_latest,
    state_dict_file_source,
    train_warm,
)

__all__ = [
    "Comparison", "DLRMRetrainConfig", "Decision", "Partition", "PartitionLedger",
    "RetrainConfig", "WarmStart", "checkpoint_source", "compare_with_champion", "decide_promotion",
    "find_partitions", "first_warm_start", "prepare_partitions", "save_latest",
    "state_dict_file_source", "train_warm",
]
