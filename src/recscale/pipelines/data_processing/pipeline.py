from kedro.pipeline import Node, Pipeline

from recscale.pipelines.common import dlrm_config_node
from recscale.pipelines.data_processing.nodes import generate_or_locate_raw, preprocess


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            dlrm_config_node(),
            Node(generate_or_locate_raw, ["dlrm_config", "raw_table"], "raw_manifest",
                 name="raw_data"),
            Node(preprocess, ["raw_manifest", "dlrm_config"],
                 ["dataset_manifest", "preprocess_metrics", "vocabulary", "fitted_schema"],
                 name="preprocess"),
        ]
    )
