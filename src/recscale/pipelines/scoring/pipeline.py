"""``score``: raw files scored by a logged or registered model; and the node every ``dlrm`` run
ends with, which logs that model."""

from kedro.pipeline import Node, Pipeline

from recscale.pipelines.scoring.nodes import log_model, parse_score_config, score_raw


def score_config_node() -> Node:
    return Node(parse_score_config, "params:score", "score_config", name="parse_score_config")


def log_model_node() -> Pipeline:
    return Pipeline([score_config_node(),
                     Node(log_model, ["model_state", "resolved_config", "dataset_manifest",
                                      "score_config"], "scoring_model_uri", name="log_model")])


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([score_config_node(),
                     Node(score_raw, "score_config", ["score_metrics", "score_report"],
                          name="score_raw")])
