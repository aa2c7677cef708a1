"""``dlrm_retrain``: consume new daily partitions, warm-start, train, evaluate against the
champion on the same rows, register, move the alias by the rule, record the partitions."""

from kedro.pipeline import Node, Pipeline

from recscale.pipelines.retrain import nodes as N
from recscale.pipelines.scoring.pipeline import score_config_node


def _config_node() -> Node:
    return Node(N.parse_retrain_config, [f"params:{b}" for b in N.RETRAIN_BLOCKS],
                "retrain_config", name="parse_retrain_config")


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([
        _config_node(), score_config_node(),
        Node(N.find_new_partitions, "retrain_config", "retrain_batch", name="find_new_partitions"),
        Node(N.resolve_warm_start, ["retrain_batch", "retrain_config"], "retrain_warm_start",
             name="resolve_warm_start"),
        Node(N.prepare_retrain_data, ["retrain_batch", "retrain_warm_start", "retrain_config"],
             "retrain_dataset_manifest", name="prepare_retrain_data"),
        Node(N.plan_retrain, ["retrain_dataset_manifest", "retrain_config"],
             ["retrain_plan", "retrain_sharding_metrics"], name="plan_retrain"),
        Node(N.train_challenger,
             ["retrain_dataset_manifest", "retrain_warm_start", "retrain_plan",
              "retrain_config"],
             ["retrain_challenger", "retrain_training_metrics"], name="train_challenger"),
        Node(N.evaluate_and_promote,
             ["retrain_dataset_manifest", "retrain_challenger", "retrain_config",
              "score_config"], ["retrain_outcome", "retrain_metrics"],
             name="evaluate_and_promote"),
        Node(N.record_consumed, ["retrain_batch", "retrain_outcome", "retrain_config"], None,
             name="record_consumed"),
    ])


def create_synthetic_day_pipeline(**kwargs) -> Pipeline:
    """Demo/test data: write the next synthetic day into ``retrain.landing_dir``."""
    return Pipeline([_config_node(),
                     Node(N.write_synthetic_day, "retrain_config", "synthetic_day_report",
                          name="write_synthetic_day")])
