"""Data-parallel helpers for :class:`~recscale.optim.HessianFree` on torch.distributed.

Every rank holds the full parameters, computes loss, gradient and curvature products on its shard
of each batch, and all-reduces (sum) each one; with closures that return the rank's share of the
global objective (``sum of its examples' losses / global batch size``) the reduced values equal
the single-process ones and every rank takes the identical step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor


def all_reduce_sum(group: Any = None) -> Callable[[Tensor], Tensor]:
    """``reduce`` for HessianFree: one ``all_reduce(SUM)`` on the default (or given) group."""
    import torch.distributed as dist

    def reduce(t: Tensor) -> Tensor:
        t = t.contiguous()
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        return t

    return reduce


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Contiguous ``[lo, hi)`` share of n items for ``rank``; sizes differ by at most one."""
    return rank * n // world_size, (rank + 1) * n // world_size


def shard(indices: Tensor, rank: int, world_size: int) -> Tensor:
    lo, hi = shard_bounds(len(indices), rank, world_size)
    return indices[lo:hi]

