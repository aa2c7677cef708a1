"""Two-stage (hierarchical) exchanges of the host-bound tables: table_row_wise and
table_column_wise, whose shards all live on the ranks of one host of the plan's topology.

Hosts and local ranks come from the plan (``local_world_size``, ``host_of``), not from the
launcher, so a plan for 2 hosts x 2 ranks runs the same collectives on one machine as on two.
Two families of sub-groups are made once: the ranks of each host, and the peers (ranks of the
same local rank j on every host). Rank (h, j) is the *intermediate* of its host for the samples
of the ranks (hs, j), hs = 0..H-1.

Input, for the tables of host h:
  A. (peer group, crosses hosts) every rank sends the raw lengths and ids of its samples for
     host h's features to its peer on host h: once per (sample host, owning host);
  B. (host group) the intermediate buckets row-shard ids by row block, repeats column-shard
     features for every holder, and spreads them to the owners in its host.
The owner looks the ids up for the whole global batch in source-rank order, as on the flat path.

Output (forward), the transpose:
  B'. (host group) each owner sends its pooled rows of the samples of (hs, j) to intermediate j,
      which places column shards and sums row-shard partials: one vector per sample and table;
  A'. (peer group, crosses hosts) the intermediate sends those vectors to the samples' ranks.
Backward is the transposed exchange (``OutputExchange``): gradients cross hosts once per
sample, are copied to every row shard and split over column shards inside the host. Both stages
use the configured wire codecs (an intermediate sums partials in float32 between them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from recscale.comm.collectives import (
    CommStats,
    OutputExchange,
    PendingAllToAll,
    all_to_all_1d,
    all_to_all_1d_async,
    exchange_counts,
    make_host_groups,
)
from recscale.embedding.input_dist import (  # noqa: F401  (HIER_TYPES: named here too)
    HIER_TYPES,
    arrange_received,
    pack,
    split_received,
)


class _Here:
    """A stage that stays on this rank (its group would be this rank alone): no collective."""

    def __init__(self, x: torch.Tensor):
        self.x = x

    def wait(self) -> torch.Tensor:
        return self.x


class HierarchicalExchange:
    """Input and output exchanges of the host-bound tables for rank ``rank``.

    ``tables``: the collection's table plans (feature order); ``hier``: indices of the host-bound
    ones; ``routes[d]``: the (table, shard) pairs of those tables that rank d serves, in its
    lookup order; ``col0``: the output column where each table starts.
    """

    def __init__(self, tables, hier: Sequence[int], routes, col0: Sequence[int],
                 local_world_size: int, rank: int, world_size: int, stats: CommStats,
                 fwd_codec, bwd_codec, bwd_scale: float, device, timeout_s: float | None = None):
        L, W = local_world_size, world_size
        H = W // L
        self.L, self.H, self.W, self.rank = L, H, W, rank
        self.h, self.j = rank // L, rank % L
        self.stats, self.fwd, self.bwd, self.bwd_scale = stats, fwd_codec, bwd_codec, bwd_scale
        host_of = {}
        for t in hier:
            hosts = {s.rank // L for s in tables[t].shards}
            if len(hosts) != 1:
                raise ValueError(f"table {tables[t].name}: {tables[t].sharding_type} shards must "
                                 f"lie on one host of the plan's topology, got hosts "
                                 f"{sorted(hosts)} (local_world_size={L})")
            host_of[t] = hosts.pop()
        self.host_tables = [[t for t in hier if host_of[t] == h] for h in range(H)]
        dims = [tables[t].embedding_dim for t in range(len(tables))]
        self.host_width = [sum(dims[t] for t in ts) for ts in self.host_tables]
        self.F = [len(ts) for ts in self.host_tables]
        self.routes = routes
        self.k_me = len(routes[rank])
        self.owner_width = [sum(s.col_length for _, s in routes[self.h * L + i]) for i in range(L)]
        self.host_group, self.peer_group = make_host_groups(W, L, rank, timeout_s)

        def buf(x, dtype=torch.int64):
            return torch.tensor(x, dtype=dtype, device=device)

        # stage A: the features of every host's tables, host after host
        self._a_perm = buf([t for ts in self.host_tables for t in ts], torch.int32)
        # stage B (this rank as intermediate of its host): features, then row blocks of the
        # row-sharded ones, ordered by owner
        mine = self.host_tables[self.h]
        rw = [t for t in mine if tables[t].sharding_type == "table_row_wise"]
        self.rw = rw
        self.nb = max([len(tables[t].shards) for t in rw], default=1)
        for t in rw:
            tp = tables[t]
            if tp.row_block_size * self.nb < tp.num_embeddings:
                raise ValueError(f"table {tp.name}: {self.nb} row blocks of {tp.row_block_size} "
                                 f"do not cover its {tp.num_embeddings} rows")
        perm = []
        self.k_owner = []
        for i in range(L):
            r = routes[self.h * L + i]
            self.k_owner.append(len(r))
            for t, s in r:
                if t in rw:
                    block = tables[t].row_block_size
                    perm.append(len(mine) + (s.row_offset // block) * len(rw) + rw.index(t))
                else:
                    perm.append(mine.index(t))
        self._b_perm = buf(perm, torch.int32)
        self._rw_sel = buf([mine.index(t) for t in rw], torch.int32)
        self._rw_blocks = buf([tables[t].row_block_size for t in rw])
        # output: columns of each owner's pooled rows inside its host's block (partials summed),
        # and of each host's block inside the collection's output
        hcol = {}
        off = 0
        for t in mine:
            hcol[t] = off
            off += dims[t]
        self._mid_cols = buf([c for i in range(L) for t, s in routes[self.h * L + i]
                              for c in range(hcol[t] + s.col_offset,
                                             hcol[t] + s.col_offset + s.col_length)])
        self._dest_cols = buf([c for ts in self.host_tables for t in ts
                               for c in range(col0[t], col0[t] + dims[t])])

    # --- input ---------------------------------------------------------------------------------
    def start(self, lengths: torch.Tensor, values: torch.Tensor,
              weights: torch.Tensor | None = None):
        """Stage A payload of this rank's batch -> (payload, per-host lengths counts, per-host
        ids counts); the ids counts travel in the collection's counts exchange. ``weights``:
        the ids' weights, after the ids as int64 words (``input_dist.weight_bits``)."""
        B = lengths.shape[1]
        p_l, p_v, p_w = torch.ops.fbgemm.permute_2D_sparse_data(self._a_perm, lengths, values,
                                                                weights, None)
        per_f = torch.cat([p_l.new_zeros(1), p_l.sum(dim=1).cumsum(0)])
        fb = [0]
        for f in self.F:
            fb.append(fb[-1] + f)
        ids = [int(per_f[fb[h + 1]] - per_f[fb[h]]) for h in range(self.H)]
        payload = pack(p_l.reshape(-1), [f * B for f in fb], p_v, per_f[fb].tolist(), p_w)
        return payload, [f * B for f in self.F], ids

    def send_ids(self, ids: Sequence[int]) -> list[int]:
        """Per-host ids counts of stage A -> per-rank (only this rank's peers get any)."""
        out = [0] * self.W
        for h, n in enumerate(ids):
            out[h * self.L + self.j] = n
        return out

    def exchange_a(self, payload, send_l, send_v, recv_v_by_rank, bs,
                   weighted: bool = False) -> PendingAllToAll:
        """Start stage A; ``recv_v_by_rank[r]``: ids rank r sends to this rank."""
        if self.peer_group is None:
            return _Here(payload)
        wf = 2 if weighted else 1
        peers = [h * self.L + self.j for h in range(self.H)]
        recv = [self.F[self.h] * bs[r] + wf * int(recv_v_by_rank[r]) for r in peers]
        send = [a + wf * b for a, b in zip(send_l, send_v)]
        return all_to_all_1d_async(payload, send, recv, self.peer_group, self.stats,
                                   "hier_input_hosts")

    def mid_sizes(self, bs: Sequence[int]) -> list[int]:
        """Samples each intermediate (local rank j of a host) stands for."""
        return [sum(bs[h * self.L + j] for h in range(self.H)) for j in range(self.L)]

    def receive(self, pending: PendingAllToAll, bs: Sequence[int], weighted: bool = False):
        """Wait for stage A, run stage B -> (lengths [k_me * global batch], ids, weights or
        None) of this rank's host-bound shards, feature-major over the global batch in
        source-rank order."""
        fb = torch.ops.fbgemm
        wf = 2 if weighted else 1
        L, H, F = self.L, self.H, self.F[self.h]
        peers_b = [bs[h * L + self.j] for h in range(H)]
        n = sum(peers_b)
        got = pending.wait()
        recv_l = [F * b for b in peers_b]
        recv_v = []
        off = 0
        for a in recv_l:  # each block is [lengths | ids (| weights)]; ids: the lengths' sum
            recv_v.append(int(got[off: off + a].sum()))
            off += a + wf * recv_v[-1]
        lengths, ids, iw = arrange_received(got, recv_l, recv_v, F, peers_b, weighted)
        lengths = lengths.view(F, n)
        all_l, all_v, all_w = lengths.reshape(-1), ids, iw
        rows = F
        if self.rw:
            sel_l, sel_v, sel_w = fb.permute_2D_sparse_data(self._rw_sel, lengths, ids, iw, None)
            b_l, b_v, b_w, *_ = fb.block_bucketize_sparse_features(
                sel_l.reshape(-1), sel_v, False, False, self._rw_blocks, self.nb, sel_w)
            all_l, all_v = torch.cat([all_l, b_l]), torch.cat([all_v, b_v])
            if weighted:
                all_w = torch.cat([all_w, b_w])
            rows += self.nb * len(self.rw)
        p_l, p_v, p_w = fb.permute_2D_sparse_data(self._b_perm, all_l.view(rows, n), all_v,
                                                  all_w, None)
        per_f = torch.cat([p_l.new_zeros(1), p_l.sum(dim=1).cumsum(0)])
        kb = [0]
        for k in self.k_owner:
            kb.append(kb[-1] + k)
        send_v = [int(per_f[kb[i + 1]] - per_f[kb[i]]) for i in range(L)]
        payload = pack(p_l.reshape(-1), [k * n for k in kb], p_v, per_f[kb].tolist(), p_w)
        mids = self.mid_sizes(bs)
        k = self.k_me
        rl_n = [k * m for m in mids]
        if self.host_group is None:
            got_v, got = send_v, payload
        else:
            got_v = exchange_counts(torch.tensor(send_v, dtype=torch.int64,
                                                 device=p_l.device).view(L, 1),
                                    self.host_group, self.stats,
                                    "hier_input_counts")[:, 0].tolist()
            got = all_to_all_1d(payload, [k_i * n + wf * v for k_i, v in
                                                    zip(self.k_owner, send_v)],
                                [a + wf * b for a, b in zip(rl_n, got_v)], self.host_group,
                                self.stats, "hier_input_local")
        rl, rv, rw = split_received(got, rl_n, got_v, weighted)
        # arrival: [intermediate j][feature][source host][sample] -> [feature][source rank][sample]
        chunk = [0]
        for m in mids:
            chunk.append(chunk[-1] + k * m)
        parts = []
        for r, b in enumerate(bs):
            h, j = divmod(r, L)
            pre = sum(bs[hh * L + j] for hh in range(h))
            base = chunk[j] + torch.arange(k) * mids[j] + pre
            parts.append(base.unsqueeze(1) + torch.arange(b).unsqueeze(0))
        order = torch.cat(parts, dim=1).reshape(-1).to(torch.int32).to(rl.device)
        return fb.permute_1D_sparse_data(order, rl, rv, rw, None)

    # --- output --------------------------------------------------------------------------------
    def output_start(self, pooled: torch.Tensor, bs: Sequence[int], B: int):
        """Stage B' (waited for) and the start of stage A' of this rank's pooled rows
        [global batch, own host-bound width]; -> a function returning [B, sum of host widths]
        in ``dest_cols`` order."""
        L, H = self.L, self.H
        starts = [0]
        for b in bs:
            starts.append(starts[-1] + b)
        mids = self.mid_sizes(bs)
        sel = [torch.arange(starts[h * L + j], starts[h * L + j + 1])
               for j in range(L) for h in range(H)]
        sel_t = torch.cat(sel).to(pooled.device) if sel else torch.zeros(0, dtype=torch.int64)
        w_me = self.owner_width[self.j]
        n_me = mids[self.j]
        mid_flat = pooled.index_select(0, sel_t).reshape(-1)
        if self.host_group is not None:
            ex_b = OutputExchange([(m, w_me) for m in mids],
                                  [(n_me, w) for w in self.owner_width], self.fwd, self.bwd,
                                  self.host_group, self.stats, "hier_output_local",
                                  self.bwd_scale)
            mid_flat = ex_b.finish(ex_b.start(mid_flat))
        pieces, off = [], 0
        for w in self.owner_width:
            pieces.append(mid_flat[off: off + n_me * w].view(n_me, w))
            off += n_me * w
        wide = torch.cat(pieces, dim=1)
        width = self.host_width[self.h]
        mid = wide.new_zeros(n_me, width).index_add(1, self._mid_cols, wide)
        if self.peer_group is None:
            return lambda: mid
        ex_a = OutputExchange([(bs[h * L + self.j], width) for h in range(H)],
                              [(B, w) for w in self.host_width], self.fwd, self.bwd,
                              self.peer_group, self.stats, "hier_output_hosts", self.bwd_scale)
        token = ex_a.start(mid.reshape(-1))

        def finish() -> torch.Tensor:
            got = ex_a.finish(token)
            parts, off = [], 0
            for w in self.host_width:
                parts.append(got[off: off + B * w].view(B, w))
                off += B * w
            return torch.cat(parts, dim=1)

        return finish

    @property
    def dest_cols(self) -> torch.Tensor:
        return self._dest_cols
