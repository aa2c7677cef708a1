"""Optimizers: distributed Hessian-free (truncated Newton) with negative-curvature steps.

No Kedro or MLflow here. ``HessianFree`` is a ``torch.optim.Optimizer`` driven by closures
(curvature products in ``curvature.py``, CG and Bi-CG-STAB in ``solvers.py``, data-parallel
reductions in ``distributed.py``). Its users: the DLRM's dense arch (``recscale.train.hf_step``)
and the MNIST / spoken-digit application (``recscale.hf``).
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
