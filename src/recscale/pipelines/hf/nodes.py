"""Thin nodes of the ``hf`` (MNIST) and ``hf_speech`` (spoken-digit frames) pipelines.

The first node parses the whole parameter block (``hf`` or ``hf_speech``) into one root typed
config (``recscale.hf.config``); the others take that object, call ``recscale.data`` /
``recscale.optim``, and shape what MLflow records: metric histories against passes over the data
and training wall time, per-step HF diagnostics, test metrics, a JSON report and a PNG comparing
the optimizers.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from recscale.config import parse, to_dict
from recscale.data.frames import FrameFeatures, prepare_speech_frames
from recscale.data.idx import prepare_mnist
from recscale.hf.config import HFJobConfig, MnistJobConfig, SpeechJobConfig
from recscale.hf.fit import fit_baseline, fit_hessian_free, load_model
from recscale.hf.loop import FitResult, evaluate_classifier
from recscale.pipelines.common import as_metrics

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------- config
def parse_mnist_job(block: dict, key: str = "hf") -> MnistJobConfig:
    """The ``hf`` block, every key checked before any work starts."""
    return parse(MnistJobConfig, block, key)


def parse_speech_job(block: dict, key: str = "hf_speech") -> SpeechJobConfig:
    return parse(SpeechJobConfig, block, key)


# ------------------------------------------------------------------------------ preprocess
def preprocess_mnist(images: np.ndarray, labels: np.ndarray, job: MnistJobConfig):
    splits = prepare_mnist(images, labels, job.data)
    log.info("MNIST splits: %s", splits["info"])
    return splits, _data_metrics(splits)


def preprocess_speech(frames: FrameFeatures, job: SpeechJobConfig):
    splits = prepare_speech_frames(frames, job.data)
    log.info("speech frame splits: %s", splits["info"])
    return splits, _data_metrics(splits)


def _data_metrics(splits: dict) -> dict:
    info = splits["info"]
    return as_metrics({f"data.{k}": v for k, v in info.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)})


# ---------------------------------------------------------------------------------- train
def train_hessian_free(splits: dict, job: HFJobConfig):
    result = fit_hessian_free(splits, job.model, job.optimizer, job.train)
    log.info("hessian-free: %s", {k: round(v, 4) for k, v in result.summary.items()})
    history = _history(result)
    for r in result.steps:  # per HF step diagnostics
        s = int(r["step"])
        for name in ("cg_iters", "damping", "rho", "negative_curvature_events", "alpha",
                     "step_s", "loss", "products", "loss_evals"):
            history.setdefault(f"hf.{name}", []).append({"step": s, "value": float(r[name])})
    summary = as_metrics({f"hf.{k}": v for k, v in result.summary.items()})
    return result, result.state_dict, history, summary


def train_baselines(splits: dict, job: HFJobConfig):
    results = {}
    history: dict[str, list] = {}
    summary: dict[str, float] = {}
    for name in job.baselines.optimizers:
        r = fit_baseline(splits, job.model, name, job.baselines, job.train)
        log.info("%s: %s", name, {k: round(v, 4) for k, v in r.summary.items()})
        results[name] = r
        history.update(_history(r))
        summary.update({f"{name}.{k}": v for k, v in r.summary.items()})
    return results, history, as_metrics(summary)


def _history(r: FitResult) -> dict[str, list[dict]]:
    """Loss and error at each evaluation point, against the training step, passes over the
    data (step = passes x 100) and training wall time (step = milliseconds)."""
    out: dict[str, list[dict]] = {}
    for h in r.history:
        for name in ("train_loss", "val_loss", "val_error"):
            v = h[name]
            if not math.isfinite(v):
                continue
            out.setdefault(f"{r.name}.{name}", []).append({"step": int(h["step"]), "value": v})
            out.setdefault(f"{r.name}.{name}_by_centipass", []).append(
                {"step": int(round(100 * h["passes"])), "value": v})
            out.setdefault(f"{r.name}.{name}_by_wall_ms", []).append(
                {"step": int(round(1000 * h["wall_s"])), "value": v})
        out.setdefault(f"{r.name}.passes", []).append({"step": int(h["step"]), "value": h["passes"]})
        out.setdefault(f"{r.name}.wall_s", []).append({"step": int(h["step"]), "value": h["wall_s"]})
    return out


# ------------------------------------------------------------------------------- evaluate
def evaluate_optimizers(splits: dict, hf_result: FitResult, baselines: dict[str, FitResult],
                        job: HFJobConfig, key: str = "hf"):
    """Test loss/error of every optimizer's final model, passes and time each needed to reach
    SGD's best validation error, a JSON report and the comparison PNG."""
    from recscale.hf.plots import comparison_image

    results = [hf_result, *baselines.values()]
    target = baselines["sgd"].summary.get("best_val_error") if "sgd" in baselines else None
    metrics: dict[str, float] = {}
    report: dict[str, Any] = {"target": {"definition": "best validation error of SGD",
                                         "val_error": target},
                              "data": splits["info"], "config": _run_config(job), "optimizers": {}}
    for r in results:
        model = load_model(r, splits, job.model)
        test = evaluate_classifier(model, splits["x_test"], splits["y_test"])
        reached = r.reach(target) if target is not None else None
        metrics[f"test.{r.name}.error"] = test["error"]
        metrics[f"test.{r.name}.loss"] = test["loss"]
        if reached is not None:
            metrics[f"{r.name}.passes_to_target"] = reached["passes"]
            metrics[f"{r.name}.wall_s_to_target"] = reached["wall_s"]
        report["optimizers"][r.name] = {"batch_size": r.batch_size, "world_size": r.world_size,
                                        "test": test, "reached_target": reached,
                                        "summary": r.summary}
    if target is not None:
        metrics["target_val_error"] = target
    title = f"{splits['info'].get('source', '')} ({key}): validation error, dashed = SGD's best"
    image = comparison_image(results, title, target)
    return as_metrics(metrics), report, image


def _run_config(job: HFJobConfig) -> dict:
    """The report's ``config``: the block without its ``data`` (the report has that apart)."""
    return {k: v for k, v in to_dict(job).items() if k != "data"}
