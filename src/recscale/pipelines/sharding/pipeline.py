from kedro.pipeline import Node, Pipeline

from recscale.pipelines.common import dlrm_config_node
from recscale.pipelines.sharding.nodes import plan_tables


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            dlrm_config_node(),
            Node(plan_tables, ["dataset_manifest", "dlrm_config"],
                 ["sharding_plan", "sharding_report", "sharding_chart", "sharding_metrics"],
                 name="plan_sharding"),
        ]
    )
