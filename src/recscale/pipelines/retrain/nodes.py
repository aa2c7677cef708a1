"""Thin nodes of ``dlrm_retrain``: new partitions -> warm start -> preprocess -> train ->
evaluate challenger and champion on the same rows -> register, maybe move the alias -> ledger.

With no new partition every node passes ``SKIPPED`` on and nothing changes: no training, no
model version, no alias move, no file written, the ledger untouched (the MLflow run of the
``kedro run`` is tagged ``retrain.outcome=no_new_data`` so the schedule's history shows it ran).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import torch

from recscale import __version__
from recscale.config import parse, to_dict
from recscale.data.criteo import count_lines
from recscale.data.preprocess import PreprocessConfig, preprocess_criteo
from recscale.evaluate.scoring import metrics_with_oracle, score_split
from recscale.model import ModelConfig
from recscale.pipelines.common import as_metrics
from recscale.retrain import (
    Partition,
    PartitionLedger,
    RetrainConfig,
    WarmStart,
    decide_promotion,
    find_partitions,
    first_warm_start,
    state_dict_file_source,
    train_warm,
)
from recscale.retrain.warm import checkpoint_source, save_latest
from recscale.train import TrainConfig, build_model_for

log = logging.getLogger(__name__)

SKIPPED = {"skipped": "no new partitions"}


def _skipped(x) -> bool:
    return isinstance(x, dict) and "skipped" in x


def find_new_partitions(retrain_params: dict) -> dict:
    cfg = parse(RetrainConfig, retrain_params, "retrain")
    found = find_partitions(cfg.landing_dir, cfg.pattern)
    ledger = PartitionLedger(cfg.ledger)
    new = ledger.new_partitions(found, cfg.max_partitions)
    if not new:
        log.info("no new partitions in %s/%s (%d there, all in the ledger %s): nothing to do; no "
                 "training, no model version, %s unchanged", cfg.landing_dir, cfg.pattern,
                 len(found), cfg.ledger, cfg.alias)
        return {**SKIPPED, "found": len(found)}
    log.info("%d new partition(s): %s", len(new), ", ".join(p.name for p in new))
    return {"partitions": [dataclasses.asdict(p) for p in new], "found": len(found)}


def resolve_warm_start(batch: dict, retrain_params: dict) -> dict:
    if _skipped(batch):
        return SKIPPED
    from recscale.pipelines.retrain.registry import champion_source

    cfg = parse(RetrainConfig, retrain_params, "retrain")
    sources = {"checkpoint": lambda: checkpoint_source(f"{cfg.model_dir}/checkpoints"),
               "latest": lambda: state_dict_file_source(cfg.model_dir),
               "champion": lambda: champion_source(cfg.registered_model, cfg.alias)}
    return {"warm": first_warm_start([(s, sources[s]()) for s in cfg.warm_start])}


def prepare_retrain_data(batch: dict, warm: dict, preprocess_params: dict,
                         retrain_params: dict) -> dict:
    """Preprocess the new partitions with the warm model's table sizes; the last
    ``retrain.eval_fraction`` of the newest partition becomes the test split."""
    if _skipped(batch):
        return SKIPPED
    cfg = parse(RetrainConfig, retrain_params, "retrain")
    parts = [Partition(**p) for p in batch["partitions"]]
    files = [p.path for p in parts]
    ws: WarmStart = warm["warm"]
    lines = [count_lines(f) for f in files]
    total = sum(lines)
    held_out = cfg.eval_fraction * lines[-1] / total
    params = {k: v for k, v in preprocess_params.items() if k != "output_dir"}
    params.update(splits=[1.0 - held_out, 0.0, held_out])
    if ws.table_sizes is not None:  # ids must hash into the rows the warm model learned
        params["table_sizes"] = list(ws.table_sizes)
    pcfg = parse(PreprocessConfig, params, "preprocess")
    report = preprocess_criteo(files, cfg.work_dir, pcfg, table_size_hint=_cardinalities(files))
    manifest = json.loads(Path(report.manifest_path).read_text())
    test_rows = manifest["splits"]["test"]["rows"]
    oracles = [f + ".oracle.npy" for f in files]
    return {**manifest, "partitions": batch["partitions"], "newest": parts[-1].name,
            "eval_data": f"last {test_rows} rows of {parts[-1].name}",
            "oracle_paths": oracles if all(Path(o).exists() for o in oracles) else None}


def _cardinalities(files: list[str]) -> list[int] | None:
    """Synthetic day files say their cardinalities beside them (``.meta.json``)."""
    cards = []
    for f in files:
        meta = Path(f + ".meta.json")
        if not meta.exists():
            return None
        cards.append(json.loads(meta.read_text()).get("cardinalities"))
    return cards[0] if cards and all(c == cards[0] for c in cards) else None


def train_challenger(manifest: dict, warm: dict, model_params: dict, train_params: dict,
                     retrain_params: dict):
    if _skipped(manifest):
        return SKIPPED, {}
    model_cfg = parse(ModelConfig, model_params, "model")
    train_cfg = parse(TrainConfig, train_params, "train")
    ws: WarmStart = warm["warm"]
    cfg = parse(RetrainConfig, retrain_params, "retrain")
    out = train_warm(manifest, model_cfg, train_cfg, ws, checkpoint_dir=f"{cfg.model_dir}/checkpoints")
    r = out.result
    resolved = {"model": to_dict(model_cfg), "train": to_dict(train_cfg),
                "table_sizes": list(out.table_sizes),
                "runtime": {"device": out.device, "threads": out.threads, "torch": torch.__version__,
                            "recscale": __version__},
                "warm_start": {"source": ws.source, "detail": ws.detail},
                "partitions": [p["name"] for p in manifest["partitions"]]}
    metrics = {**r.history, **as_metrics({
        "throughput_samples_per_s": r.samples_per_s, "steps": r.steps, "samples": r.samples,
        "wall_seconds": r.wall_seconds, "final_loss": r.final_loss,
        "warm_started": float(ws.state is not None)})}
    return {"model": out.model, "resolved": resolved, "history": r.history}, metrics


def evaluate_and_promote(manifest: dict, challenger: dict, retrain_params: dict):
    """Score challenger and champion on the same held-out rows, register the challenger, move
    the alias when the rule says so; log the pictures and a report."""
    from recscale.pipelines.retrain import registry

    if _skipped(manifest):
        registry.tag_run({"retrain.outcome": "no_new_data"})
        return SKIPPED, {}
    cfg = parse(RetrainConfig, retrain_params, "retrain")
    resolved = challenger["resolved"]
    train_cfg = parse(TrainConfig, resolved["train"], "train")
    bs = train_cfg.eval_batch_size
    oracle = (np.concatenate([np.load(o, mmap_mode="r") for o in manifest["oracle_paths"]])
              if manifest.get("oracle_paths") else None)
    y, p, rows = score_split(challenger["model"], manifest, "test", bs)
    m = metrics_with_oracle(y, p, rows, oracle)
    scored = {"challenger": (y, p)}
    champ = registry.champion_version(cfg.registered_model, cfg.alias)
    champ_auc, reason = None, None
    where = manifest["eval_data"]
    if champ is not None:
        ws = registry.load_version(cfg.registered_model, champ)
        if list(ws.table_sizes) != list(manifest["table_sizes"]):
            reason = (f"champion v{champ.version} hashes ids into tables of other sizes "
                      f"({ws.table_sizes} vs {manifest['table_sizes']}): it cannot be scored on "
                      f"the same rows, so the challenger is not promoted; move the alias by hand")
        else:
            cm = build_model_for(manifest, parse(ModelConfig, ws.config["model"], "model"),
                                 parse(TrainConfig, ws.config["train"], "train"))
            cm.load_state_dict(ws.state)
            cy, cp, _ = score_split(cm, manifest, "test", bs)
            champ_auc = metrics_with_oracle(cy, cp, rows)["auc"]
            scored[f"champion v{champ.version}"] = (cy, cp)
    if reason is None:
        decision = decide_promotion(m["auc"], champ_auc, cfg.min_auc_gain, where)
        promote, reason = decision.promote, decision.reason
    else:
        promote = False
    tags = {"retrain.auc": f"{m['auc']:.6f}", "retrain.champion_auc":
            "" if champ_auc is None else f"{champ_auc:.6f}",
            "retrain.champion_version": "" if champ is None else champ.version,
            "retrain.eval_data": where, "retrain.newest": manifest["newest"],
            "retrain.partitions": ",".join(p["name"] for p in manifest["partitions"]),
            "retrain.warm_start": resolved["warm_start"]["detail"],
            "retrain.promoted": str(promote).lower(), "retrain.reason": reason}
    version = registry.register(challenger["model"].state_dict(), resolved, cfg.registered_model, tags)
    if promote:
        registry.move_alias(cfg.registered_model, cfg.alias, version.version)
        log.info("%s -> version %s: %s", cfg.alias, version.version, reason)
    else:
        log.warning("registered version %s but %s stays on version %s: %s", version.version,
                    cfg.alias, champ.version if champ else "-", reason)
    registry.tag_run({"retrain.outcome": "promoted" if promote else "not_promoted",
                      "retrain.model_version": version.version, "retrain.reason": reason})
    registry.log_pictures(challenger["history"], scored, cfg.registered_model)
    report = {"model": cfg.registered_model, "version": version.version, "promoted": promote,
              "reason": reason, "eval_data": where, "challenger": m, "champion_auc": champ_auc,
              "champion_version": champ.version if champ else None,
              "partitions": [p["name"] for p in manifest["partitions"]],
              "warm_start": resolved["warm_start"]}
    registry.log_report(report)
    save_latest(cfg.model_dir, challenger["model"].state_dict(), resolved,
                version=version.version, partitions=report["partitions"][-1])
    metrics = {**{f"challenger.{k}": v for k, v in m.items()},
               "champion_auc": champ_auc, "promoted": float(promote),
               "model_version": float(version.version), "partitions": len(manifest["partitions"])}
    return {"version": version.version, "promoted": promote, "reason": reason,
            "run_id": registry.active_run_id()}, as_metrics(metrics)


def record_consumed(batch: dict, outcome: dict, retrain_params: dict) -> None:
    """Last node: the partitions count as consumed once their model is registered."""
    if _skipped(batch):
        return
    cfg = parse(RetrainConfig, retrain_params, "retrain")
    PartitionLedger(cfg.ledger).record([Partition(**p) for p in batch["partitions"]],
                                       model_version=outcome["version"], run_id=outcome["run_id"],
                                       promoted=outcome["promoted"])
    log.info("ledger %s: %d partition(s) consumed", cfg.ledger, len(batch["partitions"]))


def write_synthetic_day(data_params: dict, retrain_params: dict) -> dict:
    """Demo data: the next day of synthetic data into the landing directory (day_01.tsv, ...),
    drawn from the same planted model as ``data.synthetic`` with fresh rows."""
    import re

    from recscale.data.source import DataConfig
    from recscale.data.synthetic import generate_criteo_tsv

    data_cfg = parse(DataConfig, data_params, "data")
    cfg = parse(RetrainConfig, retrain_params, "retrain")
    days = [int(m.group(1)) for p in find_partitions(cfg.landing_dir, "day_*.tsv")
            if (m := re.fullmatch(r"day_(\d+)\.tsv", Path(p.name).name))]
    day = max(days, default=0) + 1
    rep = generate_criteo_tsv(data_cfg.synthetic, Path(cfg.landing_dir) / f"day_{day:02d}.tsv",
                              day=day)
    log.info("new partition %s: %d rows, oracle AUC %.4f", rep.path, rep.num_rows, rep.oracle_auc)
    return rep.to_dict()
