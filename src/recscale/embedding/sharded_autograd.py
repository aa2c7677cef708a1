"""The sharded collection's own autograd functions:

- ``ColumnShardRowwiseAdagrad``: lookups of column shards whose backward applies row-wise Adagrad
  with the whole table's row state (per-row sums of squared gradients exchanged among the
  table's holders), and the embedding weight decay as ``recscale.embedding.tbe`` describes it;
- ``OwnRowsGatherGrad``: a replicated table's output rows of this rank, whose backward gathers
  every rank's gradient (so every replica applies the same full-batch update);
- ``GradScale``: identity forward, gradient times a constant.
"""

from __future__ import annotations

import torch

from recscale.comm.collectives import all_to_all_1d, encoded_all_gather


class OwnRowsGatherGrad(torch.autograd.Function):
    """Forward: this rank's rows of a replicated global output. Backward: all ranks' gradients are
    gathered into the global gradient, so every replica sees the same full-batch gradient."""

    @staticmethod
    def forward(ctx, full, start, batch_sizes, rank, group, stats, codec, scale):
        ctx.args = (batch_sizes, rank, group, stats, full.shape[1], codec, scale)
        return full[start: start + batch_sizes[rank]]

    @staticmethod
    def backward(ctx, grad):
        batch_sizes, rank, group, stats, w, codec, scale = ctx.args
        g = encoded_all_gather(grad.contiguous().reshape(-1), batch_sizes[rank], w, batch_sizes,
                               codec, group, stats, "dp_output_grad", scale)
        return g.view(-1, w), None, None, None, None, None, None, None


class ColumnShardRowwiseAdagrad(torch.autograd.Function):
    """Lookups of this rank's column shards (sum pooling); the backward applies row-wise Adagrad
    with the row state of the whole table: per-row sums of squared gradients of every column
    shard are exchanged among the table's holders in one all-to-all (every rank takes part, so
    the collective order is the same on all ranks)."""

    @staticmethod
    def forward(ctx, anchor, coll, lengths, values, weights=None):
        bg = lengths.shape[1] if lengths.dim() == 2 else 0
        off = torch.cat([lengths.new_zeros(1), lengths.reshape(-1).cumsum(0)])
        outs, saved = [], []
        for j, w in enumerate(coll.cw_weights):
            a, b = int(off[j * bg]), int(off[(j + 1) * bg])
            ids = values[a:b]
            iw = None if weights is None else weights[a:b].unsqueeze(1)
            bag = torch.repeat_interleave(torch.arange(bg, device=ids.device), lengths[j])
            rows = w[ids] if iw is None else w[ids] * iw
            outs.append(torch.zeros(bg, w.shape[1], device=w.device).index_add_(0, bag, rows))
            saved.append((ids, bag, iw))
        ctx.coll, ctx.saved = coll, saved
        if not outs:
            return anchor.new_zeros(bg, 0)
        return torch.cat(outs, dim=1)

    @staticmethod
    def backward(ctx, grad):
        coll = ctx.coll
        mine = coll.routes[coll.rank]
        widths = [w.shape[1] for w in coll.cw_weights]
        grads = grad.split(widths, dim=1) if widths else []
        wd, mode = coll.optimizer.weight_decay, coll.optimizer.weight_decay_mode
        per_table: dict[int, list] = {}
        for j, (g, (ids, bag, iw)) in enumerate(zip(grads, ctx.saved)):
            t = mine[coll._cw_pos[j]][0]
            uniq, inv = torch.unique(ids, return_inverse=True)
            gi = g[bag] if iw is None else g[bag] * iw
            rows = torch.zeros(len(uniq), g.shape[1], device=g.device).index_add_(0, inv, gi)
            if wd and mode == "l2":  # coupled: the row's gradient + wd x the row
                rows += wd * coll.cw_weights[j][uniq]
            per_table.setdefault(t, []).append((j, uniq, rows))
        partial = {t: sum((r * r).sum(1) for _, _, r in lst) for t, lst in per_table.items()}
        # exchange partial sums with the other holders of each table (same ids, same order)
        send, send_n, recv_n = [], [], []
        for d in range(coll.world_size):
            shared = [t for t in coll.cw_tables if coll.rank in coll.cw_holders[t]
                      and d in coll.cw_holders[t] and d != coll.rank]
            pieces = [partial[t] for t in shared]
            send.extend(pieces)
            send_n.append(sum(p.numel() for p in pieces))
            recv_n.append(send_n[-1])  # a table's holders see the same unique ids
        flat = torch.cat(send) if send else grad.new_zeros(0)
        got = all_to_all_1d(flat, send_n, recv_n, coll.group, coll.stats, "cw_row_state")
        off = 0
        for d in range(coll.world_size):
            for t in coll.cw_tables:
                if coll.rank in coll.cw_holders[t] and d in coll.cw_holders[t] and d != coll.rank:
                    n = partial[t].numel()
                    partial[t] = partial[t] + got[off: off + n]
                    off += n
        lr, eps = coll.learning_rate, coll.optimizer.eps
        with torch.no_grad():
            for t, lst in per_table.items():
                uniq = lst[0][1]
                state = coll.cw_state[t]
                state[uniq] += partial[t] / coll.dims[t]
                scale = lr / (state[uniq].sqrt() + eps)
                for j, _, rows in lst:
                    coll.cw_weights[j][uniq] -= scale.unsqueeze(1) * rows
                    if wd and mode == "decoupled":  # after the update, each touched row once
                        coll.cw_weights[j][uniq] *= 1.0 - lr * wd
        return torch.zeros_like(ctx.coll._anchor), None, None, None, None


class GradScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None

