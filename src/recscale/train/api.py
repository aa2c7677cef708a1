"""Entry points the Kedro nodes (and notebooks) call: train and evaluate a DLRM from a manifest.

``manifest`` is the dict that preprocessing writes (``_manifest.json``): split files, table sizes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from recscale.data.criteo import NUM_DENSE
from recscale.data.loader import LoaderConfig, count_rows, make_loader
from recscale.evaluate.metrics import auc_score, binary_metrics
from recscale.model.dlrm import DLRM, ModelConfig, build_dlrm
from recscale.train.checkpoint import model_fingerprint
from recscale.train.config import TrainConfig
from recscale.train.loop import TrainResult, predict, resolve_device, set_threads, train_epochs

log = logging.getLogger(__name__)


@dataclass
class TrainOutcome:
    model: DLRM
    result: TrainResult
    table_sizes: tuple[int, ...]
    threads: int
    device: str


def build_model_for(manifest: dict, model_cfg: ModelConfig, train_cfg: TrainConfig,
                    device: torch.device | str = "cpu", placements=None) -> DLRM:
    return build_dlrm(model_cfg, manifest["table_sizes"], NUM_DENSE,
                      train_cfg.embedding_optimizer, seed=train_cfg.seed, device=device,
                      placements=placements, tiers=train_cfg.tiers)


def placements_from_plan(plan, feature_names, device_type: str, tiers=None):
    """One process: each table's placement from the plan (the tier and cache fraction of its
    shard), in ``feature_names`` order; None when every table is in the compute tier."""
    from recscale.embedding.tiered import placement_for
    from recscale.sharding import ShardingPlan

    if plan is None:
        return None
    plan = plan if isinstance(plan, ShardingPlan) else ShardingPlan.from_dict(plan)
    by_feature = {f: tp for tp in plan.tables for f in tp.feature_names}
    out = []
    for f in feature_names:
        if f not in by_feature:
            raise ValueError(f"the sharding plan has no table for feature {f!r}")
        s = by_feature[f].shards[0]
        out.append(placement_for(s.tier, plan.topology.compute_tier, s.cache_fraction,
                                 device_type, tiers))
    return out if any(p.kind != "memory" for p in out) else None


def train_dlrm(manifest: dict, model_cfg: ModelConfig, train_cfg: TrainConfig,
               plan=None, out_dir: str | None = None) -> TrainOutcome:
    """Train on the manifest's train split: in this process when ``train.world_size`` is 1, else
    sharded over ``world_size`` workers as ``plan`` (a ShardingPlan or its dict) says."""
    from recscale.distributed import in_torchrun

    if train_cfg.world_size > 1 or in_torchrun():
        return _train_sharded(manifest, model_cfg, train_cfg, plan, out_dir)
    device = resolve_device(train_cfg.device)
    threads = set_threads(train_cfg.num_threads)
    # tables the plan puts on a slower tier (e.g. beyond train.tiers.ram_budget_bytes) train
    # from it behind a cache
    placements = placements_from_plan(plan, manifest["sparse_features"], device.type,
                                      train_cfg.tiers)
    model = build_model_for(manifest, model_cfg, train_cfg, device, placements)
    result = train_in_process(model, manifest, model_cfg, train_cfg, device)
    if placements is not None or device.type != "cpu":
        # the outcome is an ordinary in-memory CPU model, whatever device or tier trained it
        model = to_cpu_model(model, manifest, model_cfg, train_cfg)
    return TrainOutcome(model, result, tuple(manifest["table_sizes"]), threads, str(device))


def train_in_process(model: DLRM, manifest: dict, model_cfg: ModelConfig, train_cfg: TrainConfig,
                     device: torch.device) -> TrainResult:
    """Train ``model`` in this process on the manifest's train split (checkpoints as
    ``train.checkpoint`` says) and check that every row was trained on, once per epoch."""
    files = manifest["splits"]["train"]["files"]
    rows = count_rows(files)
    if rows == 0:
        raise ValueError("the train split is empty: check preprocess.splits and the input data")
    loader_cfg = LoaderConfig(batch_size=train_cfg.batch_size, reader_workers=train_cfg.reader_workers,
                              prefetch=train_cfg.prefetch, pin_memory=device.type == "cuda")
    result = train_epochs(
        model, None, train_cfg, make_epoch=lambda: make_loader(files, loader_cfg),
        total_steps=-(-rows // train_cfg.batch_size) * train_cfg.epochs, device=device,
        run_id=new_run_id(), fingerprint=model_fingerprint(manifest, model_cfg, train_cfg),
    )
    expected = rows * train_cfg.epochs
    if result.extra.get("resharded"):
        log.warning("resumed from a checkpoint of another world size: the interrupted epoch was "
                    "restarted, so rows of it were read again")
    elif train_cfg.max_steps is None and result.samples != expected:
        raise RuntimeError(f"trained on {result.samples} samples but the train split holds "
                           f"{rows} rows x {train_cfg.epochs} epochs = {expected}")
    return result


def cpu_model_from(manifest: dict, model_cfg: ModelConfig, train_cfg: TrainConfig, tables,
                   states, dense_state: dict) -> DLRM:
    """A single-process CPU DLRM holding these full tables, optimizer states (per table, as
    ``split_optimizer_states`` gives them) and dense-arch state, from any device or tier."""
    cpu = build_model_for(manifest, model_cfg, train_cfg, "cpu")
    with torch.no_grad():
        for dst, src in zip(cpu.embeddings.split_weights(), tables):
            dst.copy_(src)
        for dst_t, src_t in zip(cpu.embeddings.split_optimizer_states() or [], states or []):
            for dst, src in zip(dst_t, src_t):
                dst.copy_(src.view_as(dst))
        cpu.dense_arch.load_state_dict(dense_state)
    return cpu


def to_cpu_model(model: DLRM, manifest: dict, model_cfg: ModelConfig,
                 train_cfg: TrainConfig) -> DLRM:
    """The same model as an ordinary in-memory CPU model. fbgemm's table-batched module keeps its
    tables in device-specific buffers (weights_dev on CUDA, weights_host on the CPU) and a tiered
    module keeps them on its slow tier, so state_dicts do not carry over; copy table by table. A
    tiered module's scratch files are released afterwards."""
    emb = model.embeddings
    cpu = cpu_model_from(manifest, model_cfg, train_cfg, emb.split_weights(),
                         emb.split_optimizer_states(), model._dense().state_dict())
    if callable(getattr(emb, "close", None)):
        emb.close()
    return cpu


