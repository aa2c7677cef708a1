"""Curvature-vector products without forming a matrix.

Two families:

- Graph-based (what :class:`~recscale.optim.HessianFree` uses): from a loss (and the outputs it
  was computed from) that a closure returned with its autograd graph, build ``v -> B v`` once per
  step and reuse the graph for every CG iteration.
  * Gauss-Newton ``G v = J' H_L J v``: ``J v`` by the double-vjp trick (the forward-mode product
    obtained from two reverse passes through the retained graph), ``H_L`` by differentiating
    ``dL/dz`` once more, ``J' u`` by one reverse pass. PSD whenever L is convex in the outputs z.
  * Hessian ``H v``: double backward of the gradient built with ``create_graph=True``.
- Functional (``torch.func``), for a module and a batch: :func:`gnvp` (forward-mode ``jvp`` then
  reverse-mode ``vjp``), :func:`hvp` (forward-over-reverse) and :func:`empirical_fisher_diagonal`
  (per-example gradients by ``vmap(grad)``), used by the trainer for the preconditioner.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

Matvec = Callable[[Tensor], Tensor]


# ---------------------------------------------------------------------------- flat vectors
def flatten(tensors: Sequence[Tensor | None], like: Sequence[Tensor] | None = None) -> Tensor:
    """Concatenate tensors into one 1-D vector; ``None`` entries become zeros shaped like ``like``."""
    parts = []
    for i, t in enumerate(tensors):
        if t is None:
            assert like is not None
            parts.append(torch.zeros(like[i].numel(), dtype=like[i].dtype, device=like[i].device))
        else:
            parts.append(t.reshape(-1))
    return torch.cat(parts) if parts else torch.zeros(0)


def unflatten(vec: Tensor, like: Sequence[Tensor]) -> list[Tensor]:
    """Views of ``vec`` shaped like each tensor of ``like``."""
    out, off = [], 0
    for t in like:
        n = t.numel()
        out.append(vec[off: off + n].view_as(t))
        off += n
    return out


def _identity(x: Tensor) -> Tensor:
    return x


# ------------------------------------------------------------- graph-based (closure) products
def gauss_newton_operator(loss: Tensor, outputs: Tensor, params: Sequence[Tensor],
                          reduce: Callable[[Tensor], Tensor] | None = None) -> Matvec:
    """``v -> J' H_L J v`` for ``loss = L(outputs(params))``; graphs are kept for repeated use.

    ``reduce`` (e.g. an all-reduce sum) is applied to each product: one collective per product.
    """
    reduce = reduce or _identity
    params = list(params)
    dl_dz = torch.autograd.grad(loss, outputs, create_graph=True, allow_unused=True)[0]
    if dl_dz is None:
        raise ValueError("Gauss-Newton: the loss was not computed from the outputs the closure "
                         "returned; return (loss, outputs) with loss = L(outputs)")
    u = torch.zeros_like(outputs, requires_grad=True)
    jtu = torch.autograd.grad(outputs, params, u, create_graph=True, allow_unused=True)
    used = [i for i, g in enumerate(jtu) if g is not None]
    jtu_used = [jtu[i] for i in used]
    second_order = dl_dz.requires_grad

    def matvec(v: Tensor) -> Tensor:
        vs = unflatten(v, params)
        if not used:
            return reduce(torch.zeros_like(v))
        jv = torch.autograd.grad(jtu_used, u, [vs[i] for i in used], retain_graph=True)[0]
        if second_order:
            hjv = torch.autograd.grad(dl_dz, outputs, jv, retain_graph=True, allow_unused=True)[0]
        else:
            hjv = None
        if hjv is None:  # loss linear in the outputs: H_L = 0
            return reduce(torch.zeros_like(v))
        gv = torch.autograd.grad(outputs, params, hjv, retain_graph=True, allow_unused=True)
        return reduce(flatten(gv, params).detach())

    return matvec


def hessian_operator(loss: Tensor, params: Sequence[Tensor],
                     reduce: Callable[[Tensor], Tensor] | None = None) -> Matvec:
    """``v -> H v`` by double backward (the gradient graph is built once)."""
    reduce = reduce or _identity
    params = list(params)
    grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
    used = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]

    def matvec(v: Tensor) -> Tensor:
        if not used:
            return reduce(torch.zeros_like(v))
        vs = unflatten(v, params)
        hv = torch.autograd.grad([grads[i] for i in used], params, [vs[i] for i in used],
                                 retain_graph=True, allow_unused=True)
        return reduce(flatten(hv, params).detach())

    return matvec


# ------------------------------------------------------------------ functional (torch.func)
def _functional(model: nn.Module):
    from torch.func import functional_call

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    buffers = dict(model.named_buffers())

    def f(params: Mapping[str, Tensor], x: Tensor) -> Tensor:
        return functional_call(model, ({**params}, buffers), (x,))

    return names, f


def gnvp(model: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor,
         v: Sequence[Tensor]) -> list[Tensor]:
    """Gauss-Newton-vector product ``J' H_L J v`` of ``loss_fn(model(x), y)`` at the model's
    parameters (those requiring grad, in ``named_parameters`` order): ``J v`` by forward mode
    (``torch.func.jvp``), ``H_L (J v)`` by forward-over-reverse on the loss, ``J'`` by ``vjp``."""
    from torch.func import grad, jvp, vjp

    names, f = _functional(model)
    primals = {n: p.detach() for n, p in model.named_parameters() if n in names}
    tangents = dict(zip(names, v))
    z, jv = jvp(lambda p: f(p, x), (primals,), (tangents,))
    _, hjv = jvp(lambda zz: grad(lambda q: loss_fn(q, y))(zz), (z,), (jv,))
    _, vjp_fn = vjp(lambda p: f(p, x), primals)
    (out,) = vjp_fn(hjv)
    return [out[n] for n in names]


def hvp(model: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor,
        v: Sequence[Tensor]) -> list[Tensor]:
    """Hessian-vector product of ``loss_fn(model(x), y)`` (forward-over-reverse, torch.func)."""
    from torch.func import grad, jvp

    names, f = _functional(model)
    primals = {n: p.detach() for n, p in model.named_parameters() if n in names}
    tangents = dict(zip(names, v))
    _, out = jvp(grad(lambda p: loss_fn(f(p, x), y)), (primals,), (tangents,))
    return [out[n] for n in names]


def empirical_fisher_diagonal(model: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor],
                              x: Tensor, y: Tensor, *, scale: float | None = None,
                              chunk_size: int = 256) -> list[Tensor]:
    """``scale x sum_i (grad l_i)^2`` per parameter, l_i the loss of example i alone
    (``loss_fn`` on a batch of one); per-example gradients by ``vmap(grad)`` in chunks.
    ``scale`` defaults to 1 / len(x) (the empirical Fisher of the mean loss)."""
    from torch.func import grad, vmap

    names, f = _functional(model)
    primals = {n: p.detach() for n, p in model.named_parameters() if n in names}

    def one(p, xi, yi):
        return loss_fn(f(p, xi.unsqueeze(0)), yi.unsqueeze(0))

    per_example = vmap(grad(one), in_dims=(None, 0, 0))
    acc = {n: torch.zeros_like(t) for n, t in primals.items()}
    for lo in range(0, len(x), chunk_size):
        g = per_example(primals, x[lo: lo + chunk_size], y[lo: lo + chunk_size])
        for n in names:
            acc[n] += (g[n] ** 2).sum(0)
    s = (1.0 / max(len(x), 1)) if scale is None else scale
    return [acc[n] * s for n in names]
