"""Project hooks: check the MLflow store before anything runs; quiet third-party loggers; tag
each MLflow run with its Kedro environment, the pipeline and the ``--params`` given on the command
line, and name it after them, so sweeps over environments and ``--params`` loops line up side by
side in the MLflow UI; start the SparkSession an environment's ``spark.yml`` describes."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

from kedro.framework.hooks import hook_impl

from recscale.config import check_blocks, flatten, parse

# every top-level block of conf/base/parameters_*.yml (the DLRM pipeline's eight, then the others);
# a run whose parameters hold another (a typo in a config env or in --params) stops before any
# node. Kept here, not imported from the pipelines, so Kedro's start-up does not load torch.
PARAMETER_BLOCKS = ("data", "features", "preprocess", "sharding", "comms", "model", "train",
                    "evaluate", "hf", "hf_speech", "retrain", "score", "tune")


class TrackingStoreUnreachable(RuntimeError):
    """The MLflow tracking store named in conf/*/mlflow.yml cannot be reached."""


def check_tracking_store(uri: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, naming the URI, when the tracking store cannot be reached: an http(s)
    server that does not answer /health, a sqlite file that cannot be opened, a folder that cannot
    be written. (MLflow itself retries an unreachable server for minutes, and only after training
    when the first metric is logged.)"""
    where = "server.mlflow_tracking_uri in conf/<env>/mlflow.yml"
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        url = uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (http/https only)
                if resp.status != 200:
                    raise TrackingStoreUnreachable(f"MLflow server {uri} answered {resp.status} on "
                                                   f"/health ({where})")
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            raise TrackingStoreUnreachable(
                f"MLflow tracking server {uri} is unreachable ({getattr(exc, 'reason', exc)}); "
                f"start it or fix {where}") from exc
    elif scheme == "sqlite":
        path = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else parsed.path
        folder = os.path.dirname(os.path.abspath(path)) or "."
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise TrackingStoreUnreachable(f"MLflow store {uri}: folder {folder} does not exist or "
                                           f"is not writable ({where})")
        try:
            con = sqlite3.connect(path, timeout=timeout_s)
            try:
                con.execute("select 1")
            finally:
                con.close()
        except sqlite3.Error as exc:
            raise TrackingStoreUnreachable(f"MLflow store {uri} cannot be opened ({exc}); {where}") from exc
    elif scheme in ("", "file"):
        folder = parsed.path if scheme == "file" else uri
        os.makedirs(folder, exist_ok=True)
        if not os.access(folder, os.W_OK):
            raise TrackingStoreUnreachable(f"MLflow store folder {folder} is not writable ({where})")


class RecscaleHooks:
    @hook_impl
    def after_context_created(self, context) -> None:
        os.environ.setdefault("DO_NOT_TRACK", "true")
        for name in ("alembic", "mlflow.store.db.utils", "urllib3"):
            logging.getLogger(name).setLevel(logging.WARNING)
        self._env = context.env
        # a misspelt block would be read by no node: stop now, naming it and the nearest block
        check_blocks(context.params, PARAMETER_BLOCKS,
                     f"parameters of env {context.env or 'local'!r} and --params")

    @hook_impl
    def before_pipeline_run(self, run_params, pipeline, catalog) -> None:
        if "run_env" in pipeline.inputs():  # the tune pipeline: the env it copies, and its
            catalog["run_env"] = run_params.get("env") or "local"  # block checked before any work
            from recscale.pipelines.tune.nodes import check_study

            check_study(catalog.load("parameters"))
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


class TrackingStoreCheck:
    """Checks the MLflow store first thing (tryfirst, before kedro-mlflow's own hook, which would
    retry an unreachable server for minutes), so a bad store fails the run in seconds."""

    @hook_impl(tryfirst=True)
    def after_context_created(self, context) -> None:
        loader = context.config_loader
        if "mlflow" not in loader.config_patterns:
            loader.config_patterns.update({"mlflow": ["mlflow*", "mlflow*/**", "**/mlflow*"]})
        try:
            conf = loader["mlflow"]
        except Exception:  # no mlflow.yml: kedro-mlflow's defaults apply
            conf = {}
        uri = (conf.get("server") or {}).get("mlflow_tracking_uri") or os.environ.get(
            "MLFLOW_TRACKING_URI")
        if not uri:
            return
        uri = str(uri)
        if uri.startswith("sqlite:///") and not os.path.isabs(uri[len("sqlite:///"):]):
            uri = "sqlite:///" + str(context.project_path / uri[len("sqlite:///"):])
        t0 = time.perf_counter()
        check_tracking_store(uri)
        logging.getLogger(__name__).debug("MLflow store %s reachable (%.2f s)", uri,
                                          time.perf_counter() - t0)


class SparkHooks:
    """Kedro's way to Spark: when the environment has a ``spark.yml`` (``conf/spark``), parse it
    into ``recscale.data.spark_session.SparkConfig`` (an unknown key fails naming it) and start the
    SparkSession before the pipeline runs; the Spark preprocessing engine uses the active session.
    Environments without ``spark.yml`` never import pyspark."""

    def __init__(self) -> None:
        self.spark = None

    @hook_impl
    def after_context_created(self, context) -> None:
        from kedro.config import MissingConfigException

        loader = context.config_loader
        if "spark" not in loader.config_patterns:
            loader.config_patterns.update({"spark": ["spark*", "spark*/**"]})
        try:
            conf = loader["spark"]
        except MissingConfigException:
            return
        if not conf:
            return
        from recscale.data.spark_session import SparkConfig, make_spark_session

        cfg = parse(SparkConfig, conf, f"spark (conf/{context.env or 'local'}/spark.yml)")
        self.spark = make_spark_session(cfg)

    @hook_impl
    def after_pipeline_run(self) -> None:
        self._stop()

    @hook_impl
    def on_pipeline_error(self) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.spark is not None:
            self.spark.stop()
            self.spark = None
