"""Sharded embedding collection: one rank's part of a ShardingPlan, executed on torch.distributed.

One file (over 500 lines): it is one object, the collection, whose steps share its state (the
shards, the permutes and splits computed once from the plan, the pending exchange of a started
batch) and run as one collective sequence every rank takes in the same order; the stages that
stand alone already live beside it (``input_dist.py``, ``hierarchical.py``, ``columns.py``,
``sharded_autograd.py``).

Every shard a rank owns lives in one fbgemm table-batched embedding (optimizer fused into backward).
A forward pass, for a local batch of B samples (B may differ between ranks, even be 0):

1. input distribution: row-sharded features (row_wise) are split by row block with
   fbgemm's ``block_bucketize_sparse_features`` (ids become shard-local); one
   ``permute_2D_sparse_data`` then orders (and, for column shards, repeats) the features by
   destination rank; per-destination batch sizes and id counts are exchanged, then lengths and ids
   go out in two all-to-alls;
2. the owner looks up the ids of every rank's samples at once (global batch, source-rank order);
3. output distribution: pooled rows go back to their samples' ranks in one all-to-all; there one
   column placement (``columns.place_columns``, with the hierarchical and replicated pieces)
   puts table-wise and column-shard columns in place and sums row-wise partial results (the
   reduce-scatter, as all-to-all + local sum, in the same collective as everything else).

Steps 1 and 3 are flat (one all-to-all among all ranks) for table_wise, row_wise and
column_wise. When the plan spans more than one host, the host-bound types (table_row_wise,
table_column_wise) take two-stage exchanges instead, inside the host and across hosts between
peers (``recscale.embedding.hierarchical``); their shards are looked up together with the flat
ones, on the same global batch order. (On one host the two stages would be the flat exchange.)

The backward of each collective is the transposed collective, so the gradients of pooled outputs
reach the owning ranks, whose fused kernels update the shards in place.

Data-parallel tables are replicated in a second fbgemm module: every rank looks up the global
batch's ids (all-gathered) and keeps its own rows; in backward the output gradients are
all-gathered, so every replica applies the identical fused update for the whole global batch.
That keeps the replicas bitwise equal and the update exactly the single-process one, also for the
row-wise Adagrad state, which an all-reduce of per-replica updates would not reproduce.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn

from recscale.comm import CommsConfig
from recscale.comm.codecs import get_codec
from recscale.comm.collectives import (
    CommStats,
    OutputExchange,
    all_to_all_1d_async,
    exchange_counts,
)
from recscale.data.batch import SparseFeatures
from recscale.embedding.api import TableShard, gather_tables
from recscale.embedding.columns import columns_in_order, inverse_permutation, place_columns
from recscale.embedding.hierarchical import HierarchicalExchange
from recscale.embedding.input_dist import InputDist, Routes, arrange_received, pack
from recscale.embedding.sharded_autograd import (
    ColumnShardRowwiseAdagrad,
    GradScale,
    OwnRowsGatherGrad,
)
from recscale.embedding.tbe import (
    EmbeddingOptimizerConfig,
    FusedEmbeddingBags,
    InitSlice,
    table_init,
)
from recscale.embedding.tier_config import TierConfig
from recscale.embedding.tier_placement import build_embedding_bags, placement_for
from recscale.sharding import ShardingPlan


class ShardedEmbeddingCollection(nn.Module):
    """This rank's shards of every table of ``plan``; forward(local sparse) -> pooled [B, sum(D)].
    An ``EmbeddingCollection``: ``start`` begins a batch's input distribution, ``lookup``
    completes it (deferring the output exchange when ``overlap_output``).

    ``feature_names``: the order of the input features (one table per feature); the output columns
    follow it. Works for any mix of the six sharding types.
    """

    def __init__(
        self,
        plan: ShardingPlan,
        feature_names: Sequence[str],
        optimizer: EmbeddingOptimizerConfig,
        rank: int,
        world_size: int,
        seed: int = 0,
        group=None,
        device: torch.device | str = "cpu",
        stats: CommStats | None = None,
        output_grad_scale: float = 1.0,
        comms: CommsConfig | None = None,
        tiers: TierConfig | None = None,
        timeout_s: float | None = None,
    ):
        """``tiers``: settings for shards the plan puts below the compute tier (DDR/SSD behind a
        cache; see recscale.embedding.placement). ``timeout_s``: deadline of the sub-groups the
        host-bound tables' exchanges use. ``stats`` counts bytes as intra- or inter-host by the
        plan's hosts (set here when it has none)."""
        super().__init__()
        self.comms = comms or CommsConfig()
        self.fwd_codec = get_codec(self.comms.forward)
        self.bwd_codec = get_codec(self.comms.backward)
        self.bwd_scale = self.comms.loss_scale if self.comms.backward == "fp16" else 1.0
        # The sharded trainer makes each rank's loss W x its share of the global mean, so DDP's
        # gradient averaging gives the dense layers the global-mean gradient; the embeddings,
        # whose gradients from all ranks are summed by the transposed all-to-all, take 1/W.
        self.output_grad_scale = output_grad_scale
        if plan.world_size != world_size:
            raise ValueError(f"the plan is for world_size={plan.world_size}, this run has {world_size}")
        self.rank, self.world_size, self.group = rank, world_size, group
        self.stats = stats if stats is not None else CommStats()
        if self.stats.hosts is None:
            self.stats.hosts = tuple(plan.topology.host_of(r) for r in range(world_size))
        self.device = torch.device(device)
        by_feature = {}
        for tp in plan.tables:
            for f in tp.feature_names:
                by_feature[f] = tp
        missing = [f for f in feature_names if f not in by_feature]
        if missing:
            raise ValueError(f"the sharding plan has no table for feature(s) {missing}")
        self.tables = [by_feature[f] for f in feature_names]
        T = len(self.tables)
        self.num_tables = T
        self.dims = [tp.embedding_dim for tp in self.tables]
        col0 = [0]
        for d in self.dims:
            col0.append(col0[-1] + d)
        self.output_dim = col0[-1]
        self._placements: dict = {}  # see _placement

        lay = Routes.of(self.tables, col0, world_size, plan.topology.num_hosts)
        dp, rw, hier, hier_routes = lay.dp, lay.rw, lay.hier, lay.hier_routes
        self.dp_tables, self.rw_tables = dp, rw
        # routes[d]: the (table, shard) pairs rank d serves, in its module's table order: the
        # flat path's first, then the host-bound tables'
        self.routes = [f + h for f, h in zip(lay.flat, hier_routes)]
        self.k = [len(r) for r in lay.flat]  # flat path only
        self.widths = lay.widths
        self.register_buffer("_perm", torch.tensor(lay.perm, dtype=torch.int32), persistent=False)
        self.register_buffer("_rw_idx", torch.tensor(rw, dtype=torch.int32), persistent=False)
        self.register_buffer("_rw_blocks", torch.tensor(
            [self.tables[t].row_block_size for t in rw], dtype=torch.int64), persistent=False)
        self.register_buffer("_dest_cols", torch.tensor(lay.dest_cols, dtype=torch.int64),
                             persistent=False)
        self.hier = None
        if hier:
            self.hier = HierarchicalExchange(
                self.tables, hier, hier_routes, col0, plan.topology.local_world_size, rank,
                world_size, self.stats, self.fwd_codec, self.bwd_codec, self.bwd_scale,
                self.device, timeout_s)
        # Row-wise Adagrad keeps one state per table row, over all its columns; a table split
        # into column shards therefore needs the shards to agree on it. Those shards are updated
        # here (not by fbgemm's fused kernel, which only sees its own columns): each shard's
        # per-row sums of squared gradients are exchanged with the table's other shards.
        self.optimizer = optimizer
        self.cw_tables = []
        if optimizer.name == "exact_rowwise_adagrad":
            self.cw_tables = [t for t, tp in enumerate(self.tables)
                              if tp.sharding_type in ("column_wise", "table_column_wise")
                              and len(tp.shards) > 1]
        self.cw_holders = {t: sorted({s.rank for s in self.tables[t].shards}) for t in self.cw_tables}
        # the rate in effect (the schedule sets it on every fused module and here, for the
        # column shards' own update)
        self.optimizer_config = optimizer
        self.learning_rate = float(optimizer.learning_rate)
        mine = self.routes[rank]
        self._fused_pos = [i for i, (t, _) in enumerate(mine) if t not in self.cw_tables]
        self._cw_pos = [i for i, (t, _) in enumerate(mine) if t in self.cw_tables]

        def init(t, s):
            return table_init(seed, t, self.tables[t].num_embeddings, self.dims[t])[
                s.row_offset: s.row_offset + s.row_length, s.col_offset: s.col_offset + s.col_length]

        self.local = None
        # shards below the compute tier (the plan's tier + cache fraction) train behind a cache
        places = [placement_for(mine[i][1].tier, plan.topology.compute_tier,
                                mine[i][1].cache_fraction, self.device.type, tiers)
                  for i in self._fused_pos]
        # only a software cache over a slow tier does anything with the next batch's ids
        self._prefetching = any(p.kind in ("ddr", "ssd") for p in places)
        if any(p.kind != "memory" for p in places):
            self.local = build_embedding_bags(
                [mine[i][1].row_length for i in self._fused_pos],
                [mine[i][1].col_length for i in self._fused_pos], optimizer, places, tiers,
                device=device, seed=seed, store_prefix=f"rank{rank}-",
                init_slices=[InitSlice(t, self.tables[t].num_embeddings, self.dims[t],
                                       s.row_offset, s.col_offset)
                             for t, s in (mine[i] for i in self._fused_pos)])
        elif self._fused_pos:
            self.local = FusedEmbeddingBags(
                [mine[i][1].row_length for i in self._fused_pos],
                [mine[i][1].col_length for i in self._fused_pos], optimizer, device=device,
                initial_weights=[init(*mine[i]) for i in self._fused_pos])
        self.cw_weights = [init(*mine[i]).to(device) for i in self._cw_pos]
        self.cw_state = {t: torch.zeros(self.tables[t].num_embeddings, device=device)
                         for t in sorted({mine[i][0] for i in self._cw_pos})}
        self._anchor = nn.Parameter(torch.zeros(1, device=device))  # gives the CW op a grad path
        if self._cw_pos or self.cw_tables:
            sel = self._fused_pos + self._cw_pos
            self.register_buffer("_local_split", torch.tensor(sel, dtype=torch.int32),
                                 persistent=False)
            # columns of [fused | cw] outputs back into route order
            cols = columns_in_order([s.col_length for _, s in mine], sel)
            self.register_buffer("_local_cols", torch.tensor(cols, dtype=torch.int64),
                                 persistent=False)
            self.register_buffer("_local_dest", torch.argsort(self._local_cols), persistent=False)
        self.dp = None
        if dp:
            self.register_buffer("_dp_idx", torch.tensor(dp, dtype=torch.int32), persistent=False)
            dp_cols = [c for t in dp for c in range(col0[t], col0[t + 1])]
            self.register_buffer("_dp_cols", torch.tensor(dp_cols, dtype=torch.int64), persistent=False)
            self.dp = FusedEmbeddingBags(
                [self.tables[t].num_embeddings for t in dp], [self.dims[t] for t in dp], optimizer,
                device=device, seed=seed, table_ids=dp)
        self.last_batch_sizes: list[int] = []
        # DLRM.forward: hand the dense arch a deferred lookup (finish_deferred) so the output
        # all-to-all overlaps the bottom MLP; set from train.pipeline
        self.overlap_output = False
        self.to(self.device)  # the index buffers live with the ids they permute (CUDA or CPU)

    def set_embedding_learning_rate(self, lr: float) -> None:
        """The column shards' rate (their update is ``ColumnShardRowwiseAdagrad``'s); the fused
        modules inside take theirs from ``recscale.embedding.set_learning_rate``."""
        self.learning_rate = float(lr)

    # ----------------------------------------------------------------------------------------
    def forward(self, sparse: SparseFeatures | InputDist) -> torch.Tensor:
        """Pooled embeddings [B, sum(D)] of this rank's samples. ``sparse`` may be the result of
        an earlier ``start(...)`` (the pipelined trainer starts the next batch's input
        distribution while the current batch computes)."""
        pending = sparse if isinstance(sparse, InputDist) else self.start(sparse)
        return self.finish(pending)

    def start(self, sparse: SparseFeatures) -> InputDist:
        """Input distribution up to the ids all-to-alls, which are left in flight."""
        W = self.world_size
        lengths, values, weights = sparse.lengths, sparse.values, sparse.weights
        wf = 2 if weights is not None else 1  # words per id on the wire (id, weight's bits)
        T, B = lengths.shape
        if T != self.num_tables:
            raise ValueError(f"expected {self.num_tables} features, got {T}")
        fb = torch.ops.fbgemm
        all_lengths, all_values, all_weights = lengths.reshape(-1), values, weights
        if self.rw_tables:
            sel_l, sel_v, sel_w = fb.permute_2D_sparse_data(self._rw_idx, lengths, values,
                                                            weights, None)
            b_l, b_v, b_w, *_ = fb.block_bucketize_sparse_features(
                sel_l.reshape(-1), sel_v, False, False, self._rw_blocks, W, sel_w)
            all_lengths = torch.cat([all_lengths, b_l])
            all_values = torch.cat([values, b_v])
            if weights is not None:
                all_weights = torch.cat([weights, b_w])
        rows = T + W * len(self.rw_tables)
        p_l, p_v, p_w = fb.permute_2D_sparse_data(self._perm, all_lengths.view(rows, B),
                                                  all_values, all_weights, None)
        per_feature = p_l.sum(dim=1)
        bounds = torch.tensor([0] + self.k).cumsum(0)
        csum = torch.cat([per_feature.new_zeros(1), per_feature.cumsum(0)])
        vals_to = (csum[bounds[1:]] - csum[bounds[:-1]])
        dp_l = dp_v = dp_w = None
        n_dp = 0
        if self.dp is not None:
            dp_l, dp_v, dp_w = fb.permute_2D_sparse_data(self._dp_idx, lengths, values, weights,
                                                         None)
            n_dp = int(dp_v.numel())
        dev = values.device
        cols = [torch.full((W,), B, dtype=torch.int64, device=dev), vals_to.to(dev),
                torch.full((W,), n_dp, dtype=torch.int64, device=dev)]
        if self.hier is not None:  # ids of the host-bound tables' stage A, per peer
            h_payload, h_send_l, h_send_v = self.hier.start(lengths, values, weights)
            cols.append(torch.tensor(self.hier.send_ids(h_send_v), dtype=torch.int64, device=dev))
        got = exchange_counts(torch.stack(cols, dim=1), self.group, self.stats, "input_counts")
        bs = got[:, 0].tolist()
        pend = InputDist(B=B, bs=bs, device=values.device, weighted=weights is not None)
        if self.hier is not None:
            pend.hier = self.hier.exchange_a(h_payload, h_send_l, h_send_v, got[:, 3].tolist(), bs,
                                             pend.weighted)
        if any(self.k):
            # lengths and ids (and weights) of each destination travel together in one all-to-all
            send_l = [kd * B for kd in self.k]
            pend.recv_l = [self.k[self.rank] * b for b in bs]
            pend.recv_v = got[:, 1].tolist()
            payload = pack(p_l.reshape(-1), [0, *itertools.accumulate(send_l)], p_v,
                           csum[bounds].tolist(), p_w)
            pend.sharded = all_to_all_1d_async(
                payload, [a + wf * int(b) for a, b in zip(send_l, vals_to)],
                [a + wf * b for a, b in zip(pend.recv_l, pend.recv_v)], self.group, self.stats,
                "input")
        if self.dp is not None:
            # all-gather (lengths and ids together) as an all-to-all of W copies: uneven batch
            # sizes are fine
            mine = pack(dp_l.reshape(-1), [0, dp_l.numel()], dp_v, [0, n_dp], dp_w)
            pend.dp_recv_l = [len(self.dp_tables) * b for b in bs]
            pend.dp_recv_v = got[:, 2].tolist()
            pend.dp = all_to_all_1d_async(
                mine.repeat(W), [mine.numel()] * W,
                [a + wf * b for a, b in zip(pend.dp_recv_l, pend.dp_recv_v)], self.group,
                self.stats, "dp_input")
        return pend

    def _local_ids(self, pend: InputDist, bg: int) -> tuple[torch.Tensor, ...]:
        """The received ids as the local lookup takes them, once per batch (the prefetch and
        the lookup share them): SparseFeatures of the fused module's features, then (lengths,
        ids, weights) of the column shards' (empty without column shards)."""
        if pend.local is None:
            k = len(self.routes[self.rank])
            l2, v2, w2 = self._received(pend)
            lengths = l2.view(k, bg)
            if not self.cw_tables:
                pend.local = (SparseFeatures(("",) * k, v2, lengths, w2),
                              (lengths[:0], v2[:0], None if w2 is None else w2[:0]))
            else:
                sl, sv, sw = torch.ops.fbgemm.permute_2D_sparse_data(self._local_split, lengths,
                                                                     v2, w2, None)
                nf = len(self._fused_pos)
                cut = int(sl[:nf].sum())
                pend.local = (SparseFeatures(("",) * nf, sv[:cut], sl[:nf],
                                             None if sw is None else sw[:cut]),
                              (sl[nf:], sv[cut:], None if sw is None else sw[cut:]))
        return pend.local

    def _lookup(self, pend: InputDist, bg: int) -> torch.Tensor:
        """Pooled rows of every local shard, [global batch, width], in route order."""
        fused, (cw_l, cw_v, cw_w) = self._local_ids(pend, bg)
        if not self.cw_tables:
            if self.local is None:
                return torch.zeros(bg, 0, device=pend.device, requires_grad=True)
            return self.local(fused)
        parts = []
        if self.local is not None:
            parts.append(self.local(fused))
        parts.append(ColumnShardRowwiseAdagrad.apply(self._anchor, self, cw_l, cw_v, cw_w))
        return place_columns(parts, [(p.shape[1],) for p in parts], self._local_dest,
                             self._local_cols, len(self._local_cols), bg)

    def _received(self, pend: InputDist) -> tuple[torch.Tensor, torch.Tensor]:
        """Wait for a batch's ids and order them for the local lookup (once per batch): the flat
        path's features, then the host-bound tables' (their stage B runs here)."""
        if pend.received is None:
            parts = []
            if pend.sharded is not None:
                parts.append(arrange_received(pend.sharded.wait(), pend.recv_l, pend.recv_v,
                                              self.k[self.rank], pend.bs, pend.weighted))
            if pend.hier is not None:
                parts.append(self.hier.receive(pend.hier, pend.bs, pend.weighted))
            if len(parts) == 1:
                pend.received = parts[0]
            else:
                pend.received = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]),
                                 torch.cat([p[2] for p in parts]) if pend.weighted else None)
        return pend.received

    def _has_lookup(self, pend: InputDist) -> bool:
        return pend.sharded is not None or pend.hier is not None

    def lookup(self, started: SparseFeatures | InputDist):
        """Pooled embeddings [B, sum(D)] of a batch (or of what ``start`` returned); with
        ``overlap_output``, a function that completes the output exchange (``finish_deferred``)
        instead, called by the dense arch after the bottom MLP."""
        pend = self.start(started) if isinstance(started, SparseFeatures) else started
        if self.overlap_output:
            return self.finish_deferred(pend)
        return self.finish(pend)

    def prefetch(self, started: SparseFeatures | InputDist) -> None:
        """Pipelining stage for shards on a slow tier: take the next batch's ids (waiting for its
        input all-to-all) and name them to the cache, which loads them while the current batch
        computes. Nothing happens (no wait) when no local shard is on a slow tier, or for a
        batch whose input distribution has not started (its ids are not routed yet)."""
        if (not self._prefetching or not isinstance(started, InputDist)
                or not self._has_lookup(started)):
            return
        fused, _ = self._local_ids(started, sum(started.bs))
        self.local.prefetch(fused)

    def flush(self) -> None:
        """Write every slow-tier shard's dirty cached rows back (before a checkpoint reads
        ``shards()``; reading the views flushes too)."""
        if self.local is not None:
            self.local.flush()

    def close(self) -> None:
        """Release the slow-tier shards' scratch files and prefetch thread."""
        if self.local is not None:
            self.local.close()

    def tier_stats(self) -> dict[str, float]:
        """Hit rate, rows/bytes read and written per slow tier, prefetch seconds ({} if none)."""
        return self.local.tier_stats() if self.local is not None else {}

    def _placement(self, kinds: tuple[str, ...], cols: list[torch.Tensor]
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The output columns ``cols`` of the pieces of ``kinds`` side by side, and their inverse
        where they fill the output once (see ``columns.place_columns``); cached per combination
        (and device: buffers follow .to())."""
        key = (kinds, str(cols[0].device))
        if key not in self._placements:
            c = torch.cat(cols)
            self._placements[key] = (c, inverse_permutation(c, self.output_dim))
        return self._placements[key]

    def finish(self, pend: InputDist) -> torch.Tensor:
        """Wait for the ids, look up, send pooled rows home, assemble."""
        return self.finish_deferred(pend)()

    def finish_deferred(self, pend: InputDist):
        """Look up and start sending pooled rows home; -> a function that waits for them and
        assembles [B, sum(D)]. What runs between the two (the bottom MLP) overlaps the output
        all-to-all, and in backward the bottom MLP's backward overlaps the gradients' return.
        The arithmetic is the same either way: results are bitwise those of ``finish``."""
        me, B, bs = self.rank, pend.B, pend.bs
        self.last_batch_sizes = bs
        bg = sum(bs)
        exchange = token = mine = hier_done = None
        if self._has_lookup(pend):
            pooled = self._lookup(pend, bg)
            wd = self.widths[me]
            if pend.sharded is not None:
                exchange = OutputExchange([(b, wd) for b in bs], [(B, w) for w in self.widths],
                                          self.fwd_codec, self.bwd_codec, self.group, self.stats,
                                          "output", self.bwd_scale)
                token = exchange.start(pooled[:, :wd].reshape(-1))
            if pend.hier is not None:
                hier_done = self.hier.output_start(pooled[:, wd:], bs, B)
        if pend.dp is not None:
            k_dp = len(self.dp_tables)
            l2, v2, w2 = arrange_received(pend.dp.wait(), pend.dp_recv_l, pend.dp_recv_v, k_dp, bs,
                                          pend.weighted)
            full = self.dp(SparseFeatures(("",) * k_dp, v2, l2.view(k_dp, bg), w2))
            mine = OwnRowsGatherGrad.apply(full, sum(bs[:me]), bs, me, self.group, self.stats,
                                            self.bwd_codec, self.bwd_scale)

        def complete() -> torch.Tensor:
            sources, blocks, kinds, dest = [], [], [], []
            if exchange is not None:
                sources.append(exchange.finish(token))
                blocks.append(self.widths)
                kinds.append("flat")
                dest.append(self._dest_cols)
            if hier_done is not None:
                got = hier_done()
                sources.append(got)
                blocks.append((got.shape[1],))
                kinds.append("hier")
                dest.append(self.hier.dest_cols)
            if mine is not None:
                sources.append(mine)
                blocks.append((mine.shape[1],))
                kinds.append("dp")
                dest.append(self._dp_cols)
            cols, inv = self._placement(tuple(kinds), dest)
            out = place_columns(sources, blocks, cols, inv, self.output_dim, B)
            if self.output_grad_scale != 1.0:
                out = GradScale.apply(out, self.output_grad_scale)
            return out

        return complete

    # ----------------------------------------------------------------------------------------
    def table_shapes(self) -> list[tuple[int, int]]:
        return [(int(tp.num_embeddings), int(tp.embedding_dim)) for tp in self.tables]

    def shards(self, replicated: bool = True) -> list[TableShard]:
        """This rank's pieces of every table with weight and optimizer-state views (what a
        checkpoint saves and restores into): its shards, and when ``replicated`` the
        data-parallel tables, which every rank holds whole."""
        out = []
        mine = self.routes[self.rank]
        if self.local is not None:
            for i, sh in zip(self._fused_pos, self.local.shards()):
                t, s = mine[i]
                out.append(TableShard(t, s.row_offset, s.col_offset, sh.weight, sh.states))
        for i, w in zip(self._cw_pos, self.cw_weights):
            t, s = mine[i]
            out.append(TableShard(t, s.row_offset, s.col_offset, w, [self.cw_state[t]]))
        if replicated and self.dp is not None:
            out += [TableShard(t, 0, 0, sh.weight, sh.states)
                    for t, sh in zip(self.dp_tables, self.dp.shards())]
        return out

    def memory_bytes(self) -> dict[str, int]:
        """Bytes per tier of this rank's weights and optimizer state: ``fast`` (the compute
        tier, slow-tier shards' caches included) and each slow tier's shards."""
        out = {"fast": sum(w.numel() * w.element_size() for w in self.cw_weights)
               + sum(x.numel() * x.element_size() for x in self.cw_state.values())}
        for mod in (self.local, self.dp):
            if mod is not None:
                for k, v in mod.memory_bytes().items():
                    out[k] = out.get(k, 0) + v
        return out

    def full_tables(self, dst: int = 0) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]] | None:
        """Assemble every table's full weights [rows, dim] and optimizer state on rank ``dst``
        (None elsewhere). Row-wise optimizer state of column shards: each shard keeps its own
        (see docs/architecture.md); the assembled table takes the first column shard's."""
        got = gather_tables(self.shards(replicated=False), [(tp.num_embeddings, tp.embedding_dim)
                                                            for tp in self.tables],
                            self.rank, self.world_size, dst, self.group)
        if got is None:
            return None
        tables, states = got
        if self.dp is not None:
            for t, sh in zip(self.dp_tables, self.dp.shards()):
                tables[t] = sh.weight.detach().cpu().clone()
                states[t] = [x.detach().cpu().clone() for x in sh.states]
        return tables, states
