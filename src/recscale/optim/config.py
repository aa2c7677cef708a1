"""Typed configuration of the Hessian-free optimizer (the ``optimizer`` block of parameters_hf.yml)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from recscale.config import Validated, check, check_choice

CURVATURES = ("gn", "hessian")
SOLVERS = ("cg", "bicgstab")
PRECONDITIONERS = ("none", "fisher")


@dataclass(frozen=True)
class HessianFreeConfig(Validated):
    """Settings of :class:`recscale.optim.HessianFree`; defaults follow Martens (ICML 2010).

    curvature: ``gn`` (Gauss-Newton, PSD for a loss convex in the outputs) or ``hessian`` (exact).
    solver: ``cg`` (preconditioned CG) or ``bicgstab`` (Bi-CG-STAB, for the indefinite Hessian).
    """

    curvature: Literal["gn", "hessian"] = "gn"
    solver: Literal["cg", "bicgstab"] = "cg"
    damping: float = 1.0  # initial Levenberg-Marquardt lambda
    damping_min: float = 1e-6
    damping_max: float = 1e6
    damping_boost: float = 1.5  # lambda x this when the reduction ratio < rho_low
    damping_drop: float = 2.0 / 3.0  # lambda x this when the reduction ratio > rho_high
    rho_low: float = 0.25
    rho_high: float = 0.75
    cg_max_iters: int = 100
    cg_min_iters: int = 1
    cg_tol: float = 5e-4  # Martens' relative-progress epsilon (cg); relative residual (bicgstab)
    cg_residual_tol: float = 1e-10  # cg also stops when ||r|| <= this x ||g||
    warm_start_decay: float = 0.95  # CG starts at this x the previous direction (0 = cold start)
    backtracking: bool = True  # CG-iterate backtracking over iterates 1.3^j
    backtrack_base: float = 1.3
    negative_curvature: bool = True  # follow directions of negative curvature CG meets (hessian;
    # Gauss-Newton + lambda I is PD, so there a p'Ap <= 0 is rounding and just ends CG)
    line_search_max: int = 20  # Armijo backtracking trials before the step is rejected
    line_search_shrink: float = 0.8
    armijo_c: float = 1e-2
    preconditioner: Literal["none", "fisher"] = "none"
    preconditioner_power: float = 0.75
    max_step_norm: float | None = None  # clip a step (e.g. a negative-curvature step) to this norm

    def validate(self, prefix: str = "optimizer") -> None:
        check_choice(f"{prefix}.curvature", self.curvature, CURVATURES)
        check_choice(f"{prefix}.solver", self.solver, SOLVERS)
        check(self.damping >= 0, f"{prefix}.damping", self.damping, ">= 0")
        check(self.damping_min >= 0, f"{prefix}.damping_min", self.damping_min, ">= 0")
        check(self.damping_max >= self.damping_min, f"{prefix}.damping_max", self.damping_max,
              f">= damping_min={self.damping_min}")
        check(self.damping_boost > 1, f"{prefix}.damping_boost", self.damping_boost, "> 1")
        check(0 < self.damping_drop < 1, f"{prefix}.damping_drop", self.damping_drop, "in (0, 1)")
        check(self.rho_low < self.rho_high, f"{prefix}.rho_low", self.rho_low,
              f"< rho_high={self.rho_high}")
        check(self.cg_max_iters >= 1, f"{prefix}.cg_max_iters", self.cg_max_iters, ">= 1")
        check(1 <= self.cg_min_iters <= self.cg_max_iters, f"{prefix}.cg_min_iters",
              self.cg_min_iters, f"in [1, cg_max_iters={self.cg_max_iters}]")
        check(self.cg_tol > 0, f"{prefix}.cg_tol", self.cg_tol, "> 0")
        check(self.cg_residual_tol >= 0, f"{prefix}.cg_residual_tol", self.cg_residual_tol, ">= 0")
        check(0 <= self.warm_start_decay <= 1, f"{prefix}.warm_start_decay",
              self.warm_start_decay, "in [0, 1]")
        check(self.backtrack_base > 1, f"{prefix}.backtrack_base", self.backtrack_base, "> 1")
        check(self.line_search_max >= 0, f"{prefix}.line_search_max", self.line_search_max, ">= 0")
        check(0 < self.line_search_shrink < 1, f"{prefix}.line_search_shrink",
              self.line_search_shrink, "in (0, 1)")
        check(0 < self.armijo_c < 1, f"{prefix}.armijo_c", self.armijo_c, "in (0, 1)")
        check_choice(f"{prefix}.preconditioner", self.preconditioner, PRECONDITIONERS)
        check(0 <= self.preconditioner_power <= 1, f"{prefix}.preconditioner_power",
              self.preconditioner_power, "in [0, 1]")
        check(self.max_step_norm is None or self.max_step_norm > 0, f"{prefix}.max_step_norm",
              self.max_step_norm, "null or > 0")
