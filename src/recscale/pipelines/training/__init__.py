from recscale.pipelines.training.pipeline import create_pipeline

__all__ = ["create_pipeline"]
