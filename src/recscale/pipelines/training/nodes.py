"""Thin training node: parse typed configs, call the library, return state and metrics."""

from __future__ import annotations

import dataclasses

import torch

from recscale import __version__
from recscale.comm import CommsConfig
from recscale.config import parse, to_dict
from recscale.evaluate import plots
from recscale.model import ModelConfig
from recscale.pipelines.common import as_metrics
from recscale.train import TrainConfig, train_dlrm


def parse_configs(model_params: dict, train_params: dict,
                  comms_params: dict | None = None) -> tuple[ModelConfig, TrainConfig]:
    train_cfg = parse(TrainConfig, train_params, "train")
    if comms_params is not None:
        train_cfg = dataclasses.replace(train_cfg, comms=parse(CommsConfig, comms_params, "comms"))
    return parse(ModelConfig, model_params, "model"), train_cfg


def train_model(dataset_manifest: dict, sharding_plan: dict, model_params: dict,
                train_params: dict, comms_params: dict | None = None):
    model_cfg, train_cfg = parse_configs(model_params, train_params, comms_params)
    out = train_dlrm(dataset_manifest, model_cfg, train_cfg, plan=sharding_plan)
    r = out.result
    from recscale.embedding import FBGEMM_VERSION

    resolved = {
        "model": to_dict(model_cfg),
        "train": to_dict(train_cfg),
        "table_sizes": list(out.table_sizes),
        "runtime": {"device": out.device, "threads": out.threads, "torch": torch.__version__,
                    "fbgemm_gpu": FBGEMM_VERSION, "recscale": __version__},
        "dataset_manifest": dataset_manifest.get("manifest_path"),
    }
    metrics = as_metrics({
        "world_size": train_cfg.world_size,
        "global_batch_size": train_cfg.batch_size * train_cfg.world_size,
        **{k: v for k, v in r.extra.items() if k != "samples_per_s"},
        "throughput_samples_per_s": r.samples_per_s, "steps": r.steps, "samples": r.samples,
        "step_seconds": r.step_seconds, "wall_seconds": r.wall_seconds, "final_loss": r.final_loss,
    })
    figures = {"loss.png": plots.loss_figure(r.history),
               "throughput.png": plots.throughput_figure(r.history)}
    return out.model.state_dict(), r.history, metrics, resolved, figures
