"""Hybrid-parallel DLRM training: embeddings model-parallel as the plan says, dense layers under
DistributedDataParallel, one process per rank (gloo on CPU, NCCL on GPU).

Each rank reads its own contiguous share of the train rows; the global batch is the per-rank batch
x world size. Ranks stay in lockstep: every rank runs the same number of steps per epoch (the
largest share decides), a rank whose rows ran out contributes an empty batch, so no row is dropped
and no rank waits forever in a collective.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

from recscale.comm.collectives import CommStats
from recscale.config import parse
from recscale.data.batch import Batch
from recscale.data.criteo import NUM_DENSE, SPARSE_NAMES
from recscale.data.loader import LoaderConfig, empty_columns, make_loader, rank_row_counts, to_batch
from recscale.embedding.sharded import ShardedEmbeddingCollection
from recscale.embedding.tiered import merge_tier_stats
from recscale.model.dlrm import DLRM, ModelConfig, build_dlrm
from recscale.sharding import ShardingPlan
from recscale.train.config import TrainConfig
from recscale.train.launch import WorkerContext, init_worker, worker_entry
from recscale.train.loop import NonFiniteLossError, make_dense_optimizer, set_threads

_DDP_HOOKS = {
    "fp32": (default_hooks.allreduce_hook, 4),
    "fp16": (default_hooks.fp16_compress_hook, 2),
    "bf16": (default_hooks.bf16_compress_hook, 2),
}


def _counting_allreduce_hook(stats: CommStats, precision: str):
    """torch's DDP communication hook for ``precision`` (plain, fp16- or bf16-compressed
    all-reduce), with the bytes each bucket hands to the all-reduce counted."""
    torch_hook, wire_bytes = _DDP_HOOKS[precision]

    def hook(process_group, bucket):
        stats.add("dense_allreduce", bucket.buffer().numel() * wire_bytes, 0.0)
        return torch_hook(process_group, bucket)

    return hook


def build_sharded_model(ctx: WorkerContext, plan: ShardingPlan, model_cfg: ModelConfig,
                        train_cfg: TrainConfig, stats: CommStats,
                        feature_names=SPARSE_NAMES, num_dense: int = NUM_DENSE) -> DLRM:
    emb = ShardedEmbeddingCollection(
        plan, feature_names, train_cfg.embedding_optimizer, ctx.rank, ctx.world_size, seed=train_cfg.seed,
        group=ctx.sparse_group, device=ctx.device, stats=stats,
        output_grad_scale=1.0 / ctx.world_size, comms=train_cfg.comms, tiers=train_cfg.tiers,
    )
    return wrap_dense(DLRM(num_dense, emb.num_tables, model_cfg, emb, seed=train_cfg.seed),
                      ctx, stats, train_cfg.comms.dense_allreduce)


def wrap_dense(model: DLRM, ctx: WorkerContext, stats: CommStats, precision: str = "fp32") -> DLRM:
    model.dense_arch.to(ctx.device)
    # the dense arch's only buffer is a constant index: no per-step buffer broadcast
    ddp = DDP(model.dense_arch, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
              forward_sync_buffers=False, gradient_as_bucket_view=True)
    ddp.register_comm_hook(None, _counting_allreduce_hook(stats, precision))
    model.dense_arch = ddp
    return model


class ShardedStep:
    """One step on this rank's part of the global batch. Each rank's loss is W x (its share of
    the global-mean BCE), which with DDP's averaging and the embeddings' 1/W gradient scale gives
    exactly the gradients of the single-process mean loss over the global batch."""

    def __init__(self, model: DLRM, opt: torch.optim.Optimizer, world: int):
        self.model, self.opt, self.world = model, opt, world
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="sum")

    def __call__(self, batch: Batch, started=None) -> tuple[float, int]:
        """``started``: the batch's input distribution, if already started (pipelining)."""
        logits = self.model(batch.dense, started if started is not None else batch.sparse)
        global_batch = sum(self.model.embeddings.last_batch_sizes)
        loss_sum = self.loss_fn(logits, batch.labels)
        self.opt.zero_grad(set_to_none=True)
        (loss_sum * (self.world / global_batch)).backward()
        self.opt.step()
        return float(loss_sum.detach()), global_batch


