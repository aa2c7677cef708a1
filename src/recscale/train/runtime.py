"""Runtimes: one process's part of training, as the loop sees it.

A runtime holds the model, the dense optimizer, the step (``step.run(batch, started)`` ->
(loss summed over this rank's rows, rows of the global batch)), the communication counters and
how to sum a tensor over ranks. ``LocalRuntime`` is the one-process case; ``ShardedRuntime`` is one
rank of the hybrid-parallel DLRM: embeddings model-parallel as the plan says
(``ShardedEmbeddingCollection``), the dense arch under DistributedDataParallel with a counting
communication hook, flat (torch's, compressed or not) or hierarchical over the plan's hosts
(``recscale.comm.ddp_hooks``), gloo on CPU and NCCL on GPU. With a Hessian-free dense optimizer
the step is ``HessianFreeStep`` (``hf_step.py``), whose products are all-reduced by the optimizer.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from recscale.comm import CommsConfig
from recscale.comm.collectives import CommStats, make_host_groups
from recscale.comm.ddp_hooks import counting_allreduce_hook, hierarchical_allreduce_hook
from recscale.distributed import WorkerContext
from recscale.embedding.features import feature_bags
from recscale.embedding.sharded import ShardedEmbeddingCollection
from recscale.model.dlrm import DLRM, ModelConfig
from recscale.runconfig import TrainConfig
from recscale.sharding import ShardingPlan
from recscale.train.hf_step import HessianFreeStep, counting_all_reduce
from recscale.train.step import ShardedStep, TrainStep, make_dense_optimizer


class Runtime:
    """One process: ``rank`` of ``world_size``; see the module docstring."""

    rank: int = 0
    world_size: int = 1
    planned_bytes: float = 0.0  # the plan's compute-tier bytes for this rank (0: no plan)

    def __init__(self, model: DLRM, train_cfg: TrainConfig, device: torch.device,
                 stats: CommStats | None = None, reduce=None):
        self.model, self.device = model, device
        self.stats = stats if stats is not None else CommStats()
        dense_opt = train_cfg.dense_optimizer
        dense_opt.check_model(model.cfg)
        self.hessian_free = dense_opt.name == "hessian_free"
        # reduce: Hessian-free's sum over ranks (gradient, curvature products, losses)
        self.opt = make_dense_optimizer(model.dense_parameters(), dense_opt, reduce)

    def all_reduce_(self, t: torch.Tensor) -> None:
        """Sum ``t`` (a CPU tensor) over ranks, in place."""

    def all_gather(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order."""
        return [obj]


class LocalRuntime(Runtime):
    """The whole model in this process."""

    def __init__(self, model: DLRM, train_cfg: TrainConfig, device: torch.device):
        super().__init__(model, train_cfg, device)
        if self.hessian_free:
            self.step = HessianFreeStep(
                model, self.opt,
                curvature_batch_size=train_cfg.dense_optimizer.curvature_batch_size)
        else:
            self.step = TrainStep(model, self.opt, train_cfg.seed)


