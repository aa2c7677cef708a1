from kedro.pipeline import Node, Pipeline

from recscale.pipelines.sharding.nodes import plan_tables


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(plan_tables,
                 ["dataset_manifest", "params:sharding", "params:model", "params:train",
                  "params:comms"],
                 ["sharding_plan", "sharding_report", "sharding_chart", "sharding_metrics"],
                 name="plan_sharding"),
        ]
    )