def evaluate_dlrm(model: DLRM, manifest: dict, split: str, batch_size: int,
                  oracle_probs: np.ndarray | None = None) -> dict[str, float]:
    """Click metrics of ``model`` on one split; with the generator's true probabilities, also the
    oracle AUC of the same rows (the best any model can expect)."""
    files = manifest["splits"][split]["files"]
    loader = make_loader(files, LoaderConfig(batch_size=batch_size))
    labels, probs, rows = predict(model, loader)
    expected = manifest["splits"][split]["rows"]
    if labels.size != expected:
        raise RuntimeError(f"evaluated {labels.size} rows of {split} but it holds {expected}")
    metrics = binary_metrics(labels, probs)
    if oracle_probs is not None and labels.size:
        metrics["oracle_auc"] = auc_score(labels, oracle_probs[rows])
        metrics["auc_gap_to_oracle"] = metrics["oracle_auc"] - metrics["auc"]
    return metrics


def new_run_id() -> str:
    import time
    import uuid

    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def _train_sharded(manifest, model_cfg, train_cfg, plan, out_dir) -> TrainOutcome:
    from recscale.config import to_dict
    from recscale.distributed import LaunchConfig, in_torchrun, launch
    from recscale.sharding import ShardingPlan
    from recscale.train.sharded import default_out_dir, sharded_train_worker, summarize

    if plan is None:
        raise ValueError("train.world_size > 1 needs a sharding plan (the sharding pipeline makes one)")
    plan_d = plan.to_dict() if isinstance(plan, ShardingPlan) else plan
    if plan_d["topology"]["world_size"] != train_cfg.world_size:
        raise ValueError(f"the sharding plan is for world_size={plan_d['topology']['world_size']}, "
                         f"train.world_size={train_cfg.world_size}: plan again for this world size")
    out_dir = out_dir or default_out_dir()
    # one id per launch: elastic restarts of the worker group resume from its checkpoints
    run_id = new_run_id()
    results = launch(sharded_train_worker,
                     (manifest, to_dict(model_cfg), to_dict(train_cfg), plan_d, out_dir, run_id),
                     LaunchConfig(world_size=train_cfg.world_size, nnodes=train_cfg.nnodes,
                                  rdzv_endpoint=train_cfg.rdzv_endpoint,
                                  max_restarts=train_cfg.max_restarts,
                                  collective_timeout_s=train_cfg.collective_timeout_s))
    summary = summarize(results)
    r0 = results.get(0)
    if r0 is None:  # another host (or, under torchrun, another process) holds rank 0
        if in_torchrun():
            return None
        raise RuntimeError("rank 0 ran on another host: its node records the run")
    expected = count_rows(manifest["splits"]["train"]["files"]) * train_cfg.epochs
    if r0.get("resharded"):
        log.warning("resumed from %s, written by another number of ranks: the interrupted epoch "
                    "was restarted, so rows of it were read again", r0["resumed_from"])
    elif train_cfg.max_steps is None and summary["samples"] != expected:
        raise RuntimeError(f"trained on {summary['samples']} samples but the train split holds "
                           f"{expected // train_cfg.epochs} rows x {train_cfg.epochs} epochs")
    model = build_model_for(manifest, model_cfg, train_cfg)
    model.load_state_dict(torch.load(r0["state_path"], weights_only=True))
    res = TrainResult(steps=summary["steps"], samples=summary["samples"],
                      step_seconds=summary["step_seconds"], final_loss=summary["final_loss"],
                      history=r0["history"], extra=summary, checkpoints=list(r0["checkpoints"]),
                      resumed_samples=summary.get("resumed_samples", 0))
    return TrainOutcome(model, res, tuple(manifest["table_sizes"]), train_cfg.num_threads or 0,
                        str(resolve_device(train_cfg.device)))
