from kedro.pipeline import Node, Pipeline

from recscale.pipelines.common import dlrm_config_node
from recscale.pipelines.training.nodes import train_model


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            dlrm_config_node(),
            Node(train_model, ["dataset_manifest", "sharding_plan", "dlrm_config"],
                 ["model_state", "training_history", "validation_history", "training_metrics",
                  "resolved_config", "training_plots", "step_time_report"],
                 name="train"),
        ]
    )