class ShardedRuntime(Runtime):
    """This rank's shards (as ``plan`` says) and a DDP replica of the dense arch."""

    def __init__(self, ctx: WorkerContext, plan: ShardingPlan, model_cfg: ModelConfig,
                 train_cfg: TrainConfig, comms: CommsConfig | None = None, *,
                 feature_names: Sequence[str], num_dense: int,
                 feature_tables: Sequence[int] | None = None,
                 pooling: Sequence[str] | None = None):
        """``feature_names``: the sparse features, as the batches name them (the fitted
        schema's); ``num_dense``: the dense inputs; ``feature_tables``, ``pooling``: each
        feature's table and pooling (see ``build_sharded_model``)."""
        stats = CommStats()
        model = build_sharded_model(ctx, plan, model_cfg, train_cfg, stats, comms,
                                    feature_names=feature_names, num_dense=num_dense,
                                    feature_tables=feature_tables, pooling=pooling)
        dense_opt = train_cfg.dense_optimizer
        reduce = None
        if dense_opt.name == "hessian_free":  # the dense arch's HF steps bypass DDP
            reduce = counting_all_reduce(stats, plan.local_world_size < ctx.world_size)
        super().__init__(model, train_cfg, ctx.device, stats, reduce)
        self.rank, self.world_size, self.ctx = ctx.rank, ctx.world_size, ctx
        self.planned_bytes = float(plan.ranks[ctx.rank].memory(plan.topology.compute_tier))
        if self.hessian_free:
            self.step = HessianFreeStep(model, self.opt, ctx.world_size, sharded=True,
                                        curvature_batch_size=dense_opt.curvature_batch_size)
        else:
            self.step = ShardedStep(model, self.opt, ctx.world_size, train_cfg.seed, ctx.rank)

    def all_reduce_(self, t: torch.Tensor) -> None:
        if dist.get_backend() == "nccl":  # NCCL reduces device tensors only
            on_dev = t.to(self.device)
            dist.all_reduce(on_dev)
            t.copy_(on_dev.cpu())
        else:
            dist.all_reduce(t)

    def all_gather(self, obj) -> list:
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def build_sharded_model(ctx: WorkerContext, plan: ShardingPlan, model_cfg: ModelConfig,
                        train_cfg: TrainConfig, stats: CommStats,
                        comms: CommsConfig | None = None, *, feature_names: Sequence[str],
                        num_dense: int, feature_tables: Sequence[int] | None = None,
                        pooling: Sequence[str] | None = None) -> DLRM:
    """``feature_tables[f]``: the table (0..T-1, in order of first use) feature f looks up
    (None: one each, in order); the sharded collection holds the tables, named by their first
    feature (the plan's ``TablePlan.feature_names`` holds it), and ``FeatureBags`` puts the
    features on them (``recscale.embedding.features``)."""
    comms = comms or CommsConfig()
    tables = list(range(len(feature_names))) if feature_tables is None else list(feature_tables)
    first = [feature_names[tables.index(t)] for t in range(max(tables) + 1)]
    emb = ShardedEmbeddingCollection(
        plan, first, train_cfg.embedding_optimizer, ctx.rank, ctx.world_size,
        seed=train_cfg.seed, group=ctx.sparse_group, device=ctx.device, stats=stats,
        output_grad_scale=1.0 / ctx.world_size, comms=comms, tiers=train_cfg.tiers,
        timeout_s=getattr(ctx, "collective_timeout_s", None),
    )
    # the pipelined policy also overlaps the output all-to-all with the bottom MLP (and, in
    # backward, the gradients' return with its backward); results are identical either way
    emb.overlap_output = train_cfg.pipeline
    emb = feature_bags(emb, tables, pooling)
    return wrap_dense(DLRM(num_dense, emb.dims, model_cfg, emb, seed=train_cfg.seed),
                      ctx, stats, comms.dense_allreduce, plan, train_cfg.dense_reduction)


def wrap_dense(model: DLRM, ctx: WorkerContext, stats: CommStats, precision: str = "fp32",
               plan: ShardingPlan | None = None, reduction: str = "auto") -> DLRM:
    """The dense arch under DDP with a counting communication hook: flat, or hierarchical over
    the plan's hosts (``reduction``: auto = hierarchical when ``plan`` spans hosts)."""
    model.dense_arch.to(ctx.device)
    # the dense arch's only buffer is a constant index: no per-step buffer broadcast (the
    # keyword is forward_sync_buffers from torch 2.13, broadcast_buffers before)
    no_sync = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters
               else "broadcast_buffers")
    ddp = DDP(model.dense_arch, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
              gradient_as_bucket_view=True, **{no_sync: False})
    lws = plan.local_world_size if plan is not None else ctx.world_size
    spans = lws < ctx.world_size
    if reduction == "hierarchical" or (reduction == "auto" and spans):
        host, peer = make_host_groups(ctx.world_size, lws, ctx.rank,
                                      getattr(ctx, "collective_timeout_s", None))
        hook = hierarchical_allreduce_hook(stats, precision, host, peer, lws, ctx.world_size)
    else:
        hook = counting_allreduce_hook(stats, precision, spans)
    ddp.register_comm_hook(None, hook)
    model.dense_arch = ddp
    return model
