"""Workers for the hierarchical-collective tests: 4 gloo ranks on one machine, run under plans
for 2 hosts x 2 ranks (the plan's topology, not the launcher, says where the hosts are)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from recscale.comm import CommsConfig
from recscale.comm.collectives import CommStats
from recscale.config import parse
from recscale.data.batch import Batch, SparseFeatures
from recscale.distributed import LaunchConfig, WorkerContext, run_in_group, worker_entry
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.sharding import ShardingPlan, TableSpec, Topology, plan_sharding
from recscale.train.runtime import build_sharded_model
from recscale.train.step import ShardedStep, make_dense_optimizer
from tests.distributed import workers as W

WORLD, LOCAL = 4, 2


def layout4(kind: str, rows: int, home: int, dim: int = W.DIM):
    """Hand-made shards of one table for 4 ranks = 2 plan hosts x 2 (deliberately permuted).
    ``home``: the rank of a table-wise table, the host of a host-bound one."""
    s = W.shard
    if kind == "table_wise":
        return (s(home, 0, rows, 0, dim),)
    if kind == "row_wise":
        block = -(-rows // 4)
        return tuple(s(r, i * block, min(block, rows - i * block), 0, dim)
                     for i, r in enumerate((3, 1, 0, 2)))
    if kind == "column_wise":  # fbgemm wants widths in multiples of 4: 4 shards from dim 16
        holders = (2, 0, 3, 1) if dim % 16 == 0 else (2, 1)
        w = dim // len(holders)
        return tuple(s(r, 0, rows, i * w, w) for i, r in enumerate(holders))
    if kind == "table_row_wise":
        block = -(-rows // 2)
        return (s(2 * home + 1, 0, block, 0, dim), s(2 * home, block, rows - block, 0, dim))
    if kind == "table_column_wise":
        return (s(2 * home + 1, 0, rows, 0, dim // 2), s(2 * home, 0, rows, dim // 2, dim // 2))
    if kind == "data_parallel":
        return tuple(s(r, 0, rows, 0, dim) for r in range(4))
    raise ValueError(kind)


def plan4(kinds, homes, rows=W.ROWS, dim: int = W.DIM, batch: int = 16,
          pooling: float | None = None) -> ShardingPlan:
    """A plan for 2 hosts x 2 ranks with the given sharding type and home of every table."""
    feats = tuple(f"f{i}" for i in range(len(rows)))
    base = plan_sharding([TableSpec(f"t{i}", r, dim, feature_names=(f,))
                          for i, (r, f) in enumerate(zip(rows, feats))],
                         Topology.preset("cpu-local", world_size=WORLD, local_world_size=LOCAL),
                         batch)
    tables = []
    for tp, kind, home in zip(base.tables, kinds, homes):
        extra = {} if pooling is None else {"pooling_factor": float(pooling)}
        tables.append(dataclasses.replace(tp, sharding_type=kind,
                                          shards=layout4(kind, tp.num_embeddings, home, dim),
                                          **extra))
    return dataclasses.replace(base, tables=tuple(tables))


def _train_cfg(optimizer: str, **extra) -> TrainConfig:
    return parse(TrainConfig, {"embedding_optimizer": {"name": optimizer, "learning_rate": 0.2},
                               "dense_optimizer": {"name": "sgd", "learning_rate": 0.1},
                               "seed": 3, **extra}, "train")


@worker_entry
def hier_parity_worker(scenarios: list[dict], steps: list[list[dict]]) -> dict:
    """Like workers.parity_worker, for 4 ranks; plan, wire precisions (``comms``) and train
    settings (``train``) given per scenario."""
    return run_in_group(LaunchConfig(collective_timeout_s=60), _hier_parity, scenarios, steps,
                        device="cpu")


def _hier_parity(ctx: WorkerContext, scenarios: list[dict], steps: list[list[dict]]) -> dict:
    import torch.distributed as dist

    out = {}
    all_steps = steps
    for sc in scenarios:
        steps = sc.get("steps", all_steps)
        tcfg = _train_cfg(sc["optimizer"], **sc.get("train", {}))
        stats = CommStats()
        comms = CommsConfig(**sc.get("comms", {}))
        model = build_sharded_model(ctx, ShardingPlan.from_dict(sc["plan"]),
                                    parse(ModelConfig, W.MODEL, "model"), tcfg, stats, comms,
                                    feature_names=W.FEATURES, num_dense=W.NUM_DENSE)
        first = W.to_batch(steps[0][ctx.rank])
        with torch.no_grad():
            pooled = model.embeddings(first.sparse)
        gathered = [None] * ctx.world_size
        dist.all_gather_object(gathered, pooled.numpy())
        stats.reset()
        step = ShardedStep(model, make_dense_optimizer(model.dense_parameters(),
                                                       tcfg.dense_optimizer), ctx.world_size)
        if sc.get("pipelined"):  # as the loop's pipelined policy: batch i+1 starts first
            emb = model.embeddings
            emb.overlap_output = True
            batches = [W.to_batch(parts[ctx.rank]) for parts in steps]
            started = emb.start(batches[0].sparse)
            for i, batch in enumerate(batches):
                nxt = emb.start(batches[i + 1].sparse) if i + 1 < len(batches) else None
                step(batch, started)
                started = nxt
        else:
            for parts in steps:
                step(W.to_batch(parts[ctx.rank]))
        tables = model.embeddings.full_tables(dst=0)
        snaps = [None] * ctx.world_size
        dist.all_gather_object(snaps, stats.snapshot())
        if ctx.rank == 0:
            out[sc["name"]] = {
                "pooled": np.concatenate(gathered),
                "tables": [t.numpy() for t in tables[0]],
                "dense": {k: v.detach().numpy() for k, v in model.dense.state_dict().items()},
                "bytes": snaps,
            }
        del model, step
    return out


# --- bytes ---------------------------------------------------------------------------------------
BYTES_ROWS, BYTES_DIM, BYTES_POOL, BYTES_B = 64, 8, 4, 6


def even_batch(rank: int, step: int) -> Batch:
    """BYTES_B samples of one feature, each with one id in every quarter of the table (so every
    row block gets exactly its share of the ids, as the estimate assumes)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    q = BYTES_ROWS // BYTES_POOL
    ids = (torch.arange(BYTES_POOL) * q).repeat(BYTES_B) + torch.randint(
        0, q, (BYTES_B * BYTES_POOL,), generator=g)
    lengths = torch.full((1, BYTES_B), BYTES_POOL, dtype=torch.int64)
    return Batch(torch.randn(BYTES_B, W.NUM_DENSE, generator=g),
                 SparseFeatures(("f0",), ids, lengths),
                 torch.randint(0, 2, (BYTES_B,), generator=g).float(), torch.arange(BYTES_B))


