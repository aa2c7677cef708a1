"""Worker function for data-parallel HF training (importable at module level, as the launcher needs)."""

from __future__ import annotations

import torch

from recscale.distributed import WorkerContext, run_in_group, threads_for_run, worker_entry
from recscale.hf.loop import hf_loop
from recscale.optim import HessianFreeConfig, all_reduce_sum


@worker_entry
def hf_fit_worker(data: dict, net, hf: HessianFreeConfig, cfg):
    """Every rank runs the same loop on its shard of each batch; rank 0 returns the FitResult."""
    # under torchrun this is the caller's own process: its threads and memory go back after
    with threads_for_run(cfg.num_threads, cfg.launch.nproc_per_node):
        return run_in_group(cfg.launch, _fit, data, net, hf, cfg)


def _fit(ctx: WorkerContext, data: dict, net, hf: HessianFreeConfig, cfg):
    import torch.distributed as dist

    result = hf_loop(data, net, hf, cfg, rank=ctx.rank, world_size=ctx.world_size,
                     reduce=all_reduce_sum())
    # every rank must hold the same parameters: check once at the end (cheap)
    flat = torch.cat([p.reshape(-1) for p in result.state_dict.values()]).double()
    spread = flat.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    low = flat.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    result.summary["rank_param_spread"] = float((spread - low).abs().max())
    return result if ctx.rank == 0 else None
