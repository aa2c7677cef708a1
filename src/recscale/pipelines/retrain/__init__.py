"""``dlrm_retrain`` and ``synthetic_day`` pipelines (Kedro side of recscale.retrain)."""

from recscale.pipelines.retrain.pipeline import create_pipeline, create_synthetic_day_pipeline

__all__ = ["create_pipeline", "create_synthetic_day_pipeline"]
