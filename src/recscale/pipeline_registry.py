"""Project pipelines: ``dlrm`` = data_processing + sharding + training + evaluation (the default);
``dlrm_retrain`` = scheduled retraining on new daily partitions; ``synthetic_day`` writes one;
``score`` = raw files scored by a logged or registered model; ``tune`` = a hyperparameter study
over the DLRM config (data preprocessed once, then Optuna trials)."""

from kedro.pipeline import Pipeline

from recscale.pipelines import (
    data_processing,
    evaluation,
    hf,
    retrain,
    scoring,
    sharding,
    training,
    tune,
)


def register_pipelines() -> dict[str, Pipeline]:
    dp = data_processing.create_pipeline()
    sh = sharding.create_pipeline()
    tr = training.create_pipeline()
    ev = evaluation.create_pipeline()
    dlrm = dp + sh + tr + ev
    return {
        "data_processing": dp,
        "sharding": sh,
        "training": tr,
        "evaluation": ev,
        "dlrm": dlrm,
        "hf": hf.create_pipeline(),
        "hf_speech": hf.create_speech_pipeline(),
        "dlrm_retrain": retrain.create_pipeline(),
        "synthetic_day": retrain.create_synthetic_day_pipeline(),
        "score": scoring.create_pipeline(),
        "tune": tune.create_pipeline(),
        "__default__": dlrm,
    }
