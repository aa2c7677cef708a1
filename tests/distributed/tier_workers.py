"""Workers for the tiered-shard tests: 2 gloo ranks, a plan with SSD and DDR shards vs the same
plan all in the compute tier (importable, so spawn can start them)."""

from __future__ import annotations

import dataclasses

import numpy as np

from recscale.comm.collectives import CommStats
from recscale.config import parse
from recscale.distributed import LaunchConfig, WorkerContext, run_in_group, worker_entry
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.sharding import ShardingPlan, TableSpec, Topology, plan_sharding
from recscale.train.runtime import build_sharded_model
from recscale.train.step import ShardedStep, make_dense_optimizer
from tests.distributed import workers as W

ROWS = (400, 250, 640, 330)
# a CPU "cluster" whose compute tier is HBM (plain memory here), with DDR and SSD below it
TOPOLOGY = Topology(world_size=2, local_world_size=2, hbm_bytes=1e9, ddr_bytes=1e10,
                    ssd_bytes=1e11, hbm_bw=1e11, ddr_bw=1e10, ssd_bw=1e9, intra_node_bw=1e9,
                    inter_node_bw=1e9, name="tiered-test", device="cpu")
# (sharding type, tier, cache fraction) per table: t0 on SSD, t2's row shards on DDR
LAYOUT = [("table_wise", "ssd", 0.2), ("table_wise", "hbm", 0.0), ("row_wise", "ddr", 0.2),
          ("column_wise", "hbm", 0.0)]


def make_batches(n: int, sizes=(24, 20), seed: int = 0) -> list[list[dict]]:
    """Steps of per-rank parts (uneven sizes), Zipf-distributed ids over scattered rows."""
    rng = np.random.default_rng(seed)
    perms = [rng.permutation(r) for r in ROWS]
    steps = []
    for _ in range(n):
        parts = []
        for b in sizes:
            lengths = rng.integers(0, 4, size=(len(ROWS), b))
            values = np.concatenate([perms[t][(rng.zipf(1.2, int(lengths[t].sum())) - 1) % r]
                                     for t, r in enumerate(ROWS)])
            parts.append({"dense": rng.normal(size=(b, W.NUM_DENSE)).astype(np.float32),
                          "lengths": lengths, "values": values,
                          "labels": rng.integers(0, 2, b).astype(np.float32)})
        steps.append(parts)
    return steps


def make_plan(tiered: bool) -> ShardingPlan:
    base = plan_sharding([TableSpec(f"t{i}", r, W.DIM, feature_names=(f,))
                          for i, (r, f) in enumerate(zip(ROWS, W.FEATURES))], TOPOLOGY, 16)
    tables = []
    for i, (tp, (kind, tier, cache)) in enumerate(zip(base.tables, LAYOUT)):
        st, shards = W.layout(kind, tp.num_embeddings, home=i % 2)
        if not tiered:
            tier, cache = "hbm", 0.0
        shards = tuple(dataclasses.replace(s, tier=tier, cache_fraction=cache) for s in shards)
        tables.append(dataclasses.replace(tp, sharding_type=st, shards=shards))
    return dataclasses.replace(base, tables=tuple(tables))


@worker_entry
def tiered_parity_worker(optimizers: list[str], steps: list[list[dict]], scratch: str) -> dict:
    """Per optimizer and plan (all-HBM, tiered): tables, dense weights and tier counters after
    pipelined training (the next batch's input dist started and prefetched every step)."""
    return run_in_group(LaunchConfig(collective_timeout_s=60), _tiered_parity, optimizers, steps,
                        scratch, device="auto")


def _tiered_parity(ctx: WorkerContext, optimizers: list[str], steps: list[list[dict]],
                   scratch: str) -> dict:
    import torch.distributed as dist

    out = {}
    for opt in optimizers:
        for tiered in (False, True):
            tcfg = parse(TrainConfig, {
                "embedding_optimizer": {"name": opt, "learning_rate": 0.2},
                "dense_optimizer": {"name": "sgd", "learning_rate": 0.1}, "seed": 3,
                "tiers": {"policy": "lfu" if opt == "exact_sgd" else "lru",
                          "min_cache_rows": 1, "scratch_dir": scratch}}, "train")
            model = build_sharded_model(ctx, make_plan(tiered), parse(ModelConfig, W.MODEL, "model"),
                                        tcfg, CommStats(), feature_names=W.FEATURES,
                                        num_dense=W.NUM_DENSE)
            emb = model.embeddings
            step = ShardedStep(model, make_dense_optimizer(model.dense_parameters(),
                                                           tcfg.dense_optimizer), ctx.world_size)
            batches = [W.to_batch(parts[ctx.rank]) for parts in steps]
            splits = []  # the multi-tier module's splits of its ids by tier group
            if tiered:
                real = emb.local._split
                emb.local._split = lambda s, real=real, n=splits: n.append(1) or real(s)
            started = emb.start(batches[0].sparse)
            for i, batch in enumerate(batches):
                nxt = None
                if i + 1 < len(batches):
                    nxt = emb.start(batches[i + 1].sparse)
                    emb.prefetch(nxt)
                step(batch, started)
                started = nxt
            stats = [None] * ctx.world_size
            dist.all_gather_object(stats, emb.tier_stats())
            mem = [None] * ctx.world_size
            dist.all_gather_object(mem, emb.memory_bytes()["fast"])
            n_splits = [None] * ctx.world_size
            dist.all_gather_object(n_splits, len(splits))
            tables = emb.full_tables(dst=0)
            if ctx.rank == 0:
                out[(opt, tiered)] = {
                    "tables": [t.numpy() for t in tables[0]],
                    "states": [[x.numpy() for x in st] for st in tables[1]],
                    "dense": {k: v.detach().numpy()
                              for k, v in model.dense.state_dict().items()},
                    "stats": stats, "embedding_bytes": mem,
                    "local_kinds": type(emb.local).__name__, "splits": n_splits,
                }
            if hasattr(emb.local, "close"):
                emb.local.close()
    return out
