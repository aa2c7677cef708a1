from kedro.pipeline import Node, Pipeline

from recscale.pipelines.training.nodes import train_model


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(train_model, ["dataset_manifest", "sharding_plan", "params:model", "params:train",
                                 "params:comms"],
                 ["model_state", "training_history", "training_metrics", "resolved_config",
                  "training_plots"],
                 name="train"),
        ]
    )
