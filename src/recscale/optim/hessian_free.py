"""Hessian-free (truncated-Newton) optimizer: Martens (2010) plus negative-curvature steps.

One ``step`` does:

1. loss and gradient g on the gradient batch (``closure``);
2. a curvature operator B on the curvature batch (``curvature_closure``; default: the gradient
   batch): Gauss-Newton ``J' H_L J`` or the exact Hessian;
3. solve ``(B + lambda I) p = -g`` with preconditioned CG (Martens' stopping rule, warm start
   from the decayed previous direction, shrunk to the model's minimum along it when it is no
   better than 0) or Bi-CG-STAB; when a direction d with ``d' (B + lambda I) d <= 0`` turns up
   the solver stops there;
4. candidates: the CG iterate (after CG-iterate backtracking over iterates 1.3^j) and, if one was
   found, the direction of negative curvature signed to descend and scaled by its curvature; each
   goes through an Armijo backtracking line search and the lower loss wins;
5. Levenberg-Marquardt: lambda x 3/2 when the reduction ratio rho < 1/4 (or no step was taken),
   x 2/3 when rho > 3/4.

Closures re-evaluate the objective at the current parameters and return the loss tensor, or a
``(loss, outputs)`` pair (needed for Gauss-Newton: ``outputs`` are what the loss is convex in,
e.g. logits). They must not call ``backward``: the optimizer differentiates what they return.

Data parallel: pass ``reduce`` (e.g. :func:`recscale.optim.distributed.all_reduce_sum`) and let
each rank's closures return its share of the global objective (the sum of its examples' losses
divided by the global batch size). Gradient+loss, every curvature product, the Fisher diagonal and
each loss evaluation are one all-reduce each; every scalar the algorithm branches on derives from
the reduced vectors, so all ranks take the identical step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from recscale.config import parse, to_dict
from recscale.optim.config import HessianFreeConfig
from recscale.optim.curvature import flatten, gauss_newton_operator, hessian_operator, unflatten
from recscale.optim.solvers import SolveResult, backtrack_schedule, bicgstab, conjugate_gradient

Closure = Callable[[], Any]


@dataclass
class StepInfo:
    """What one HF step did (``HessianFree.last_step``; also returned by ``step_info``)."""

    loss: float  # objective on the gradient batch before the step
    new_loss: float  # ... after it (== loss when the step was rejected)
    grad_norm: float
    damping: float  # lambda used in this step
    next_damping: float  # lambda after the Levenberg-Marquardt update
    rho: float  # reduction ratio (actual / predicted by the undamped quadratic model)
    cg_iters: int
    products: int  # curvature-vector products
    loss_evals: int  # extra objective evaluations (backtracking + line search)
    stop_reason: str
    negative_curvature: bool  # the solver met a direction of non-positive curvature
    took_negative_curvature: bool  # ... and the step followed it
    alpha: float  # line-search step length (0 = rejected)
    step_norm: float
    accepted: bool
    backtrack_iteration: int  # CG iteration of the iterate taken (0 if none)


def _split(out: Any) -> tuple[Tensor, Tensor | None]:
    if isinstance(out, (tuple, list)):
        return out[0], (out[1] if len(out) > 1 else None)
    return out, None


class HessianFree(Optimizer):
    """Truncated-Newton optimizer over one parameter group; see the module docstring.

    ``HessianFree(model.parameters(), curvature="gn", damping=1.0)``; keyword overrides are
    fields of :class:`HessianFreeConfig`. ``step(closure, curvature_closure=None,
    fisher_diagonal=None)`` returns the loss before the step; ``last_step`` holds a
    :class:`StepInfo`. ``fisher_diagonal`` (needed with ``preconditioner="fisher"``) returns this
    rank's share of the empirical Fisher diagonal, one tensor per parameter.
    """

    def __init__(self, params, config: HessianFreeConfig | None = None, *,
                 reduce: Callable[[Tensor], Tensor] | None = None, **overrides):
        cfg = config or HessianFreeConfig()
        if overrides:  # checked like parameters, named hessian_free.<key>
            cfg = parse(HessianFreeConfig, {**to_dict(cfg), **overrides}, "hessian_free")
        super().__init__(params, {"damping": cfg.damping, "steps": 0,
                                  "negative_curvature_events": 0,
                                  "negative_curvature_steps": 0, "rejected_steps": 0})
        if len(self.param_groups) != 1:
            raise ValueError("HessianFree supports one parameter group")
        self.config = cfg
        self.reduce = reduce
        self.last_step: StepInfo | None = None

    # ------------------------------------------------------------------ small helpers
    @property
    def damping(self) -> float:
        return self.param_groups[0]["damping"]

    @damping.setter
    def damping(self, value: float) -> None:
        self.param_groups[0]["damping"] = float(value)

    @property
    def negative_curvature_events(self) -> int:
        return self.param_groups[0]["negative_curvature_events"]

    def _params(self) -> list[Tensor]:
        return [p for p in self.param_groups[0]["params"] if p.requires_grad]

    def _reduce(self, t: Tensor) -> Tensor:
        return self.reduce(t) if self.reduce is not None else t

    def _loss_at(self, closure: Closure) -> float:
        with torch.no_grad():
            loss, _ = _split(closure())
            return float(self._reduce(loss.detach().reshape(1).clone())[0])

    def _set(self, params: list[Tensor], flat: Tensor) -> None:
        with torch.no_grad():
            for p, v in zip(params, unflatten(flat, params)):
                p.copy_(v)

    # ------------------------------------------------------------------------- the step
    def step(self, closure: Closure, curvature_closure: Closure | None = None,
             fisher_diagonal: Callable[[], Sequence[Tensor]] | None = None) -> float:
        cfg = self.config
        group = self.param_groups[0]
        params = self._params()
        lam = self.damping

        # 1. loss and gradient (one all-reduce for both)
        with torch.enable_grad():
            loss_t, out_t = _split(closure())
            # without a curvature batch the gradient batch's graph is reused for the products
            grads = torch.autograd.grad(loss_t, params, allow_unused=True,
                                        retain_graph=curvature_closure is None)
        packed = self._reduce(torch.cat([flatten(grads, params).detach(),
                                         loss_t.detach().reshape(1)]))
        g, f0 = packed[:-1], float(packed[-1])
        gnorm = float(g.norm())
        theta0 = flatten([p.detach() for p in params]).clone()

        # 2. curvature operator on the curvature batch (graph kept for the whole solve)
        with torch.enable_grad():
            if curvature_closure is None:
                c_loss, c_out = loss_t, out_t
            else:
                c_loss, c_out = _split(curvature_closure())
            if cfg.curvature == "gn":
                if c_out is None:
                    raise ValueError("curvature='gn' needs the closure to return (loss, outputs)")
                curv = gauss_newton_operator(c_loss, c_out, params, self.reduce)
            else:
                curv = hessian_operator(c_loss, params, self.reduce)
        products = 0

        def damped(v: Tensor) -> Tensor:
            nonlocal products
            products += 1
            return curv(v) + lam * v

        precond = None
        if cfg.preconditioner == "fisher":
            if fisher_diagonal is None:
                raise ValueError("preconditioner='fisher' needs step(..., fisher_diagonal=fn)")
            diag = self._reduce(flatten([t.detach() for t in fisher_diagonal()], params))
            precond = (diag + lam) ** cfg.preconditioner_power

        # 3. solve, warm-started from the decayed previous direction
        x0 = None
        if cfg.warm_start_decay > 0 and all("direction" in self.state[p] for p in params):
            x0 = cfg.warm_start_decay * flatten([self.state[p]["direction"] for p in params])
        save = backtrack_schedule(cfg.cg_max_iters, cfg.backtrack_base) if cfg.backtracking else set()
        # Gauss-Newton + lambda I is positive definite: p'Ap <= 0 there is rounding, not a
        # direction worth following, so CG just stops at the iterate reached (a breakdown)
        follow_nc = cfg.negative_curvature and cfg.curvature == "hessian"
        if gnorm == 0.0 or not math.isfinite(gnorm):
            res = None
        elif cfg.solver == "cg":
            res = conjugate_gradient(damped, -g, x0, precond=precond, max_iters=cfg.cg_max_iters,
                                     min_iters=cfg.cg_min_iters, progress_tol=cfg.cg_tol,
                                     residual_tol=cfg.cg_residual_tol,
                                     stop_on_negative_curvature=follow_nc, save=save)
        else:
            res = bicgstab(damped, -g, x0, precond=precond, max_iters=cfg.cg_max_iters,
                           tol=cfg.cg_tol, stop_on_negative_curvature=follow_nc,
                           save=save)

        info = self._take_step(closure, params, theta0, g, f0, gnorm, lam, res)
        info.products = products
        # keep the solver's last iterate for the next warm start
        if res is not None:
            for p, d in zip(params, unflatten(res.x.clone(), params)):
                self.state[p]["direction"] = d
        # 4. Levenberg-Marquardt
        if not info.accepted or info.rho < cfg.rho_low:
            lam = lam * cfg.damping_boost
        elif info.rho > cfg.rho_high:
            lam = lam * cfg.damping_drop
        self.damping = min(max(lam, cfg.damping_min), cfg.damping_max)
        info.next_damping = self.damping
        group["steps"] += 1
        group["negative_curvature_events"] += int(info.negative_curvature)
        group["negative_curvature_steps"] += int(info.took_negative_curvature)
        group["rejected_steps"] += int(not info.accepted)
        self.last_step = info
        return f0

    def _take_step(self, closure: Closure, params: list[Tensor], theta0: Tensor, g: Tensor,
                   f0: float, gnorm: float, lam: float, res: SolveResult | None) -> StepInfo:
        cfg = self.config
        evals = 0

        def f_at(direction: Tensor, alpha: float) -> float:
            nonlocal evals
            evals += 1
            self._set(params, theta0 + alpha * direction)
            return self._loss_at(closure)

        def clip(d: Tensor) -> Tensor:
            if cfg.max_step_norm is not None:
                n = float(d.norm())
                if n > cfg.max_step_norm:
                    return d * (cfg.max_step_norm / n)
            return d

        def line_search(d: Tensor, f1: float | None) -> tuple[float, float]:
            """Armijo backtracking from alpha=1 (f1: the loss at alpha=1, if known)."""
            slope = float(torch.dot(g, d))
            alpha = 1.0
            for trial in range(cfg.line_search_max + 1):
                f = f1 if (trial == 0 and f1 is not None) else f_at(d, alpha)
                if math.isfinite(f) and f <= f0 + cfg.armijo_c * alpha * min(slope, 0.0) and f < f0:
                    return alpha, f
                alpha *= cfg.line_search_shrink
            return 0.0, f0

        base = dict(loss=f0, grad_norm=gnorm, damping=lam, next_damping=lam, products=0,
                    negative_curvature=False, took_negative_curvature=False)
        if res is None:
            return StepInfo(**base, new_loss=f0, rho=0.0, cg_iters=0, loss_evals=0,
                            stop_reason="zero_gradient", alpha=0.0, step_norm=0.0, accepted=False,
                            backtrack_iteration=0)

        candidates = []  # (f after line search, alpha, direction, dBd, f at alpha=1, kind, iter)
        # CG iterate, with backtracking: walk back from the last saved iterate while the loss falls
        # (an earlier iterate must be better by more than rounding noise: ranks whose partial
        # sums round differently must not pick different iterates on a near tie. In float64 the
        # noise is not one sum's: the parameters of 1 and 2 ranks drift apart in their last bits
        # step by step (8e-13 after 3 steps of the parity test), and their iterates' losses by
        # 1e-12 relative, so a gain under 1e-10 of the loss counts as a tie)
        tie = max(1e3 * torch.finfo(g.dtype).eps, 1e-10) * max(abs(f0), 1e-30)
        its = [it for it in res.iterates if bool(torch.any(it.x != 0))]
        if its:
            best = its[-1]
            best_f = f_at(clip(best.x), 1.0)
            if cfg.backtracking:
                for it in reversed(its[:-1]):
                    f = f_at(clip(it.x), 1.0)
                    if math.isfinite(best_f) and not (f < best_f - tie):
                        break
                    best, best_f = it, f
            d = clip(best.x)
            shrink = float(d.norm()) / max(float(best.x.norm()), 1e-300)
            dBd = (best.xAx - lam * float(torch.dot(best.x, best.x))) * shrink**2
            if float(torch.dot(g, d)) < 0:
                alpha, f = line_search(d, best_f)
                candidates.append((f, alpha, d, dBd, best_f, "iterate", best.iteration))
        # direction of negative curvature, signed to descend, length = |curvature| along it
        if res.hit_negative_curvature:
            p = res.negative_direction
            pn = float(p.norm())
            curv_b = res.negative_curvature - lam  # undamped Rayleigh quotient p'Bp/p'p
            if pn > 0 and math.isfinite(curv_b):
                sign = -1.0 if float(torch.dot(g, p)) > 0 else 1.0
                d = clip(p * (sign * abs(curv_b) / pn))
                dBd = curv_b * float(torch.dot(d, d))
                f1 = f_at(d, 1.0)
                alpha, f = line_search(d, f1)
                candidates.append((f, alpha, d, dBd, f1, "negative_curvature", res.iterations))
        ok = [c for c in candidates if c[1] > 0]
        if not ok:
            self._set(params, theta0)
            return StepInfo(**{**base, "negative_curvature": res.hit_negative_curvature},
                            new_loss=f0, rho=-math.inf, cg_iters=res.iterations, loss_evals=evals,
                            stop_reason=res.stop_reason, alpha=0.0, step_norm=0.0, accepted=False,
                            backtrack_iteration=0)
        f_new, alpha, d, dBd, f1, kind, it = min(ok, key=lambda c: c[0])
        self._set(params, theta0 + alpha * d)
        # reduction ratio of the alpha=1 candidate against the undamped quadratic model
        q = float(torch.dot(g, d)) + 0.5 * dBd
        rho = (f1 - f0) / q if q < 0 and math.isfinite(f1) else -math.inf
        return StepInfo(**{**base, "negative_curvature": res.hit_negative_curvature,
                           "took_negative_curvature": kind == "negative_curvature"},
                        new_loss=f_new, rho=rho, cg_iters=res.iterations, loss_evals=evals,
                        stop_reason=res.stop_reason, alpha=alpha,
                        step_norm=alpha * float(d.norm()), accepted=True,
                        backtrack_iteration=it if kind == "iterate" else 0)
