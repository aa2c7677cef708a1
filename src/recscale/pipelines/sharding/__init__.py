from recscale.pipelines.sharding.pipeline import create_pipeline

__all__ = ["create_pipeline"]
