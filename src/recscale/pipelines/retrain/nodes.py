"""Thin nodes of ``dlrm_retrain``: new partitions -> warm start -> preprocess -> train ->
challenger and champion on the same rows -> register, maybe move the alias -> ledger.

With no new partition every node passes ``SKIPPED`` on and nothing changes: no training, no
model version, no alias move, no file written, the ledger untouched (the MLflow run of the
``kedro run`` is tagged ``retrain.outcome=no_new_data`` so the schedule's history shows it ran).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
from pathlib import Path

from recscale.config import parse, to_dict
from recscale.data.synthetic import generate_criteo_tsv
from recscale.evaluate.metrics import oracle_auc
from recscale.pipelines.common import DLRM_BLOCKS, as_metrics
from recscale.pipelines.sharding.nodes import plan_metrics
from recscale.retrain import (
    DLRMRetrainConfig,
    Partition,
    PartitionLedger,
    checkpoint_source,
    compare_with_champion,
    find_partitions,
    first_warm_start,
    prepare_partitions,
    save_latest,
    state_dict_file_source,
    train_warm,
)
from recscale.retrain.partitions import night_key
from recscale.runconfig import plan_for_run
from recscale.scoring.config import ScoreConfig
from recscale.train import resolved_config

log = logging.getLogger(__name__)

SKIPPED = {"skipped": "no new partitions"}
RETRAIN_BLOCKS = (*DLRM_BLOCKS, "retrain")


def _skipped(x) -> bool:
    return isinstance(x, dict) and "skipped" in x


def parse_retrain_config(*blocks: dict) -> DLRMRetrainConfig:
    """Every block (the DLRM ones and ``retrain``) into one typed config, once per run."""
    return parse(DLRMRetrainConfig, dict(zip(RETRAIN_BLOCKS, blocks, strict=True)), "")


def find_new_partitions(cfg: DLRMRetrainConfig) -> dict:
    rc = cfg.retrain
    found = find_partitions(rc.landing_dir, rc.pattern)
    new = PartitionLedger(rc.ledger).new_partitions(found, rc.max_partitions)
    if not new:
        log.info("no new partitions in %s/%s (%d there, all in the ledger %s): nothing to do; no "
                 "training, no model version, %s unchanged", rc.landing_dir, rc.pattern,
                 len(found), rc.ledger, rc.alias)
        return {**SKIPPED, "found": len(found)}
    log.info("%d new partition(s): %s", len(new), ", ".join(p.name for p in new))
    return {"partitions": [dataclasses.asdict(p) for p in new], "found": len(found)}


def resolve_warm_start(batch: dict, cfg: DLRMRetrainConfig) -> dict:
    if _skipped(batch):
        return SKIPPED
    from recscale.pipelines.retrain.registry import champion_source

    rc = cfg.retrain
    sources = {"checkpoint": lambda: checkpoint_source(f"{rc.model_dir}/checkpoints",
                                                       rc.ledger),
               "latest": lambda: state_dict_file_source(rc.model_dir),
               "champion": lambda: champion_source(rc.registered_model, rc.alias)}
    return {"warm": first_warm_start([(s, sources[s]()) for s in rc.warm_start])}


def prepare_retrain_data(batch: dict, warm: dict, cfg: DLRMRetrainConfig) -> dict:
    if _skipped(batch):
        return SKIPPED
    return prepare_partitions([Partition(**p) for p in batch["partitions"]], warm["warm"], cfg)


def plan_retrain(manifest: dict, cfg: DLRMRetrainConfig):
    """The night's sharding plan, as a ``dlrm`` run plans (``plan_for_run``: the tables as
    preprocessing sized them, grown vocabularies included, for ``train.launch.world_size``
    ranks); its JSON, report and chart logged with the run (a night without new data logs
    nothing)."""
    from recscale.pipelines.retrain import registry

    if _skipped(manifest):
        return SKIPPED, {}
    plan = plan_for_run(manifest, cfg)
    log.info("sharding plan\n%s", plan.report())
    registry.log_plan(plan)
    return plan, plan_metrics(plan)


def train_challenger(manifest: dict, warm: dict, plan, cfg: DLRMRetrainConfig):
    if _skipped(manifest):
        return SKIPPED, {}
    ws = warm["warm"]
    # the night's own checkpoints: a rerun of a night that failed resumes from them
    night = Path(cfg.retrain.model_dir) / "checkpoints" / night_key(
        [Partition(**p) for p in manifest["partitions"]])
    out = train_warm(manifest, cfg, ws, checkpoint_dir=str(night), plan=plan, resume=True)
    r = out.result
    resolved = resolved_config(cfg, out, manifest,
                               warm_start={"source": ws.source, "detail": ws.detail},
                               partitions=[p["name"] for p in manifest["partitions"]])
    metrics = {**r.history, **as_metrics({
        "throughput_samples_per_s": r.samples_per_s, "steps": r.steps, "samples": r.samples,
        "wall_seconds": r.wall_seconds, "final_loss": r.final_loss,
        "world_size": cfg.train.world_size,
        "warm_started": float(ws.state is not None or ws.checkpoint is not None)})}
    from recscale.train.checkpoint import list_checkpoints

    done = list_checkpoints(str(night), all_runs=True)  # this night's newest, resumed or not
    return {"model": out.model, "resolved": resolved, "history": r.history,
            "checkpoint": done[0] if done else None}, metrics


def evaluate_and_promote(manifest: dict, challenger: dict, cfg: DLRMRetrainConfig,
                         score: ScoreConfig):
    """Challenger vs champion on the same held-out rows (the library decides); register the
    challenger, move the alias when the rule says so, tag, log the pictures and a report."""
    from recscale.pipelines.retrain import registry

    if _skipped(manifest):
        registry.tag_run({"retrain.outcome": "no_new_data"})
        return SKIPPED, {}
    rc = cfg.retrain
    champ = registry.champion_version(rc.registered_model, rc.alias)
    champion = None
    if champ is not None:
        ws = registry.load_version(rc.registered_model, champ)
        champion = (f"champion v{champ.version}", ws.state, ws.config)
    cmp = compare_with_champion(challenger["model"], manifest, cfg.evaluate.batch_size,
                                rc.min_auc_gain, champion, cfg.evaluate.baselines,
                                rc.promotion.beat_baseline)
    promote, reason, where = cmp.decision.promote, cmp.decision.reason, manifest["eval_data"]
    resolved = challenger["resolved"]
    parts = [p["name"] for p in manifest["partitions"]]
    tags = {"retrain.auc": f"{cmp.challenger['auc']:.6f}",
            "retrain.champion_auc": "" if cmp.champion_auc is None else f"{cmp.champion_auc:.6f}",
            "retrain.champion_version": "" if champ is None else champ.version,
            "retrain.eval_data": where, "retrain.newest": manifest["newest"],
            "retrain.partitions": ",".join(parts),
            "retrain.warm_start": resolved["warm_start"]["detail"],
            "retrain.promoted": str(promote).lower(), "retrain.reason": reason,
            "retrain.best_baseline": "" if cmp.best_baseline is None else
            f"{cmp.best_baseline[0]} {cmp.best_baseline[1]:.6f}"}
    if rc.fault_injection == "kill_before_register":  # a drill: the driver dies here
        log.warning("retrain.fault_injection=kill_before_register: killing this process")
        os.kill(os.getpid(), signal.SIGKILL)
    version = registry.register(challenger["model"].state_dict(), resolved, rc.registered_model,
                                tags, manifest.get("vocabulary_path"), to_dict(score.serving))
    if promote:
        registry.move_alias(rc.registered_model, rc.alias, version.version)
        log.info("%s -> version %s: %s", rc.alias, version.version, reason)
    else:
        log.warning("registered version %s but %s stays on version %s: %s", version.version,
                    rc.alias, champ.version if champ else "-", reason)
    registry.tag_run({"retrain.outcome": "promoted" if promote else "not_promoted",
                      "retrain.model_version": version.version, "retrain.reason": reason})
    registry.log_pictures(challenger["history"], cmp.scored, rc.registered_model)
    registry.log_report({"model": rc.registered_model, "version": version.version,
                         "promoted": promote, "reason": reason, "eval_data": where,
                         "challenger": cmp.challenger, "champion_auc": cmp.champion_auc,
                         "best_baseline": cmp.best_baseline,
                         "champion_version": champ.version if champ else None,
                         "partitions": parts, "warm_start": resolved["warm_start"]})
    save_latest(rc.model_dir, challenger["model"].state_dict(), resolved,
                version=version.version, partitions=parts[-1])
    metrics = {**{f"challenger.{k}": v for k, v in cmp.challenger.items()},
               "champion_auc": cmp.champion_auc, "promoted": float(promote),
               "model_version": float(version.version), "partitions": len(parts)}
    return {"version": version.version, "promoted": promote, "reason": reason,
            "run_id": registry.active_run_id(), "checkpoint": challenger["checkpoint"]}, \
        as_metrics(metrics)


def record_consumed(batch: dict, outcome: dict, cfg: DLRMRetrainConfig) -> None:
    """Last node: the partitions count as consumed once their model is registered."""
    if _skipped(batch):
        return
    rc = cfg.retrain
    PartitionLedger(rc.ledger).record([Partition(**p) for p in batch["partitions"]],
                                      model_version=outcome["version"], run_id=outcome["run_id"],
                                      promoted=outcome["promoted"],
                                      checkpoint=outcome.get("checkpoint"))
    log.info("ledger %s: %d partition(s) consumed", rc.ledger, len(batch["partitions"]))


def write_synthetic_day(cfg: DLRMRetrainConfig) -> dict:
    """Demo data: the next day of synthetic data into the landing directory (day_01.tsv, ...),
    drawn from the same planted model as ``data.synthetic`` with fresh rows."""
    rc = cfg.retrain
    days = [int(m.group(1)) for p in find_partitions(rc.landing_dir, "day_*.tsv")
            if (m := re.fullmatch(r"day_(\d+)\.tsv", Path(p.name).name))]
    day = max(days, default=0) + 1
    rep = generate_criteo_tsv(cfg.data.synthetic, Path(rc.landing_dir) / f"day_{day:02d}.tsv",
                              day=day)
    log.info("new partition %s: %d rows, oracle AUC %.4f", rep.path, rep.num_rows, oracle_auc(rep))
    return rep.to_dict()
