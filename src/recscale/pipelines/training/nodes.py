"""Thin training node: the typed config in, the library trains, state and metrics out."""

from __future__ import annotations

from recscale.data.schema import FittedSchema
from recscale.evaluate import plots
from recscale.pipelines.common import as_metrics
from recscale.report import bytes_against_plan, step_time_against_plan
from recscale.runconfig import DLRMConfig
from recscale.sharding import ShardingPlan
from recscale.train import resolved_config, train_dlrm


def train_model(dataset_manifest: dict, sharding_plan: dict, cfg: DLRMConfig):
    out = train_dlrm(dataset_manifest, cfg.model, cfg.train, plan=sharding_plan, comms=cfg.comms,
                     sharding=cfg.sharding)
    r = out.result
    metrics = as_metrics({
        "world_size": cfg.train.world_size,
        "global_batch_size": cfg.train.batch_size_per_rank * cfg.train.world_size,
        **{k: v for k, v in r.extra.items() if k != "samples_per_s"},
        "throughput_samples_per_s": r.samples_per_s, "steps": r.steps, "samples": r.samples,
        "step_seconds": r.step_seconds, "wall_seconds": r.wall_seconds, "final_loss": r.final_loss,
    })
    metrics.update(transition_metrics(r.transitions or []))
    plan = ShardingPlan.from_dict(sharding_plan)
    if cfg.train.world_size > 1:
        metrics.update(as_metrics(bytes_against_plan(r.extra, plan)))
    # predicted vs measured step time per rank (compute, communication), and the plan's report
    # with both
    step_time, report = step_time_against_plan(r.extra, plan, cfg.model, cfg.train.pipeline,
                                               FittedSchema.of(dataset_manifest).num_dense)
    metrics.update(as_metrics(step_time))
    # the validation curves (train.validation) are logged as validation.<metric>, beside
    # train.loss
    history = {k: v for k, v in r.history.items() if not k.startswith("validation.")}
    validation = {k.removeprefix("validation."): v for k, v in r.history.items()
                  if k.startswith("validation.")}
    best = int((r.extra or {}).get("best_step") or 0) or None
    figures = {"loss.png": plots.loss_figure(r.history, best_step=best),
               "throughput.png": plots.throughput_figure(r.history)}
    return (out.model.state_dict(), history, validation, metrics,
            resolved_config(cfg, out, dataset_manifest), figures, report)


def transition_metrics(transitions: list[dict]) -> dict:
    """A job across hosts: the world size over steps (one point per attempt of the worker
    group), how often it replanned, and the rows replayed from checkpoints."""
    if not transitions:
        return {}
    return {"world_size_over_steps": [{"step": int(t["start_step"]), "value": t["world_size"]}
                                      for t in transitions],
            "attempts": {"step": 0, "value": len(transitions)},
            "replans": {"step": 0, "value": sum(bool(t["replanned"]) for t in transitions)},
            "rows_replayed": {"step": 0,
                              "value": sum(t["rows_replayed"] for t in transitions)}}
