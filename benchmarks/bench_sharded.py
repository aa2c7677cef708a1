"""Sharded training throughput: 2 ranks (one thread each) vs 1 rank using both cores, same global
batch, same pre-generated data, per sharding type; and the bytes the collectives counted per step
against the planner's estimate. Both sides train through recscale's one training loop (the
default, pipelined overlap policy).

    python benchmarks/bench_sharded.py                       # kaggle-small, every sharding type
    python benchmarks/bench_sharded.py --kinds table_wise planner --steps 20 --reps 3
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import numpy as np
import torch

from loop_timing import run_steps  # this folder
from recscale.config import parse
from recscale.data.batch import Batch, SparseFeatures
from recscale.distributed import LaunchConfig, WorkerContext, launch, run_in_group, worker_entry
from recscale.embedding import EmbeddingOptimizerConfig
from recscale.model import ModelConfig, build_dlrm
from recscale.runconfig import TrainConfig
from recscale.sharding import TableSpec, Topology, plan_sharding
from recscale.sharding.traffic import estimate_comm_bytes
from recscale.train.runtime import LocalRuntime, ShardedRuntime

KINDS = ["table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise",
         "data_parallel", "planner"]
CONFIGS = {
    "kaggle-small": dict(tables=[100_000] * 8, dim=16, bottom=[512, 256, 64, 16], top=[512, 256, 1],
                         batch=2048),
    # communication-heavy variant: wide embeddings
    "kaggle-small-d128": dict(tables=[100_000] * 8, dim=128, bottom=[512, 256, 128],
                              top=[512, 256, 1], batch=2048),
}
FEATURES = tuple(f"f{i}" for i in range(8))
NUM_DENSE = 13  # dense inputs of the synthetic batches (Criteo's count)


def make_batches(cfg, n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = cfg["batch"]
        ids = np.concatenate([np.minimum(rng.zipf(1.2, size=b) - 1, r - 1) for r in cfg["tables"]])
        out.append({"dense": rng.normal(size=(b, NUM_DENSE)).astype(np.float32),
                    "values": ids.astype(np.int64),
                    "lengths": np.ones((len(cfg["tables"]), b), dtype=np.int64),
                    "labels": rng.integers(0, 2, b).astype(np.float32)})
    return out


def part(g, rank, world):
    """Rank's contiguous share of a global batch (one id per table per sample)."""
    b = g["dense"].shape[0]
    lo, hi = rank * b // world, (rank + 1) * b // world
    t = g["lengths"].shape[0]
    vals = g["values"].reshape(t, b)[:, lo:hi].reshape(-1)
    return Batch(torch.from_numpy(g["dense"][lo:hi]),
                 SparseFeatures(FEATURES, torch.from_numpy(np.ascontiguousarray(vals)),
                                torch.from_numpy(np.ascontiguousarray(g["lengths"][:, lo:hi]))),
                 torch.from_numpy(g["labels"][lo:hi]), torch.arange(hi - lo))


