"""Scheduled retraining, library side (no Kedro, no MLflow): which raw partitions are new (a
durable ledger), where a warm start comes from, training from that state, and the promotion rule.
The Kedro pipeline ``dlrm_retrain`` (recscale.pipelines.retrain) wires these to the MLflow registry.
"""

from recscale.retrain.config import RetrainConfig
from recscale.retrain.partitions import Partition, PartitionLedger, find_partitions
from recscale.retrain.promotion import Decision, decide_promotion
from recscale.retrain.warm import WarmStart, first_warm_start, state_dict_file_source, train_warm

__all__ = [
    "Decision", "Partition", "PartitionLedger", "RetrainConfig", "WarmStart", "decide_promotion",
    "find_partitions", "first_warm_start", "state_dict_file_source", "train_warm",
]
