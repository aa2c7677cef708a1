"""Worker functions for the 2-rank Hessian-free tests (importable, so spawn can start them)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from recscale.distributed import LaunchConfig, WorkerContext, run_in_group, worker_entry
from recscale.optim import HessianFree, all_reduce_sum, empirical_fisher_diagonal, shard

SCENARIOS = {
    "gn_cg": dict(curvature="gn", solver="cg", damping=0.5),
    "gn_cg_fisher": dict(curvature="gn", solver="cg", damping=0.5, preconditioner="fisher"),
    "hessian_bicgstab": dict(curvature="hessian", solver="bicgstab", damping=0.5, cg_tol=1e-3),
}


def problem(seed: int = 0, n: int = 37):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = ((x[:, 0] * x[:, 1] > 0).long() + (x[:, 2] > 0.5).long())
    return x, y


def run_steps(scenario: str, rank: int, world: int, reduce, steps: int = 4,
              dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    """Flat parameters after each HF step; each rank holds its share of the same global batch
    (37 examples: uneven shards) and of the curvature batch (the first 20)."""
    x, y = problem()
    x = x.to(dtype)
    n, nc = len(x), 20
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 8),
                                torch.nn.Softplus(), torch.nn.Linear(8, 3)).to(dtype)
    opt = HessianFree(model.parameters(), reduce=reduce, cg_max_iters=25, **SCENARIOS[scenario])
    idx = shard(torch.arange(n), rank, world)
    cidx = shard(torch.arange(nc), rank, world)

    def closure():
        z = model(x[idx])
        return F.cross_entropy(z, y[idx], reduction="sum") / n, z

    def curvature():
        z = model(x[cidx])
        return F.cross_entropy(z, y[cidx], reduction="sum") / nc, z

    def fisher():
        return empirical_fisher_diagonal(model, F.cross_entropy, x[cidx], y[cidx], scale=1.0 / nc)

    out = []
    for _ in range(steps):
        opt.step(closure, curvature, fisher)
        out.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone())
    out.append(torch.tensor([opt.damping, opt.last_step.cg_iters, opt.negative_curvature_events],
                            dtype=torch.float64))
    return out


@worker_entry
def hf_parity_worker(runs: list[tuple[str, str]]) -> dict:
    """runs: (scenario, dtype name) pairs."""
    return run_in_group(LaunchConfig(collective_timeout_s=60), _hf_parity, runs)


def _hf_parity(ctx: WorkerContext, runs: list[tuple[str, str]]) -> dict:
    torch.set_num_threads(1)
    return {(s, d): run_steps(s, ctx.rank, ctx.world_size, all_reduce_sum(),
                              dtype=getattr(torch, d)) for s, d in runs}
