from recscale.pipelines.hf.pipeline import create_pipeline, create_speech_pipeline

__all__ = ["create_pipeline", "create_speech_pipeline"]
