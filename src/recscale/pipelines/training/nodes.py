"""Thin training node: the typed config in, the library trains, state and metrics out."""

from __future__ import annotations

from recscale.evaluate import plots
from recscale.pipelines.common import as_metrics
from recscale.train import DLRMConfig, resolved_config, train_dlrm


def train_model(dataset_manifest: dict, sharding_plan: dict, cfg: DLRMConfig):
    out = train_dlrm(dataset_manifest, cfg.model, cfg.train, plan=sharding_plan, comms=cfg.comms)
    r = out.result
    metrics = as_metrics({
        "world_size": cfg.train.world_size,
        "global_batch_size": cfg.train.batch_size_per_rank * cfg.train.world_size,
        **{k: v for k, v in r.extra.items() if k != "samples_per_s"},
        "throughput_samples_per_s": r.samples_per_s, "steps": r.steps, "samples": r.samples,
        "step_seconds": r.step_seconds, "wall_seconds": r.wall_seconds, "final_loss": r.final_loss,
    })
    figures = {"loss.png": plots.loss_figure(r.history),
               "throughput.png": plots.throughput_figure(r.history)}
    return (out.model.state_dict(), r.history, metrics,
            resolved_config(cfg, out, dataset_manifest), figures)
