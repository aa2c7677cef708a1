"""Optimizers: distributed Hessian-free (truncated Newton) with negative-curvature steps.

No Kedro or MLflow here. ``HessianFree`` is a ``torch.optim.Optimizer`` driven by closures;
``recscale.optim.trainer`` trains fully connected classifiers with it (1 or more ranks) and with
SGD/Adam baselines on the same data.
"""

from recscale.optim.config import HessianFreeConfig
from recscale.optim.curvature import (
    empirical_fisher_diagonal,
    flatten,
    gauss_newton_operator,
    gnvp,
    hessian_operator,
    hvp,
    unflatten,
)
from recscale.optim.distributed import all_reduce_sum, shard, shard_bounds
from recscale.optim.hessian_free import HessianFree, StepInfo
from recscale.optim.solvers import SolveResult, backtrack_schedule, bicgstab, conjugate_gradient

__all__ = [
    "HessianFree",
    "HessianFreeConfig",
    "SolveResult",
    "StepInfo",
    "all_reduce_sum",
    "backtrack_schedule",
    "bicgstab",
    "conjugate_gradient",
    "empirical_fisher_diagonal",
    "flatten",
    "gauss_newton_operator",
    "gnvp",
    "hessian_operator",
    "hvp",
    "shard",
    "shard_bounds",
    "unflatten",
]
