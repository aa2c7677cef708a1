"""Input distribution pieces of the sharded collection: ``Routes`` (which rank serves which
shard, and how features and received columns are ordered: from the plan), ``InputDist`` (a
batch whose ids all-to-alls are in flight, what ``ShardedEmbeddingCollection.start`` returns)
and ``arrange_received`` (the ids that arrived, source-major, reordered feature-major for
fbgemm)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from recscale.comm.collectives import PendingAllToAll

ROW_TYPES = ("row_wise", "table_row_wise")
HIER_TYPES = ("table_row_wise", "table_column_wise")  # host-bound: embedding.hierarchical


@dataclass
class Routes:
    """How a plan's tables (in the collection's feature order) travel: ``dp`` / ``rw`` /
    ``hier`` table indices (replicated, row-sharded on the flat path, host-bound across hosts);
    ``flat[d]`` / ``hier_routes[d]``: the (table, shard) pairs rank d serves on each path, in its
    module's table order; ``perm``: the combined feature rows in destination order (0..T-1 the
    input features, T + k * len(rw) + j bucket k of row-sharded table j); ``widths[d]``: the
    columns rank d sends back; ``dest_cols``: where each received column goes."""

    dp: list[int]
    rw: list[int]
    hier: list[int]
    flat: list[list]
    hier_routes: list[list]
    perm: list[int]
    widths: list[int]
    dest_cols: list[int]

    @classmethod
    def of(cls, tables: Sequence, col0: Sequence[int], world_size: int,
           num_hosts: int) -> Routes:
        T = len(tables)
        dp = [t for t, tp in enumerate(tables) if tp.sharding_type == "data_parallel"]
        # on one host the two stages are the flat exchange: one-host runs keep the flat path
        hier = [t for t, tp in enumerate(tables) if tp.sharding_type in HIER_TYPES
                and num_hosts > 1]
        rw = [t for t, tp in enumerate(tables) if tp.sharding_type in ROW_TYPES
              and t not in hier]
        flat: list[list] = [[] for _ in range(world_size)]
        hier_routes: list[list] = [[] for _ in range(world_size)]
        for t, tp in enumerate(tables):
            if t in dp:
                continue
            for s in sorted(tp.shards, key=lambda s: (s.row_offset, s.col_offset)):
                (hier_routes if t in hier else flat)[s.rank].append((t, s))
        for t in rw + [t for t in hier if tables[t].sharding_type in ROW_TYPES]:
            tp = tables[t]
            for s in tp.shards:
                if s.row_offset % tp.row_block_size:
                    raise ValueError(f"table {tp.name}: row shard at {s.row_offset} is not a "
                                     f"multiple of the block size {tp.row_block_size}")
        perm, dest_cols = [], []
        for d in range(world_size):
            for t, s in flat[d]:
                if t in rw:
                    block = tables[t].row_block_size
                    perm.append(T + (s.row_offset // block) * len(rw) + rw.index(t))
                else:
                    perm.append(t)
                dest_cols.extend(range(col0[t] + s.col_offset,
                                       col0[t] + s.col_offset + s.col_length))
        widths = [sum(s.col_length for _, s in flat[d]) for d in range(world_size)]
        return cls(dp, rw, hier, flat, hier_routes, perm, widths, dest_cols)


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
    weighted: bool = False  # ids travel with their weights
    received: tuple | None = None  # (lengths, ids, weights) for the local lookup, once waited for
    local: tuple | None = None  # those split into the fused module's and the column shards'


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


def weight_bits(w: torch.Tensor) -> torch.Tensor:
    """Float32 id weights as int64 words (exactly: through float64), so they travel in the same
    all-to-all as the lengths and ids; ``from_bits`` reverses it."""
    return w.to(torch.float64).view(torch.int64)


def from_bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.float64).to(torch.float32)


def pack(lengths: torch.Tensor, l_cuts: Sequence[int], ids: torch.Tensor, v_cuts: Sequence[int],
         weights: torch.Tensor | None = None) -> torch.Tensor:
    """One all-to-all's payload: for each destination d, its lengths
    ``lengths[l_cuts[d]:l_cuts[d + 1]]``, then its ids ``ids[v_cuts[d]:v_cuts[d + 1]]`` (and
    their weights as int64 words), destinations one after another (``split_received`` reads
    it back)."""
    pieces = []
    for d in range(len(l_cuts) - 1):
        a, b = v_cuts[d], v_cuts[d + 1]
        pieces += [lengths[l_cuts[d]: l_cuts[d + 1]], ids[a:b]]
        if weights is not None:
            pieces.append(weight_bits(weights[a:b]))
    return torch.cat(pieces)


def split_received(recv: torch.Tensor, recv_l: Sequence[int], recv_v: Sequence[int],
                   weighted: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One all-to-all's output ([lengths | ids] per source rank, and ``weighted``: [lengths |
    ids | weights' bits]) -> (all lengths, all ids, all weights or None)."""
    parts, off = [], 0
    for a, b in zip(recv_l, recv_v):
        w = from_bits(recv[off + a + b: off + a + 2 * b]) if weighted else None
        parts.append((recv[off: off + a], recv[off + a: off + a + b], w))
        off += a + (2 * b if weighted else b)
    return (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]),
            torch.cat([p[2] for p in parts]) if weighted else None)


def arrange_received(recv: torch.Tensor, recv_l: Sequence[int], recv_v: Sequence[int], k: int,
                     batch_sizes: Sequence[int], weighted: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Lengths and ids (and weights) of ``k`` features from every source rank -> (lengths,
    ids, weights or None) feature-major over the concatenated (global) batch, as the local
    fbgemm lookup takes them."""
    rl, rv, rw = split_received(recv, recv_l, recv_v, weighted)
    order = bag_order(k, batch_sizes).to(rl.device)
    return torch.ops.fbgemm.permute_1D_sparse_data(order.to(torch.int32), rl, rv, rw, None)