def make_plan(cfg, kind, world):
    cons = None if kind == "planner" else {"sharding_types": [kind]}
    tables = [TableSpec(f"t{i}", r, cfg["dim"], feature_names=(f,), constraints=cons)
              for i, (r, f) in enumerate(zip(cfg["tables"], FEATURES))]
    return plan_sharding(tables, Topology.preset("cpu-local", world_size=world),
                         cfg["batch"] // world, {"optimizer": "exact_sgd", "min_column_width": 4})


def model_cfg(cfg):
    return parse(ModelConfig, {"embedding_dim": cfg["dim"], "bottom_mlp": cfg["bottom"],
                               "top_mlp": cfg["top"]}, "model")


# a CPU benchmark (ranks x threads on cores), also on a machine that has a GPU
TCFG = {"embedding_optimizer": {"name": "exact_sgd", "learning_rate": 0.05},
        "dense_optimizer": {"name": "sgd", "learning_rate": 0.05}, "num_threads": 1,
        "device": "cpu"}
LOOP = {"progress": "off", "log_every": 10**9, "checkpoint": {"dir": None}}


def timed(rt, tcfg, batches, steps, reps, warmup=3, barrier=None):
    """Seconds of each of ``reps`` runs of ``steps`` loop steps (after ``warmup`` steps), and the
    last run's result (its bytes and communication seconds)."""
    run_steps(rt, batches, warmup, tcfg)
    secs, res = [], None
    for r in range(reps):
        if barrier:
            barrier()
        t0 = time.perf_counter()
        res = run_steps(rt, batches, steps, tcfg, start=r * steps)
        if barrier:
            barrier()
        secs.append(time.perf_counter() - t0)
    return secs, res


@worker_entry
def bench_worker(cfg, kind, globals_, steps, reps):
    return run_in_group(LaunchConfig(), _bench, cfg, kind, globals_, steps, reps)


def _bench(ctx: WorkerContext, cfg, kind, globals_, steps, reps):
    import torch.distributed as dist

    tcfg = parse(TrainConfig, {**TCFG, **LOOP, "launch": {"world_size": 2}}, "train")
    torch.set_num_threads(1)
    plan = make_plan(cfg, kind, ctx.world_size)
    rt = ShardedRuntime(ctx, plan, model_cfg(cfg), tcfg, feature_names=FEATURES,
                        num_dense=NUM_DENSE)
    batches = [part(g, ctx.rank, ctx.world_size) for g in globals_]
    secs, last = timed(rt, tcfg, batches, steps, reps, barrier=dist.barrier)
    return {"seconds": secs, "bytes": last.bytes_per_step,
            "comm_s": {"all": last.comm_seconds / max(last.steps, 1)},
            "types": sorted({t.sharding_type for t in plan.tables}),
            "shards": sum(len(t.shards) for t in plan.tables),
            "estimate": estimate_comm_bytes(plan, lengths_bytes=8)}


def one_rank(cfg, globals_, steps, reps):
    torch.set_num_threads(2)
    tcfg = parse(TrainConfig, {**TCFG, **LOOP}, "train")
    model = build_dlrm(model_cfg(cfg), cfg["tables"], NUM_DENSE,
                       EmbeddingOptimizerConfig("exact_sgd", 0.05))
    batches = [part(g, 0, 1) for g in globals_]
    return timed(LocalRuntime(model, tcfg, torch.device("cpu")), tcfg, batches, steps, reps)[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="kaggle-small", choices=list(CONFIGS))
    ap.add_argument("--kinds", nargs="+", default=KINDS, choices=KINDS)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    cfg = CONFIGS[args.config]
    globals_ = make_batches(cfg, 8)
    gb = cfg["batch"]
    base = statistics.median(args.steps * gb / s for s in one_rank(cfg, globals_, args.steps, args.reps))
    print(f"{args.config}: global batch {gb}; 1 rank x 2 threads: {base:,.0f} samples/s\n")
    print("| sharding | types | shards | 2 ranks x 1 thread (samples/s) | vs 1 rank | comm ms/step "
          "| bytes/step measured | planner estimate | measured/estimate |")
    print("|---|---|---|---|---|---|---|---|---|")
    launch_cfg = LaunchConfig(world_size=2)
    rows = []
    for kind in args.kinds:
        res = launch(bench_worker, (cfg, kind, globals_, args.steps, args.reps), launch_cfg)
        secs = [max(r["seconds"][i] for r in res.values()) for i in range(args.reps)]
        rate = statistics.median(args.steps * gb / s for s in secs)
        emb_bytes = sum(v for r in res.values() for k, v in r["bytes"].items()
                        if k not in ("dense_allreduce", "dense_reduce_scatter",
                                     "dense_all_gather", "intra_host", "inter_host"))
        comm_ms = 1e3 * max(sum(r["comm_s"].values()) for r in res.values())
        est = res[0]["estimate"]
        est_total = est["input"] + est["output"] + est["output_grad"]
        ratio = emb_bytes / est_total if est_total else float("nan")
        rows.append(dataclasses.asdict(Row(kind, rate, rate / base, emb_bytes, est_total)))
        print(f"| {kind} | {','.join(res[0]['types'])} | {res[0]['shards']} | {rate:,.0f} | "
              f"{rate / base:.2f}x | {comm_ms:.1f} | {emb_bytes / 1e6:.2f} MB | "
              f"{est_total / 1e6:.2f} MB | {ratio:.2f} |")
    print(f"\nmedian of {args.reps} x {args.steps} steps; bytes: embedding collectives summed over "
          "ranks (dense all-reduce excluded; data-parallel tables all-gather ids and gradients, "
          "which the planner costs as a table all-reduce instead)\n"
          f"command: python benchmarks/bench_sharded.py {' '.join(sys.argv[1:])}".rstrip())
    return rows


@dataclasses.dataclass
class Row:
    kind: str
    samples_per_s: float
    vs_one_rank: float
    bytes_per_step: float
    estimate: float


if __name__ == "__main__":
    main()
