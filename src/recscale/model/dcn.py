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


class LowRankCrossNet(nn.Module):
    """``num_layers`` low-rank cross layers over [B, in_dim] -> [B, in_dim].

    U and V start from Xavier-normal draws of their own shapes, b at zero (a cross layer then
    starts as x_0 * U V x_l + x_l)."""

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
        x = x0
        for v, u in zip(self.down, self.up):
            # x0 * y + x rather than addcmul(x, x0, y): same value, and its backward is two
            # products where addcmul's adds a scaling pass over the [B, N] gradient per input
            x = x0 * u(v(x)) + x
        return x
