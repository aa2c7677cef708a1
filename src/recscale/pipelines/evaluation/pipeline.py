from kedro.pipeline import Node, Pipeline

from recscale.pipelines.common import dlrm_config_node
from recscale.pipelines.evaluation.nodes import evaluate_model


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            dlrm_config_node(),
            Node(evaluate_model, ["model_state", "resolved_config", "dataset_manifest", "raw_manifest",
                  "dlrm_config"],
                 ["evaluation_metrics", "evaluation_report", "evaluation_plots"], name="evaluate"),
        ]
    )
