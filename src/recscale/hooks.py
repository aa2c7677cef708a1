"""Project hooks: quiet third-party loggers; tag each MLflow run with its Kedro environment, the
pipeline and the ``--params`` given on the command line, and name it after them, so sweeps over
environments and ``--params`` loops line up side by side in the MLflow UI."""

from __future__ import annotations

import logging
import os

from kedro.framework.hooks import hook_impl

from recscale.config import flatten


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
                mlflow.set_tags(run_tags(run_params))
        except Exception:  # tracking must never break a run from a hook
            logging.getLogger(__name__).debug("could not tag the MLflow run", exc_info=True)


def run_tags(run_params: dict) -> dict[str, str]:
    """MLflow tags of a ``kedro run``: env, pipeline, runtime params and a readable run name
    (``<pipeline> @ <env> [k=v ...]``)."""
    names = run_params.get("pipeline_names") or [run_params.get("pipeline_name")]
    pipeline = ",".join(n for n in names if n) or "__default__"
    env = run_params.get("env") or "local"
    extra = flatten(run_params.get("runtime_params") or {})
    given = ",".join(f"{k}={v}" for k, v in sorted(extra.items()))
    tags = {"kedro.env": env, "kedro.pipeline": pipeline,
            "mlflow.runName": " ".join(x for x in (f"{pipeline} @ {env}", given) if x)[:250]}
    if given:
        tags["kedro.runtime_params"] = given[:5000]
    return tags
