from kedro.pipeline import Node, Pipeline

from recscale.pipelines.evaluation.nodes import evaluate_model


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(evaluate_model,
                 ["model_state", "resolved_config", "dataset_manifest", "raw_manifest",
                  "params:evaluate"],
                 ["evaluation_metrics", "evaluation_report", "evaluation_plots"], name="evaluate"),
        ]
    )
