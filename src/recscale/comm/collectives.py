"""Collectives of the sharded runtime, each counting bytes sent and wall time spent.

``all_to_all_1d`` moves a flat tensor with per-peer element counts; its backward is the same
collective with the counts swapped, so gradients flow back to the ranks that produced the inputs.
Bytes are counted from the tensors actually handed to the backend (what leaves this rank for other
ranks), never computed from shapes elsewhere, and split by destination into ``intra_host`` (a peer
on the same host of the plan's topology, ``CommStats.hosts``) and ``inter_host``.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class CommStats:
    """Bytes sent to other ranks and seconds spent, per collective name; bytes also split into
    ``intra_host`` and ``inter_host`` by ``hosts`` (global rank -> the plan's host; None: one
    host, every byte intra-host)."""

    bytes_sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    inter_host: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    hosts: tuple[int, ...] | None = None

    def add(self, name: str, nbytes: int, seconds: float, inter: int = 0) -> None:
        """``nbytes`` sent by collective ``name``, of which ``inter`` crossed hosts."""
        self.bytes_sent[name] += int(nbytes)
        self.inter_host[name] += int(inter)
        self.seconds[name] += seconds
        self.calls[name] += 1

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def reset(self) -> None:
        self.bytes_sent.clear()
        self.inter_host.clear()
        self.seconds.clear()
        self.calls.clear()

    def peer_bytes(self, t: torch.Tensor, splits: Sequence[int], group=None) -> tuple[int, int]:
        """(bytes to other ranks, of them to other hosts) of ``splits[d]`` elements of ``t``
        sent to rank d of ``group``."""
        ranks = _group_ranks(group)
        me = ranks[dist.get_rank(group)]
        size = t.element_size()
        total = (sum(splits) - splits[ranks.index(me)]) * size
        if self.hosts is None:
            return total, 0
        mine = self.hosts[me]
        inter = sum(n for r, n in zip(ranks, splits) if self.hosts[r] != mine) * size
        return total, inter

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {k: {"bytes": self.bytes_sent[k], "seconds": self.seconds[k], "calls": self.calls[k],
                    "inter_host": self.inter_host[k],
                    "intra_host": self.bytes_sent[k] - self.inter_host[k]}
                for k in sorted(self.bytes_sent)}


_RANKS: dict[int, tuple[object, list[int]]] = {}


def _group_ranks(group) -> list[int]:
    """Global ranks of ``group`` in group-rank order (cached per group object)."""
    if group is None:
        return list(range(dist.get_world_size()))
    hit = _RANKS.get(id(group))
    if hit is None or hit[0] is not group:
        hit = (group, dist.get_process_group_ranks(group))
        _RANKS[id(group)] = hit
    return hit[1]


def _count(stats: CommStats | None, name: str, t: torch.Tensor, splits: Sequence[int], group,
           seconds: float) -> None:
    if stats is not None:
        total, inter = stats.peer_bytes(t, splits, group)
        stats.add(name, total, seconds, inter)


def exchange_counts(counts: torch.Tensor, group=None, stats: CommStats | None = None,
                    name: str = "counts") -> torch.Tensor:
    """counts [world, k] (row d goes to rank d) -> received [world, k] (row s came from rank s)."""
    world = dist.get_world_size(group)
    out = torch.empty_like(counts)
    t0 = time.perf_counter()
    dist.all_to_all_single(out, counts.contiguous(), group=group)
    _count(stats, name, counts, [counts[0].numel()] * world, group, time.perf_counter() - t0)
    return out


def _a2a(x: torch.Tensor, send: list[int], recv: list[int], group, stats, name) -> torch.Tensor:
    out = x.new_empty(sum(recv))
    t0 = time.perf_counter()
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send,
                           group=group)
    _count(stats, name, x, send, group, time.perf_counter() - t0)
    return out


class PendingAllToAll:
    """An all-to-all in flight; ``wait()`` returns the received tensor (and books the time)."""

    def __init__(self, out, work, stats, name, nbytes, t0):
        self.out, self.work, self.stats, self.name = out, work, stats, name
        self.nbytes, self.t0 = nbytes, t0  # nbytes: (to other ranks, to other hosts)
        self.issue_s = time.perf_counter() - t0

    def wait(self) -> torch.Tensor:
        t = time.perf_counter()
        self.work.wait()
        if self.stats is not None:
            self.stats.add(self.name, self.nbytes[0], self.issue_s + time.perf_counter() - t,
                           self.nbytes[1])
        return self.out


def all_to_all_1d_async(x: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int],
                        group=None, stats: CommStats | None = None,
                        name: str = "all_to_all") -> PendingAllToAll:
    """Like ``all_to_all_1d`` (no autograd) but returns at once; the data moves in the
    background (gloo's own threads, or a separate CUDA stream for NCCL) until ``wait()``."""
    send, recv = [int(c) for c in send_counts], [int(c) for c in recv_counts]
    out = x.new_empty(sum(recv))
    t0 = time.perf_counter()
    work = dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv,
                                  input_split_sizes=send, group=group, async_op=True)
    nbytes = stats.peer_bytes(x, send, group) if stats is not None else (0, 0)
    return PendingAllToAll(out, work, stats, name, nbytes, t0)


