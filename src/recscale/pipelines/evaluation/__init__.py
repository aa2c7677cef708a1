from recscale.pipelines.evaluation.pipeline import create_pipeline

__all__ = ["create_pipeline"]