@dataclass
class RankResult:
    rank: int
    steps: int = 0
    samples: int = 0  # this rank's
    global_samples: int = 0
    step_seconds: float = 0.0
    comm_seconds: float = 0.0
    data_wait_seconds: float = 0.0  # time the trainer waited for the loader
    bytes_per_step: dict[str, float] = field(default_factory=dict)
    embedding_bytes: int = 0
    planned_bytes: float = 0.0
    history: dict[str, list[dict]] = field(default_factory=dict)
    final_loss: float = float("nan")
    state_path: str | None = None
    tier_stats: dict[str, float] = field(default_factory=dict)  # slow-tier shards' cache


def _empty_batch() -> Batch:
    return to_batch(empty_columns())


def train_sharded(ctx: WorkerContext, manifest: dict, model_cfg: ModelConfig, train_cfg: TrainConfig,
                  plan: ShardingPlan, out_dir: str) -> dict[str, Any]:
    set_threads(train_cfg.num_threads, ctx.local_world_size)
    stats = CommStats()
    model = build_sharded_model(ctx, plan, model_cfg, train_cfg, stats)
    opt = make_dense_optimizer(model.dense_parameters(), train_cfg.dense_optimizer)
    step_fn = ShardedStep(model, opt, ctx.world_size)
    files = manifest["splits"]["train"]["files"]
    shares = rank_row_counts(files, ctx.world_size)
    steps_per_epoch = max(math.ceil(c / train_cfg.batch_size) for c in shares)
    loader_cfg = LoaderConfig(batch_size=train_cfg.batch_size, rank=ctx.rank,
                              world_size=ctx.world_size, reader_workers=train_cfg.reader_workers,
                              prefetch=train_cfg.prefetch, pin_memory=ctx.device.type == "cuda")
    res = RankResult(rank=ctx.rank, embedding_bytes=model.embeddings.embedding_bytes())
    tier = plan.topology.compute_tier
    res.planned_bytes = float(plan.ranks[ctx.rank].memory(tier))
    limit = train_cfg.max_steps
    acc = torch.zeros(2, dtype=torch.float64)  # loss sum, rows since the last log point
    interval = {"t": 0.0}
    stats.reset()
    done = False
    emb = model.embeddings
    for _epoch in range(train_cfg.epochs):
        it = iter(make_loader(files, loader_cfg))

        def fetch(it=it):
            t = time.perf_counter()
            b = next(it, None) or _empty_batch()
            res.data_wait_seconds += time.perf_counter() - t
            return b.to(ctx.device, non_blocking=True)

        batch = fetch()
        started = emb.start(batch.sparse) if train_cfg.pipeline else None
        for i in range(steps_per_epoch):
            comm0, wait0 = stats.total_seconds, res.data_wait_seconds
            t0 = time.perf_counter()
            nxt = nxt_started = None
            if i + 1 < steps_per_epoch and (limit is None or res.steps + 1 < limit):
                nxt = fetch()
                if train_cfg.pipeline:  # ids of batch i+1 travel while batch i computes
                    nxt_started = emb.start(nxt.sparse)
                    emb.prefetch(nxt_started)  # slow-tier shards load batch i+1's rows meanwhile
            loss_sum, global_batch = step_fn(batch, started)
            dt = time.perf_counter() - t0 - (res.data_wait_seconds - wait0)  # the step only
            res.steps += 1
            res.samples += batch.batch_size
            res.global_samples += global_batch
            res.step_seconds += dt
            res.comm_seconds += stats.total_seconds - comm0
            if not math.isfinite(loss_sum):  # the peers then fail in their next collective
                rows = batch.row_ids
                raise NonFiniteLossError(
                    f"loss is {loss_sum} at step {res.steps} on rank {ctx.rank}; batch rows "
                    f"{int(rows.min())}..{int(rows.max())} ({batch.batch_size} rows)")
            acc[0] += loss_sum
            acc[1] += batch.batch_size
            interval["t"] += dt
            if res.steps % train_cfg.log_every == 0:
                _log_point(res, acc, interval)
            if limit is not None and res.steps >= limit:
                done = True
                break
            batch, started = nxt, nxt_started
        if done:
            break
    _log_point(res, acc, interval)  # every rank takes part: it is a collective
    snap = stats.snapshot()
    res.bytes_per_step = {k: v["bytes"] / max(res.steps, 1) for k, v in snap.items()}
    res.tier_stats = emb.tier_stats()
    tables_and_states = model.embeddings.full_tables(dst=0)
    if ctx.rank == 0:
        res.state_path = _save_unsharded(model, tables_and_states, manifest, model_cfg, train_cfg, out_dir)
    return res.__dict__