class _AllToAll1D(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send, recv, group, stats, name):
        ctx.send, ctx.recv, ctx.group, ctx.stats, ctx.name = send, recv, group, stats, name
        return _a2a(x, send, recv, group, stats, name)

    @staticmethod
    def backward(ctx, grad):
        g = _a2a(grad.contiguous(), ctx.recv, ctx.send, ctx.group, ctx.stats, ctx.name + "_grad")
        return g, None, None, None, None, None


def all_to_all_1d(x: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int],
                  group=None, stats: CommStats | None = None, name: str = "all_to_all") -> torch.Tensor:
    """Flat all-to-all: ``send_counts[d]`` elements of ``x`` go to rank d, in rank order.
    Differentiable when ``x`` requires grad (backward = the transposed all-to-all)."""
    send, recv = [int(c) for c in send_counts], [int(c) for c in recv_counts]
    if x.requires_grad:
        return _AllToAll1D.apply(x, send, recv, group, stats, name)
    return _a2a(x, send, recv, group, stats, name)


class PendingEncoded:
    """An encoded all-to-all in flight; ``wait()`` decodes what arrived to float32, flat."""

    def __init__(self, pending: PendingAllToAll, recv_shapes, recv, codec, name, scale, like):
        self.pending, self.recv_shapes, self.recv = pending, recv_shapes, recv
        self.codec, self.name, self.scale, self.like = codec, name, scale, like

    def wait(self) -> torch.Tensor:
        return decode_received(self.pending.wait(), self.recv_shapes, self.recv, self.codec,
                               self.name, self.scale, self.like)


def encode_blocks(x: torch.Tensor, send_shapes, codec, scale: float = 1.0) -> torch.Tensor:
    """The row blocks ``send_shapes`` of float32 flat ``x``, times ``scale``, encoded one after
    another (uint8, flat): what an encoded exchange sends."""
    pieces, off = [], 0
    for rows, cols in send_shapes:
        block = x[off: off + rows * cols].view(rows, cols)
        off += rows * cols
        if rows == 0 or cols == 0:  # nothing to send (a row header would still cost)
            continue
        if scale != 1.0:
            block = block * scale
        pieces.append(codec.encode(block).reshape(-1))
    return torch.cat(pieces) if pieces else x.new_zeros(0, dtype=torch.uint8)


def decode_received(got: torch.Tensor, recv_shapes, recv, codec, name: str, scale: float,
                    like: torch.Tensor) -> torch.Tensor:
    """What an encoded exchange received (``recv[d]`` bytes of ``recv_shapes[d]`` rows x cols
    from rank d) -> float32 flat, divided by ``scale``; non-finite values after a scale are
    refused, naming the exchange."""
    out, off = [], 0
    for (rows, cols), n in zip(recv_shapes, recv):
        if rows == 0 or cols == 0:
            continue
        dec = codec.decode(got[off: off + n].view(rows, codec.row_bytes(cols)), cols)
        off += n
        out.append(dec.reshape(-1))
    y = torch.cat(out) if out else like.new_zeros(0)
    if scale != 1.0:
        # in place (y is this call's own); x * 2^-k is x / 2^k exactly
        m, _ = math.frexp(scale)
        y = y.mul_(1.0 / scale) if m == 0.5 else y.div_(scale)
        # a NaN or inf anywhere makes the sum non-finite: one reduction, and the elementwise
        # check only then (finite values may also add up to an overflow)
        if not math.isfinite(float(y.sum())) and not bool(torch.isfinite(y).all()):
            raise FloatingPointError(
                f"{name}: non-finite values after {codec.name} encoding with loss "
                f"scale {scale}; lower comms.loss_scale or use bf16 for the backward "
                "direction")
    return y