def bytes_plan(kind: str, home: int = 1) -> ShardingPlan:
    return plan4([kind], [home], rows=(BYTES_ROWS,), dim=BYTES_DIM, batch=BYTES_B,
                 pooling=BYTES_POOL)


@worker_entry
def bytes_worker(kinds: list[str], steps: int) -> dict:
    """Per kind: every rank's CommStats snapshot after ``steps`` training steps on even
    batches of one table sharded as that kind."""
    return run_in_group(LaunchConfig(collective_timeout_s=60), _bytes, kinds, steps,
                        device="cpu")


def _bytes(ctx: WorkerContext, kinds: list[str], steps: int) -> dict:
    import torch.distributed as dist

    model_cfg = parse(ModelConfig, {"embedding_dim": BYTES_DIM, "bottom_mlp": [8, BYTES_DIM],
                                    "top_mlp": [8, 1]}, "model")
    out = {}
    for kind in kinds:
        tcfg = _train_cfg("exact_sgd")
        stats = CommStats()
        model = build_sharded_model(ctx, bytes_plan(kind), model_cfg, tcfg, stats,
                                    feature_names=("f0",), num_dense=W.NUM_DENSE)
        step = ShardedStep(model, make_dense_optimizer(model.dense_parameters(),
                                                       tcfg.dense_optimizer), ctx.world_size)
        for i in range(steps):
            step(even_batch(ctx.rank, i))
        snaps = [None] * ctx.world_size
        dist.all_gather_object(snaps, stats.snapshot())
        out[kind] = snaps
        del model, step
    return out
