"""Worker function for data-parallel HF training (importable at module level for spawn)."""

from __future__ import annotations

import torch

from recscale.config import parse
from recscale.optim.config import HessianFreeConfig
from recscale.optim.distributed import all_reduce_sum
from recscale.train.config import TrainConfig
from recscale.train.launch import init_worker, worker_entry


@worker_entry
def hf_fit_worker(data: dict, net, hf: HessianFreeConfig, cfg):
    """Every rank runs the same loop on its shard of each batch; rank 0 returns the FitResult."""
    import torch.distributed as dist

    from recscale.optim.trainer import _threads, hf_loop

    _threads(cfg)
    ctx = init_worker(parse(TrainConfig, {"collective_timeout_s": cfg.collective_timeout_s,
                                          "device": "cpu"}, "train"))
    try:
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
    finally:
        dist.destroy_process_group()