def encoded_exchange_start(x, send_shapes, recv_shapes, codec, group, stats, name,
                       scale=1.0) -> PendingEncoded:
    """Encode row blocks ``send_shapes`` of float32 flat ``x`` and start their all-to-all."""
    payload = encode_blocks(x, send_shapes, codec, scale)
    send = [r * codec.row_bytes(c) if c else 0 for r, c in send_shapes]
    recv = [r * codec.row_bytes(c) if c else 0 for r, c in recv_shapes]
    pending = all_to_all_1d_async(payload, send, recv, group, stats, name)
    return PendingEncoded(pending, recv_shapes, recv, codec, name, scale, x)


def encoded_all_gather(x, rows: int, cols: int, batch_rows: Sequence[int], codec, group, stats,
                       name, scale=1.0) -> torch.Tensor:
    """Every rank's [rows, cols] block of float32 flat ``x`` to every rank (``batch_rows[d]``
    rows from rank d), as one encoded all-to-all: the block is encoded once and its bytes sent to
    each rank (bitwise what encoding a copy per rank sends) -> flat float32, rank order."""
    one = encode_blocks(x, [(rows, cols)], codec, scale)
    W = len(batch_rows)
    recv = [r * codec.row_bytes(cols) if cols else 0 for r in batch_rows]
    pending = all_to_all_1d_async(one.repeat(W), [one.numel()] * W, recv, group, stats, name)
    return decode_received(pending.wait(), [(r, cols) for r in batch_rows], recv, codec, name,
                           scale, x)


class OutputExchange:
    """An encoded all-to-all split in two autograd steps so compute can run while data moves:
    ``start(x)`` sends (forward) and ``finish(token)`` receives. In backward, ``finish``'s
    gradient step sends the gradients back and returns at once; ``start``'s waits for them, so
    autograd runs whatever else is ready (the bottom MLP's backward) in between."""

    def __init__(self, send_shapes, recv_shapes, fwd, bwd, group, stats, name, bwd_scale=1.0):
        self.send_shapes = [(int(r), int(c)) for r, c in send_shapes]
        self.recv_shapes = [(int(r), int(c)) for r, c in recv_shapes]
        self.fwd, self.bwd, self.group, self.stats = fwd, bwd, group, stats
        self.name, self.bwd_scale = name, bwd_scale
        self.pending_fwd: PendingEncoded | None = None
        self.pending_bwd: PendingEncoded | None = None

    def start(self, x: torch.Tensor) -> torch.Tensor:
        return _ExchangeStart.apply(x, self)

    def finish(self, token: torch.Tensor) -> torch.Tensor:
        return _ExchangeFinish.apply(token, self)


class _ExchangeStart(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ex: OutputExchange):
        ctx.ex = ex
        ex.pending_fwd = encoded_exchange_start(x, ex.send_shapes, ex.recv_shapes, ex.fwd, ex.group,
                                            ex.stats, ex.name)
        return x.new_zeros(0)  # a token: orders finish after start in the graph

    @staticmethod
    def backward(ctx, _token_grad):
        ex = ctx.ex
        g, ex.pending_bwd = ex.pending_bwd.wait(), None
        return g, None


class _ExchangeFinish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, token, ex: OutputExchange):
        ctx.ex = ex
        y, ex.pending_fwd = ex.pending_fwd.wait(), None
        return y

    @staticmethod
    def backward(ctx, grad):
        ex = ctx.ex
        ex.pending_bwd = encoded_exchange_start(grad.contiguous(), ex.recv_shapes, ex.send_shapes,
                                            ex.bwd, ex.group, ex.stats, ex.name + "_grad",
                                            ex.bwd_scale)
        return grad.new_zeros(0), None


def make_host_groups(world_size: int, local_world_size: int, rank: int,
                     timeout_s: float | None = None):
    """-> (this rank's host group, this rank's peer group); None where that group would hold
    this rank alone (one host, or one rank per host: the stage is a local copy). Every rank
    makes every group, in the same order (torch.distributed requires it)."""
    L, H = local_world_size, world_size // local_world_size
    kw = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
    host = peer = None
    for h in range(H if L > 1 else 0):
        g = dist.new_group(ranks=[h * L + i for i in range(L)], **kw)
        if rank // L == h:
            host = g
    for j in range(L if H > 1 else 0):
        g = dist.new_group(ranks=[h * L + j for h in range(H)], **kw)
        if rank % L == j:
            peer = g
    return host, peer
