"""Hybrid-parallel DLRM training: embeddings model-parallel as the plan says, dense layers under
DistributedDataParallel, one process per rank (gloo on CPU, NCCL on GPU).

Each rank reads its own contiguous share of the train rows; the global batch is the per-rank batch
x world size. Ranks stay in lockstep: every rank runs the same number of steps per epoch (the
largest share decides), a rank whose rows ran out contributes an empty batch, so no row is dropped
and no rank waits forever in a collective.
"""

from __future__ import annotations

import logging
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
from recscale.distributed import LaunchConfig, WorkerContext, init_worker, worker_entry
from recscale.embedding.sharded import ShardedEmbeddingCollection
from recscale.embedding.tiered import merge_tier_stats
from recscale.model.dlrm import DLRM, ModelConfig
from recscale.sharding import ShardingPlan
from recscale.train.checkpoint import (
    Checkpointer,
    LocalShard,
    dense_tensors,
    flush_tiers,
    model_fingerprint,
)
from recscale.train.config import TrainConfig
from recscale.train.faults import maybe_kill, maybe_poison
from recscale.train.loop import NonFiniteLossError, make_dense_optimizer, set_threads

log = logging.getLogger(__name__)

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
    # with train.pipeline, the output all-to-all also overlaps the bottom MLP (and, in backward,
    # the gradients' return overlaps its backward); results are identical either way
    emb.overlap_output = train_cfg.pipeline
    return wrap_dense(DLRM(num_dense, emb.num_tables, model_cfg, emb, seed=train_cfg.seed),
                      ctx, stats, train_cfg.comms.dense_allreduce)


def wrap_dense(model: DLRM, ctx: WorkerContext, stats: CommStats, precision: str = "fp32") -> DLRM:
    model.dense_arch.to(ctx.device)
    # the dense arch's only buffer is a constant index: no per-step buffer broadcast (the
    # keyword is forward_sync_buffers from torch 2.13, broadcast_buffers before)
    import inspect

    no_sync = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters
               else "broadcast_buffers")
    ddp = DDP(model.dense_arch, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
              gradient_as_bucket_view=True, **{no_sync: False})
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
    resumed_from: str | None = None
    resumed_samples: int = 0  # this rank's samples before the checkpoint it resumed from
    resharded: bool = False
    checkpoints: list[str] = field(default_factory=list)
    checkpoint_failures: int = 0
    checkpoint_seconds: float = 0.0
    tier_stats: dict[str, float] = field(default_factory=dict)  # slow-tier shards' cache


def _empty_batch() -> Batch:
    return to_batch(empty_columns())


def embedding_shards(emb: ShardedEmbeddingCollection, replicated: bool = True) -> list[LocalShard]:
    """This rank's pieces of every table, for checkpoints: its shards, and (when ``replicated``)
    the data-parallel tables, which every rank holds whole."""
    out = [LocalShard(t, s.row_offset, s.col_offset, w, list(st))
           for t, s, w, st in emb.local_shards()]
    if replicated and emb.dp is not None:
        states = emb.dp.split_optimizer_states() or [[] for _ in emb.dp_tables]
        out += [LocalShard(t, 0, 0, w, list(st))
                for t, w, st in zip(emb.dp_tables, emb.dp.split_weights(), states)]
    return out


