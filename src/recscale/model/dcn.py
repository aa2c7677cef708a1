"""DCN-v2 low-rank cross network (the interaction of MLPerf's DLRM-DCNv2).

Layer l maps x_l to ``x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l`` (``*`` elementwise), where
``V_l`` is [rank, N], ``U_l`` is [N, rank] and ``b_l`` is [N]: the full-rank cross
``x_0 * (W_l x_l + b_l) + x_l`` with ``W_l = U_l V_l`` factored to rank ``low_rank``. The bias sits
inside the product, as in TorchRec's ``LowRankCrossNet`` and the DCN-v2 paper's eq. (1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from recscale.config import Validated, check


@dataclass(frozen=True)
class DCNConfig(Validated):
    num_layers: int = 3
    low_rank: int = 512

    def validate(self, prefix: str = "model.dcn") -> None:
        check(self.num_layers >= 1, f"{prefix}.num_layers", self.num_layers, "an integer >= 1")
        check(self.low_rank >= 1, f"{prefix}.low_rank", self.low_rank, "an integer >= 1")


def _cross(x0: torch.Tensor, vs, us, bs) -> torch.Tensor:
    """The layers in plain differentiable ops (the fused backward's double-backward path)."""
    x = x0
    for v, u, b in zip(vs, us, bs):
        x = torch.addcmul(x, x0, torch.addmm(b, x @ v.t(), u.t()))
    return x


class _CrossStack(torch.autograd.Function):
    """All cross layers as one autograd node, so that backward does per layer one product for
    the gradient of ``y``, one accumulation into x_0's gradient, and adds the residual inside
    the product that goes back through V (``addmm_``), instead of autograd's separate products,
    sums and accumulations over [B, N]: fewer passes over [B, N] tensors, which on a CPU are
    memory-bound (most of the cross network's time in bf16).

    Inputs: x_0, then V_1..V_L, U_1..U_L, b_1..b_L, all of one dtype. Under ``create_graph``
    (Hessian-vector products) backward recomputes the layers in plain ops and differentiates
    those, so double backward stays exact."""

    @staticmethod
    def forward(ctx, x0, *params):
        num = len(params) // 3
        vs, us, bs = params[:num], params[num:2 * num], params[2 * num:]
        x, saved = x0, []
        ones = x0.new_ones(x0.shape[0], 1)
        for v, u, b in zip(vs, us, bs):
            # the bias as U's last column against a column of ones: no [B, N] broadcast copy
            # here, and its gradient comes out of U's product in backward (no sum over B)
            z = torch.cat([x @ v.t(), ones], dim=1)
            y = z @ torch.cat([u, b.unsqueeze(1)], dim=1).t()
            saved += [x, z, y]
            x = torch.addcmul(x, x0, y)
        ctx.save_for_backward(x0, *params, *saved)
        ctx.num = num
        return x

    @staticmethod
    def backward(ctx, grad):
        num = ctx.num
        x0, *rest = ctx.saved_tensors
        params, saved = rest[:3 * num], rest[3 * num:]
        vs, us = params[:num], params[num:2 * num]
        if torch.is_grad_enabled():  # create_graph: differentiate the plain ops
            inputs = (x0, *params)
            wanted = [t for t in inputs if t.requires_grad]
            with torch.enable_grad():
                out = _cross(x0, vs, us, params[2 * num:])
                grads = iter(torch.autograd.grad(out, wanted, grad, create_graph=True))
            return tuple(next(grads) if t.requires_grad else None for t in inputs)
        gv, gu, gb = [None] * num, [None] * num, [None] * num
        g, gx0 = grad, None
        for layer in reversed(range(num)):
            x, z, y = saved[3 * layer:3 * layer + 3]
            gy = g * x0
            gx0 = g * y if gx0 is None else gx0.addcmul_(g, y)
            gub = gy.t() @ z
            gu[layer], gb[layer] = gub[:, :-1], gub[:, -1]
            gz = gy @ us[layer]
            gv[layer] = gz.t() @ x
            # the residual's gradient plus the one back through V (g is ours after the first)
            g = torch.addmm(g, gz, vs[layer]) if g is grad else g.addmm_(gz, vs[layer])
        return (gx0.add_(g), *gv, *gu, *gb)


class LowRankCrossNet(nn.Module):
    """``num_layers`` low-rank cross layers over [B, in_dim] -> [B, in_dim].

    U and V start from Xavier-normal draws of their own shapes, b at zero (a cross layer then
    starts as x_0 * U V x_l + x_l). Under autocast the layers run in its dtype (weights cast as
    autocast casts a Linear's), all in one fused autograd node (``_CrossStack``)."""

    def __init__(self, in_dim: int, num_layers: int, low_rank: int):
        super().__init__()
        self.down = nn.ModuleList(nn.Linear(in_dim, low_rank, bias=False)
                                  for _ in range(num_layers))
        self.up = nn.ModuleList(nn.Linear(low_rank, in_dim, bias=True) for _ in range(num_layers))
        with torch.no_grad():
            for v, u in zip(self.down, self.up):
                nn.init.xavier_normal_(v.weight)
                nn.init.xavier_normal_(u.weight)
                u.bias.zero_()

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        device = x0.device.type
        dtype = (torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device)
                 else x0.dtype)
        params = [m.weight for m in self.down] + [m.weight for m in self.up] + \
                 [m.bias for m in self.up]
        with torch.autocast(device, enabled=False):
            return _CrossStack.apply(x0.to(dtype), *(p.to(dtype) for p in params))
