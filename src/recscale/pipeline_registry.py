"""Project pipelines: ``dlrm`` = data_processing + training + evaluation (also the default)."""

from kedro.pipeline import Pipeline

from recscale.pipelines import data_processing, evaluation, training


def register_pipelines() -> dict[str, Pipeline]:
    dp = data_processing.create_pipeline()
    tr = training.create_pipeline()
    ev = evaluation.create_pipeline()
    dlrm = dp + tr + ev
    return {
        "data_processing": dp,
        "training": tr,
        "evaluation": ev,
        "dlrm": dlrm,
        "__default__": dlrm,
    }