def _log_point(res: RankResult, acc: torch.Tensor, interval: dict) -> None:
    """Global mean loss and samples/s since the last point (one small all-reduce)."""
    if not interval["t"]:
        return
    dist.all_reduce(acc)
    loss, rows = float(acc[0]), int(acc[1])
    res.final_loss = loss / max(rows, 1)
    res.history.setdefault("loss", []).append({"step": res.steps, "value": res.final_loss})
    res.history.setdefault("samples_per_s", []).append(
        {"step": res.steps, "value": rows / max(interval["t"], 1e-12)})
    acc.zero_()
    interval["t"] = 0.0


def unsharded_state(model: DLRM, tables_and_states, manifest: dict, model_cfg: ModelConfig,
                    train_cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """The state_dict a single-process DLRM of the same config would have: world-size free."""
    tables, states = tables_and_states
    ref = build_dlrm(model_cfg, manifest["table_sizes"], NUM_DENSE, train_cfg.embedding_optimizer,
                     seed=train_cfg.seed)
    with torch.no_grad():
        for w, full in zip(ref.embeddings.split_weights(), tables):
            w.copy_(full)
        for st_ref, st in zip(ref.embeddings.split_optimizer_states() or [], states):
            for a, b in zip(st_ref, st):
                a.copy_(b.view_as(a))
        ref.dense_arch.load_state_dict(model._dense().state_dict())
    return ref.state_dict()


def _save_unsharded(model, tables_and_states, manifest, model_cfg, train_cfg, out_dir) -> str:
    state = unsharded_state(model, tables_and_states, manifest, model_cfg, train_cfg)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "dlrm_state_dict.pt")
    torch.save(state, path)
    return path


@record
@worker_entry
def sharded_train_worker(manifest: dict, model_d: dict, train_d: dict, plan_d: dict,
                         out_dir: str) -> dict[str, Any]:
    """Entry point of every worker process (picklable arguments only)."""
    model_cfg = parse(ModelConfig, model_d, "model")
    train_cfg = parse(TrainConfig, train_d, "train")
    ctx = init_worker(train_cfg)
    result = train_sharded(ctx, manifest, model_cfg, train_cfg, ShardingPlan.from_dict(plan_d),
                           out_dir)
    dist.destroy_process_group()  # on error the process just exits: the launcher cleans up
    return result


def summarize(results: dict[int, dict]) -> dict[str, Any]:
    """Per-rank results -> the run's metrics (rank 0's history; per-rank time split)."""
    r0 = results[min(results)]
    steps = r0["steps"]
    step_s = max(r["step_seconds"] for r in results.values())
    out = {
        "steps": steps,
        "samples": sum(r["samples"] for r in results.values()),
        "step_seconds": step_s,
        "samples_per_s": sum(r["samples"] for r in results.values()) / step_s if step_s else float("nan"),
        "final_loss": r0["final_loss"],
        "bytes_per_step": float(np.sum([sum(r["bytes_per_step"].values()) for r in results.values()])),
    }
    for rank, r in sorted(results.items()):
        out[f"rank{rank}.step_ms"] = 1e3 * r["step_seconds"] / max(r["steps"], 1)
        out[f"rank{rank}.comm_ms"] = 1e3 * r["comm_seconds"] / max(r["steps"], 1)
        out[f"rank{rank}.compute_ms"] = out[f"rank{rank}.step_ms"] - out[f"rank{rank}.comm_ms"]
        out[f"rank{rank}.bytes_sent_per_step"] = sum(r["bytes_per_step"].values())
        out[f"rank{rank}.embedding_bytes"] = r["embedding_bytes"]
        out[f"rank{rank}.planned_embedding_bytes"] = r["planned_bytes"]
        out[f"rank{rank}.data_wait_ms"] = 1e3 * r["data_wait_seconds"] / max(r["steps"], 1)
        for k, v in r["bytes_per_step"].items():
            out[f"rank{rank}.bytes_per_step.{k}"] = v
        for k, v in r.get("tier_stats", {}).items():
            out[f"rank{rank}.tiers.{k}"] = v
    tiers = merge_tier_stats([r["tier_stats"] for r in results.values() if r.get("tier_stats")])
    out.update({f"tiers.{k}": v for k, v in tiers.items()})
    return out


def default_out_dir() -> str:
    return tempfile.mkdtemp(prefix="recscale-train-")
