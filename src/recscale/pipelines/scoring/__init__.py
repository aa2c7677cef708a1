"""Scores from raw rows: the logged model (``pyfunc_model.py``, ``model_log.py``) and
``kedro run --pipeline=score``."""

from recscale.pipelines.scoring.pipeline import create_pipeline, log_model_node

__all__ = ["create_pipeline", "log_model_node"]