def train_sharded(ctx: WorkerContext, manifest: dict, model_cfg: ModelConfig, train_cfg: TrainConfig,
                  plan: ShardingPlan, out_dir: str, run_id: str = "run") -> dict[str, Any]:
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
    emb = model.embeddings
    ckpt = None
    start_epoch, start_batch, resume_loader = 0, 0, None
    if train_cfg.checkpoint.dir is not None:
        ckpt = Checkpointer(train_cfg.checkpoint, run_id, ctx.rank, ctx.world_size,
                            fingerprint=model_fingerprint(manifest, model_cfg, train_cfg))
        got = ckpt.restore(embedding_shards(emb), model._dense(), opt)
        if got is None and ckpt.init_from_checkpoint(embedding_shards(emb), model._dense(), opt):
            flush_tiers([emb])  # restored views -> slow tier
        if got is not None:
            path, m = got
            flush_tiers([emb])  # restored views -> slow tier
            p = m["progress"]
            same_world = m["world_size"] == ctx.world_size
            mine = p.get(str(ctx.rank), p["0"]) if same_world else p["0"]
            res.steps = int(m["step"])
            res.global_samples = int(mine["global_samples"])
            res.resumed_from = path
            start_epoch = int(mine["epoch"])
            if same_world:
                res.samples = res.resumed_samples = int(mine["samples"])
                start_batch = int(mine["batches"])
                resume_loader = m["loader"][str(ctx.rank)]
            else:  # rows are split differently over another number of ranks
                res.resharded = True
                if ctx.rank == 0:
                    log.warning("checkpoint %s was written by %d ranks, this run has %d: the model "
                                "is resharded; epoch %d restarts from its first row", path,
                                m["world_size"], ctx.world_size, start_epoch + 1)
            if ctx.rank == 0:
                log.info("resumed from %s at step %d (epoch %d, batch %d)", path, res.steps,
                         start_epoch + 1, start_batch)
            if start_batch >= steps_per_epoch:
                start_epoch, start_batch, resume_loader = start_epoch + 1, 0, None
    limit = train_cfg.max_steps
    acc = torch.zeros(2, dtype=torch.float64)  # loss sum, rows since the last log point
    interval = {"t": 0.0}
    stats.reset()
    done = limit is not None and res.steps >= limit
    epoch = start_epoch
    for epoch in range(start_epoch, train_cfg.epochs):
        if done:
            break
        loader = make_loader(files, loader_cfg)
        first = start_batch if epoch == start_epoch else 0
        if first and resume_loader is not None:
            loader.load_state_dict(resume_loader)
        it = iter(loader)

        def fetch(it=it, loader=loader):
            t = time.perf_counter()
            b = next(it, None) or _empty_batch()
            state = loader.state_dict() if ckpt is not None else None
            res.data_wait_seconds += time.perf_counter() - t
            return b.to(ctx.device, non_blocking=True), state

        batch, batch_state = fetch()
        batch = maybe_poison(train_cfg, ctx.rank, res.steps + 1, batch)
        started = emb.start(batch.sparse) if train_cfg.pipeline else None
        for i in range(first, steps_per_epoch):
            maybe_kill(train_cfg, ctx.rank, res.steps + 1)
            comm0, wait0 = stats.total_seconds, res.data_wait_seconds
            t0 = time.perf_counter()
            nxt = nxt_started = nxt_state = None
            if i + 1 < steps_per_epoch and (limit is None or res.steps + 1 < limit):
                nxt, nxt_state = fetch()
                nxt = maybe_poison(train_cfg, ctx.rank, res.steps + 2, nxt)
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
                    f"loss is {loss_sum} at step {res.steps} on rank {ctx.rank}: batch {i} of epoch "
                    f"{epoch + 1}, rows {int(rows.min())}..{int(rows.max())} ({batch.batch_size} "
                    f"rows); the last good checkpoint is kept")
            acc[0] += loss_sum
            acc[1] += batch.batch_size
            interval["t"] += dt
            if res.steps % train_cfg.log_every == 0:
                _log_point(res, acc, interval)
            last = (limit is not None and res.steps >= limit) or (
                i + 1 == steps_per_epoch and epoch + 1 == train_cfg.epochs)
            if ckpt is not None and (ckpt.due(res.steps) or last):
                _checkpoint(ckpt, model, opt, res, epoch, i + 1, batch_state)
            if limit is not None and res.steps >= limit:
                done = True
                break
            batch, started, batch_state = nxt, nxt_started, nxt_state
    _log_point(res, acc, interval)  # every rank takes part: it is a collective
    snap = stats.snapshot()
    res.bytes_per_step = {k: v["bytes"] / max(res.steps, 1) for k, v in snap.items()}
    if ckpt is not None:
        res.checkpoints = list(ckpt.saved)
        res.checkpoint_failures = ckpt.failed_writes
        res.checkpoint_seconds = ckpt.save_seconds
    flush_tiers([emb])
    res.tier_stats = emb.tier_stats()
    tables_and_states = model.embeddings.full_tables(dst=0)
    if ctx.rank == 0:
        res.state_path = _save_unsharded(model, tables_and_states, manifest, model_cfg, train_cfg, out_dir)
    return res.__dict__


def _checkpoint(ckpt: Checkpointer, model: DLRM, opt, res: RankResult, epoch: int, batches: int,
                loader_state) -> None:
    emb = model.embeddings
    flush_tiers([emb])
    rank0 = ckpt.rank == 0
    dense, rest = dense_tensors(model._dense(), opt) if rank0 else ({}, {})
    progress = {"epoch": epoch, "batches": batches, "samples": res.samples,
                "global_samples": res.global_samples, "steps": res.steps}
    ckpt.save(res.steps, embedding_shards(emb, replicated=rank0), dense, rest, progress,
              loader_state)


def _log_point(res: RankResult, acc: torch.Tensor, interval: dict) -> None:
    """Global mean loss and samples/s since the last point (one small all-reduce)."""
    if not interval["t"]:
        return
    if dist.get_backend() == "nccl":  # NCCL reduces device tensors only
        on_dev = acc.cuda()
        dist.all_reduce(on_dev)
        acc.copy_(on_dev.cpu())
    else:
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
    from recscale.train.api import cpu_model_from

    tables, states = tables_and_states
    return cpu_model_from(manifest, model_cfg, train_cfg, tables, states,
                          model._dense().state_dict()).state_dict()


def _save_unsharded(model, tables_and_states, manifest, model_cfg, train_cfg, out_dir) -> str:
    state = unsharded_state(model, tables_and_states, manifest, model_cfg, train_cfg)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "dlrm_state_dict.pt")
    torch.save(state, path)
    return path


@record
@worker_entry
def sharded_train_worker(manifest: dict, model_d: dict, train_d: dict, plan_d: dict,
                         out_dir: str, run_id: str = "run") -> dict[str, Any]:
    """Entry point of every worker process (picklable arguments only)."""
    model_cfg = parse(ModelConfig, model_d, "model")
    train_cfg = parse(TrainConfig, train_d, "train")
    ctx = init_worker(LaunchConfig(collective_timeout_s=train_cfg.collective_timeout_s),
                      train_cfg.device)
    result = train_sharded(ctx, manifest, model_cfg, train_cfg, ShardingPlan.from_dict(plan_d),
                           out_dir, run_id)
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
        "samples_per_s": sum(r["samples"] - r.get("resumed_samples", 0) for r in results.values())
        / step_s if step_s else float("nan"),
        "final_loss": r0["final_loss"],
        "bytes_per_step": float(np.sum([sum(r["bytes_per_step"].values()) for r in results.values()])),
        "checkpoints_written": len(r0.get("checkpoints", [])),
        "checkpoint_failures": r0.get("checkpoint_failures", 0),
        "checkpoint_seconds": r0.get("checkpoint_seconds", 0.0),
        "resumed": int(r0.get("resumed_from") is not None),
        "resumed_samples": sum(r.get("resumed_samples", 0) for r in results.values()),
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
