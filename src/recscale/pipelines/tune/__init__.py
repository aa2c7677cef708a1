from recscale.pipelines.tune.pipeline import create_pipeline

__all__ = ["create_pipeline"]
