"""``tune``: the data preprocessed once (the ``data_processing`` pipeline), then a study of
trials over the ``tune.space`` keys, each a nested MLflow run; the study's table, plots and the
best trial's config env on the parent run."""

from kedro.pipeline import Node, Pipeline

from recscale.pipelines import data_processing
from recscale.pipelines.tune.nodes import tune_dlrm


def create_pipeline(**kwargs) -> Pipeline:
    return data_processing.create_pipeline() + Pipeline([
        Node(tune_dlrm, ["dataset_manifest", "raw_manifest", "parameters", "params:tune",
                         "run_env"],
             ["tune_metrics", "tune_trials", "tune_plots", "tune_best"], name="tune"),
    ])
