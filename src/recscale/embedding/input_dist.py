"""Input distribution pieces of the sharded collection: ``InputDist`` (a batch whose ids
all-to-alls are in flight, what ``ShardedEmbeddingCollection.start`` returns) and
``arrange_received`` (the ids that arrived, source-major, reordered feature-major for fbgemm)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from recscale.comm.collectives import PendingAllToAll


@dataclass
class InputDist:
    """A batch whose input distribution has started: ids all-to-alls in flight."""

    B: int
    bs: list[int]
    device: torch.device
    sharded: PendingAllToAll | None = None
    recv_l: list[int] = field(default_factory=list)
    recv_v: list[int] = field(default_factory=list)
    dp: PendingAllToAll | None = None
    dp_recv_l: list[int] = field(default_factory=list)
    dp_recv_v: list[int] = field(default_factory=list)
    hier: PendingAllToAll | None = None  # host-bound tables' stage A (embedding.hierarchical)
    received: tuple | None = None  # (lengths, ids) for the local lookup, once waited for


def bag_order(k: int, batch_sizes: Sequence[int]) -> torch.Tensor:
    """Bags arrive source-major ([source][feature][sample]); the TBE wants feature-major over the
    concatenated batch ([feature][source][sample]). -> index of the incoming bag for each slot."""
    parts, off = [], 0
    for b in batch_sizes:
        parts.append(off + torch.arange(k).unsqueeze(1) * b + torch.arange(b).unsqueeze(0))
        off += k * b
    if not parts:
        return torch.zeros(0, dtype=torch.int64)
    return torch.cat(parts, dim=1).reshape(-1)


def split_received(recv: torch.Tensor, recv_l: Sequence[int],
                   recv_v: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One all-to-all's output ([lengths | ids] per source rank) -> (all lengths, all ids)."""
    parts, off = [], 0
    for a, b in zip(recv_l, recv_v):
        parts.append((recv[off: off + a], recv[off + a: off + a + b]))
        off += a + b
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def arrange_received(recv: torch.Tensor, recv_l: Sequence[int], recv_v: Sequence[int], k: int,
                     batch_sizes: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Lengths and ids of ``k`` features from every source rank -> (lengths, ids) feature-major
    over the concatenated (global) batch, as the local fbgemm lookup takes them."""
    rl, rv = split_received(recv, recv_l, recv_v)
    order = bag_order(k, batch_sizes).to(rl.device)
    lengths, ids, _ = torch.ops.fbgemm.permute_1D_sparse_data(order.to(torch.int32), rl, rv,
                                                               None, None)
    return lengths, ids
