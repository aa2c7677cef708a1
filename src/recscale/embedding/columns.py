"""Placing pooled columns into the collection's [B, tables x dim] output, forward and backward as
gathers.

The collection receives its pooled vectors in pieces (the flat exchange's per-rank blocks, the
hierarchical exchange's, the replicas', a multi-tier module's groups), each column bound for
one output column. Written as ``zeros.index_add(1, cols, src)`` the forward is a column scatter
and autograd adds a zero-fill, a clone per kind of piece and a ``slice_backward`` (a zeroed copy
of the whole buffer) per view: on one core about 26 ms per step at 26 tables x dim 128 and batch
1,024, a fifth of a 2-rank step. Here, where the columns are a permutation of the output's (every
output column filled once: table-wise, column-wise, replicated, hierarchical pieces), the forward
is one ``index_select`` by the inverse permutation and the backward one ``index_select`` by
``cols``; the blocked 1-D buffer an all-to-all returns is taken whole, so its gradient comes back
as one buffer. Row-wise pieces (several partial sums for one output column) keep the
``index_add``, in the same order as before. Results are bitwise those of the ``index_add`` form
(adding to zero is exact), except that a -0.0 stays -0.0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def columns_in_order(widths: Sequence[int], order: Sequence[int]) -> list[int]:
    """Pieces of ``widths[i]`` columns laid side by side in ``order`` (a permutation of the
    pieces) -> for each column of the pieces in their own order, its column in that layout."""
    start, where = 0, {}
    for i in order:
        where[i] = start
        start += widths[i]
    return [c for i in range(len(widths)) for c in range(where[i], where[i] + widths[i])]


def inverse_permutation(cols: torch.Tensor, out_dim: int) -> torch.Tensor | None:
    """``inv`` with ``inv[cols[i]] = i`` where ``cols`` fills each of ``out_dim`` columns once,
    else None (a column summed from several pieces, or left empty)."""
    if cols.numel() != out_dim:
        return None
    inv = torch.full((out_dim,), -1, dtype=torch.int64, device=cols.device)
    inv[cols] = torch.arange(out_dim, device=cols.device)
    return inv if bool((inv >= 0).all()) else None


class _Place(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cols, inv, out_dim, B, blocks, *sources):
        pieces = []
        for src, widths in zip(sources, blocks):
            if src.dim() == 2:
                pieces.append(src)
            else:  # [B, w] blocks one after another
                pieces += [b.view(B, w) for b, w in zip(src.split([B * w for w in widths]), widths)]
        wide = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]
        ctx.save_for_backward(cols)
        ctx.blocks, ctx.dims = blocks, [s.dim() for s in sources]
        if inv is not None:
            return wide.index_select(1, inv)
        return wide.new_zeros(B, out_dim).index_add_(1, cols, wide)

    @staticmethod
    def backward(ctx, grad):
        (cols,) = ctx.saved_tensors
        g = grad.index_select(1, cols)
        out, a = [], 0
        for nd, widths in zip(ctx.dims, ctx.blocks):
            if nd == 2:
                out.append(g[:, a: a + widths[0]])
                a += widths[0]
                continue
            parts = []
            for w in widths:
                parts.append(g[:, a: a + w].reshape(-1))
                a += w
            out.append(torch.cat(parts) if len(parts) > 1 else parts[0])
        return (None, None, None, None, None, *out)


def place_columns(sources: Sequence[torch.Tensor], blocks: Sequence[Sequence[int]],
                  cols: torch.Tensor, inv: torch.Tensor | None, out_dim: int,
                  B: int) -> torch.Tensor:
    """[B, out_dim]: column ``i`` of the sources side by side goes to output column ``cols[i]``
    (summed where several go to one). A source is a [B, w] tensor (its ``blocks`` entry
    ``(w,)``) or a 1-D buffer of [B, w] blocks one after another (``blocks``: their widths), as
    an all-to-all returns them; ``inv``: ``inverse_permutation(cols, out_dim)``, computed once."""
    return _Place.apply(cols, inv, out_dim, B, tuple(tuple(b) for b in blocks), *sources)
