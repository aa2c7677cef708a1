from kedro.pipeline import Node, Pipeline

from recscale.pipelines.common import dlrm_config_node
from recscale.pipelines.sharding.nodes import calibrate_topology, plan_tables


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            dlrm_config_node(),
            # does nothing unless sharding.calibrate is true
            Node(calibrate_topology, ["dataset_manifest", "dlrm_config"],
                 ["calibrated_topology", "calibration_metrics"], name="calibrate"),
            Node(plan_tables, ["dataset_manifest", "dlrm_config", "calibrated_topology"],
                 ["sharding_plan", "sharding_report", "sharding_chart", "sharding_metrics"],
                 name="plan_sharding"),
        ]
    )
