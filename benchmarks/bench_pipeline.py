"""Pipelined vs plain sharded training at 2 ranks on a configuration where communication matters
(dim 128): with pipelining the next batch's input distribution (ids and lengths all-to-all) is in
flight while the current batch computes. Same data, same plan, one run; both through recscale's one
training loop, only its overlap policy (train.pipeline) differs.

    python benchmarks/bench_pipeline.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_sharded as bs  # noqa: E402
from loop_timing import run_steps  # noqa: E402
from recscale.config import parse  # noqa: E402
from recscale.distributed import (  # noqa: E402
    LaunchConfig,
    WorkerContext,
    launch,
    run_in_group,
    worker_entry,
)
from recscale.runconfig import TrainConfig  # noqa: E402
from recscale.train.runtime import ShardedRuntime  # noqa: E402


@worker_entry
def pipeline_worker(cfg, kind, globals_, steps, reps, pipelined):
    return run_in_group(LaunchConfig(), _pipeline, cfg, kind, globals_, steps, reps, pipelined)


def _pipeline(ctx: WorkerContext, cfg, kind, globals_, steps, reps, pipelined):
    import torch.distributed as dist

    # train.pipeline also switches the output all-to-all's overlap with the bottom MLP
    tcfg = parse(TrainConfig, {**bs.TCFG, **bs.LOOP, "launch": {"world_size": 2},
                               "pipeline": pipelined}, "train")
    torch.set_num_threads(1)
    rt = ShardedRuntime(ctx, bs.make_plan(cfg, kind, 2), bs.model_cfg(cfg), tcfg,
                        feature_names=bs.FEATURES, num_dense=bs.NUM_DENSE)
    batches = [bs.part(g, ctx.rank, 2) for g in globals_]
    times = []
    for rep in range(reps + 1):  # the first repetition warms up
        dist.barrier()
        t0 = time.perf_counter()
        run_steps(rt, batches, steps, tcfg)
        dist.barrier()
        if rep:
            times.append(time.perf_counter() - t0)
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", default="kaggle-small-d128", choices=list(bs.CONFIGS))
    ap.add_argument("--kind", default="table_wise", choices=bs.KINDS)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    cfg = bs.CONFIGS[args.config]
    globals_ = bs.make_batches(cfg, 8)
    launch_cfg = LaunchConfig(world_size=2)
    rates = {}
    for pipelined in (False, True):
        res = launch(pipeline_worker, (cfg, args.kind, globals_, args.steps, args.reps, pipelined),
                     launch_cfg)
        secs = [max(r[i] for r in res.values()) for i in range(args.reps)]
        rates[pipelined] = statistics.median(args.steps * cfg["batch"] / s for s in secs)
    print(f"{args.config}, {args.kind}, 2 ranks x 1 thread, global batch {cfg['batch']}:")
    print("| training loop | samples/s |\n|---|---|")
    print(f"| plain | {rates[False]:,.0f} |\n| pipelined | {rates[True]:,.0f} |")
    print(f"\npipelined / plain = {rates[True] / rates[False]:.2f}x (goal >= 1.2x); median of "
          f"{args.reps} x {args.steps} steps\ncommand: python benchmarks/bench_pipeline.py "
          f"{' '.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
