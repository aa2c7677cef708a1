from kedro.pipeline import Node, Pipeline

from recscale.pipelines.common import dlrm_config_node
from recscale.pipelines.evaluation.nodes import evaluate_model
from recscale.pipelines.scoring import log_model_node


def create_pipeline(**kwargs) -> Pipeline:
    return log_model_node() + Pipeline(
        [
            dlrm_config_node(),
            Node(evaluate_model, ["model_state", "resolved_config", "dataset_manifest", "raw_manifest",
                  "dlrm_config"],
                 ["evaluation_metrics", "evaluation_report", "evaluation_plots",
                  "evaluation_scores"], name="evaluate"),
        ]
    )
