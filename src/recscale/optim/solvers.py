"""Krylov solvers for the truncated-Newton system ``A x = b`` on flat vectors, using only ``A v``.

``conjugate_gradient``: preconditioned CG with Martens' relative-progress stopping rule, a warm
start, saved iterates for CG-iterate backtracking, and a stop on a direction of non-positive
curvature (``p' A p <= 0``), which it returns instead of dividing by it.

``bicgstab``: preconditioned Bi-CG-STAB, which converges on indefinite (non-SPD) systems such as a
damped Hessian near a saddle; it can report a direction of negative curvature the same way.

All scalars are computed from the vectors ``matvec`` returns, so ranks that all-reduce inside
``matvec`` run identical iterations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

Matvec = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Iterate:
    """A saved iterate: its iteration number, the vector, ``x' A x`` and the model value
    ``phi(x) = 1/2 x' A x - b' x``."""

    iteration: int
    x: torch.Tensor
    xAx: float
    phi: float


@dataclass
class SolveResult:
    x: torch.Tensor  # the last iterate
    iterations: int  # Krylov iterations run
    products: int  # matvecs used (incl. the warm start's)
    stop_reason: str  # martens | residual | max_iters | negative_curvature | breakdown
    residual_norm: float
    xAx: float
    phi: float
    iterates: list[Iterate] = field(default_factory=list)  # for backtracking, in order
    negative_direction: torch.Tensor | None = None  # p with p' A p <= 0, when one was met
    negative_curvature: float | None = None  # p' A p / p' p for that direction

    @property
    def hit_negative_curvature(self) -> bool:
        return self.negative_direction is not None


def backtrack_schedule(max_iters: int, base: float = 1.3) -> set[int]:
    """Iterations whose iterates are kept: ceil(base^j) (Martens 2010, section 4.6)."""
    keep, j = set(), 0
    while True:
        i = math.ceil(base**j)
        if i > max_iters:
            return keep
        keep.add(i)
        j += 1


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.dot(a.reshape(-1), b.reshape(-1)))


def conjugate_gradient(
    matvec: Matvec,
    b: torch.Tensor,
    x0: torch.Tensor | None = None,
    *,
    precond: torch.Tensor | None = None,
    max_iters: int = 250,
    min_iters: int = 1,
    progress_tol: float | None = 5e-4,
    residual_tol: float = 1e-10,
    stop_on_negative_curvature: bool = True,
    save: set[int] | None = None,
) -> SolveResult:
    """Preconditioned CG on ``A x = b``.

    precond: the diagonal M of the preconditioner (CG works with M^-1 r).
    progress_tol: Martens' rule: stop at iteration i > k = max(10, i/10) when phi(x_i) < 0 and
        (phi(x_i) - phi(x_{i-k})) / phi(x_i) < k * progress_tol. None: residual rule only.
    residual_tol: stop when ||r|| <= residual_tol * ||b||.
    stop_on_negative_curvature: stop when p' A p <= 0 and return p as ``negative_direction``
        (``x`` is then the iterate reached so far). Without it, CG carries on as if A were SPD.
    save: iteration numbers whose iterates to keep (the last one is always kept).
    x0: the warm start; one with phi(x0) >= 0 (no better than 0 in the model) is shrunk to the
        minimum of phi along it (or dropped when it does not descend: b'x0 <= 0), so that every
        iterate has phi < 0 (CG decreases phi monotonically).
    """
    save = save or set()
    products = 0
    if x0 is None or not bool(torch.any(x0 != 0)):
        x = torch.zeros_like(b)
        r = -b.clone()  # r = A x - b
    else:
        x = x0.clone()
        r = matvec(x) - b
        products += 1
        if not 0.5 * _dot(x, r - b) < 0.0:
            # phi(x0) >= 0 (or not finite): no better than x = 0 in the model CG minimizes, and
            # CG from it could end on an iterate that predicts no decrease at all. Shrink it to
            # the minimum of phi along it, s = b'x0 / x0'Ax0 (A x0 = r + b is known), or drop it
            bx, xAx = _dot(b, x), _dot(x, r + b)
            s = bx / xAx if bx > 0 and xAx > 0 and math.isfinite(bx / xAx) else 0.0
            if s > 0:
                x = x * s
                r = (r + b) * s - b
            else:
                x = torch.zeros_like(b)
                r = -b.clone()
    b_norm = math.sqrt(_dot(b, b))
    z = r / precond if precond is not None else r
    p = -z
    rz = _dot(r, z)
    phis = [0.5 * _dot(x, r - b)]
    iterates: list[Iterate] = []
    stop = "max_iters"
    neg_dir, neg_curv = None, None
    i = 0
    if math.sqrt(_dot(r, r)) <= residual_tol * b_norm or b_norm == 0.0:
        stop = "residual"
    else:
        while i < max_iters:
            Ap = matvec(p)
            products += 1
            pAp = _dot(p, Ap)
            pp = _dot(p, p)
            if pAp <= 0.0 or not math.isfinite(pAp):
                if stop_on_negative_curvature and math.isfinite(pAp):
                    neg_dir, neg_curv = p.clone(), pAp / pp
                    stop = "negative_curvature"
                else:
                    stop = "breakdown"
                break
            alpha = rz / pAp
            x.add_(p, alpha=alpha)
            r.add_(Ap, alpha=alpha)
            i += 1
            phi = 0.5 * _dot(x, r - b)
            phis.append(phi)
            if i in save:
                iterates.append(Iterate(i, x.clone(), _dot(x, r + b), phi))
            if i >= min_iters:
                if math.sqrt(_dot(r, r)) <= residual_tol * b_norm:
                    stop = "residual"
                    break
                if progress_tol is not None:
                    k = max(10, int(0.1 * i))
                    if i > k and phi < 0 and (phi - phis[i - k]) / phi < k * progress_tol:
                        stop = "martens"
                        break
            z = r / precond if precond is not None else r
            rz_new = _dot(r, z)
            p = -z + (rz_new / rz) * p
            rz = rz_new
    xAx = _dot(x, r + b)
    phi = 0.5 * _dot(x, r - b)
    if not iterates or iterates[-1].iteration != i:
        iterates.append(Iterate(i, x.clone(), xAx, phi))
    return SolveResult(x=x, iterations=i, products=products, stop_reason=stop,
                       residual_norm=math.sqrt(_dot(r, r)), xAx=xAx, phi=phi, iterates=iterates,
                       negative_direction=neg_dir, negative_curvature=neg_curv)


def bicgstab(
    matvec: Matvec,
    b: torch.Tensor,
    x0: torch.Tensor | None = None,
    *,
    precond: torch.Tensor | None = None,
    max_iters: int = 250,
    tol: float = 1e-6,
    stop_on_negative_curvature: bool = False,
    save: set[int] | None = None,
) -> SolveResult:
    """Preconditioned Bi-CG-STAB (van der Vorst 1992) on ``A x = b``, A square, possibly indefinite.

    Stops when ||A x - b|| <= tol * ||b||. With ``stop_on_negative_curvature`` it also stops when a
    search direction y has y' A y <= 0 and returns it as ``negative_direction``. Two matvecs per
    iteration; ``iterations`` counts iterations.
    """
    save = save or set()
    products = 0
    if x0 is None or not bool(torch.any(x0 != 0)):
        x = torch.zeros_like(b)
        r = b.clone()  # r = b - A x (the Bi-CG-STAB sign convention)
    else:
        x = x0.clone()
        r = b - matvec(x)
        products += 1
    b_norm = math.sqrt(_dot(b, b))
    r_hat = r.clone()
    rho = alpha = omega = 1.0
    v = torch.zeros_like(b)
    p = torch.zeros_like(b)
    iterates: list[Iterate] = []
    stop = "max_iters"
    neg_dir, neg_curv = None, None
    i = 0

    def _neg(d: torch.Tensor, Ad: torch.Tensor) -> bool:
        nonlocal neg_dir, neg_curv
        dAd = _dot(d, Ad)
        if stop_on_negative_curvature and dAd <= 0.0:
            neg_dir, neg_curv = d.clone(), dAd / max(_dot(d, d), 1e-300)
            return True
        return False

    if b_norm == 0.0 or math.sqrt(_dot(r, r)) <= tol * b_norm:
        stop = "residual"
    else:
        while i < max_iters:
            rho_new = _dot(r_hat, r)
            if rho_new == 0.0 or omega == 0.0:
                stop = "breakdown"
                break
            beta = (rho_new / rho) * (alpha / omega)
            rho = rho_new
            p = r + beta * (p - omega * v)
            y = p / precond if precond is not None else p
            v = matvec(y)
            products += 1
            if _neg(y, v):
                stop = "negative_curvature"
                break
            denom = _dot(r_hat, v)
            if denom == 0.0:
                stop = "breakdown"
                break
            alpha = rho / denom
            s = r - alpha * v
            i += 1
            if math.sqrt(_dot(s, s)) <= tol * b_norm:
                x.add_(y, alpha=alpha)
                r = s
                stop = "residual"
                if i in save:
                    iterates.append(_bicg_iterate(i, x, r, b))
                break
            z = s / precond if precond is not None else s
            t = matvec(z)
            products += 1
            if _neg(z, t):
                x.add_(y, alpha=alpha)  # the half step is a valid iterate
                r = s
                stop = "negative_curvature"
                break
            tt = _dot(t, t)
            omega = _dot(t, s) / tt if tt > 0 else 0.0
            x.add_(y, alpha=alpha).add_(z, alpha=omega)
            r = s - omega * t
            if i in save:
                iterates.append(_bicg_iterate(i, x, r, b))
            if math.sqrt(_dot(r, r)) <= tol * b_norm:
                stop = "residual"
                break
    last = _bicg_iterate(i, x, r, b)
    if not iterates or iterates[-1].iteration != i:
        iterates.append(last)
    return SolveResult(x=x, iterations=i, products=products, stop_reason=stop,
                       residual_norm=math.sqrt(_dot(r, r)), xAx=last.xAx, phi=last.phi,
                       iterates=iterates, negative_direction=neg_dir, negative_curvature=neg_curv)


def _bicg_iterate(i: int, x: torch.Tensor, r: torch.Tensor, b: torch.Tensor) -> Iterate:
    # r = b - A x, so A x = b - r
    xAx = _dot(x, b - r)
    return Iterate(i, x.clone(), xAx, 0.5 * xAx - _dot(b, x))
