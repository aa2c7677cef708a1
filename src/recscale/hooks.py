"""Project hooks: quiet third-party loggers and tag each MLflow run with its Kedro environment."""

from __future__ import annotations

import logging
import os

from kedro.framework.hooks import hook_impl


class RecscaleHooks:
    @hook_impl
    def after_context_created(self, context) -> None:
        os.environ.setdefault("DO_NOT_TRACK", "true")
        for name in ("alembic", "mlflow.store.db.utils", "urllib3"):
            logging.getLogger(name).setLevel(logging.WARNING)
        self._env = context.env

    @hook_impl
    def before_pipeline_run(self, run_params, pipeline, catalog) -> None:
        try:
            import mlflow

            if mlflow.active_run() is not None:
                names = run_params.get("pipeline_names") or [run_params.get("pipeline_name")]
                mlflow.set_tags({"kedro.env": run_params.get("env") or "local",
                                 "kedro.pipeline": ",".join(n for n in names if n) or "__default__"})
        except Exception:  # tracking must never break a run from a hook
            logging.getLogger(__name__).debug("could not tag the MLflow run", exc_info=True)
