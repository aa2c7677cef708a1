"""Per-shard cost and memory model (vectorised over shards with numpy).

Time of one training iteration attributed to the rank that holds a shard, in seconds:

- lookup (compute): the rows the shard serves are read in the forward pass and read + written with
  their optimizer state in the fused backward/update (3 x weight bytes + 2 x state bytes per id), at
  the bandwidth of the shard's tier; a shard spilled below the compute tier with a cache holding a
  fraction ``c`` of its rows hits the cache with probability ``c ** cache_hit_exponent``. Pooled
  outputs and their gradients (fp32) are written/read in the compute tier. A calibrated topology
  adds what it measured per item: per id (``<tier>_id_s``), per distinct row updated
  (``<tier>_row_s``: on a CPU most of a lookup's time) and per pooled vector (``bag_s``), so the
  planner balances the seconds the step-time prediction charges (0 on a preset).
- input distribution: all-to-all of the ids (``index_bytes`` each) and lengths (int32) that the shard
  serves, from every rank; bytes from other ranks of the host move at ``intra_node_bw``, from other
  hosts at ``inter_node_bw``.
- output distribution, forward (``comms.forward`` precision) and backward (``comms.backward``):
  table/column-wise: all-to-all of the pooled vectors of the global batch; row-wise: a ring
  reduce-scatter (forward) / all-gather (backward) of the partial sums over the row shards (at the
  inter-node bandwidth when they span hosts); table-row-wise (hierarchical): reduce-scatter inside
  the host, then all-to-all of the host's 1/local_world_size share across hosts; on more than one
  host, table-column-wise: columns to the sample's peer inside the host, whole vectors across.
  Host-bound types on more than one host take their ids in two stages too: the table's ids cross
  hosts once per sample (at ``inter_node_bw``), the shard's share spreads inside the host.
- data-parallel, as the runtime runs a replica: every replica gathers the ids of the global batch,
  looks them up and applies the same fused update, and the output gradients of the global batch
  are exchanged in backward (``comms.backward`` precision).

Memory of a shard: weights (``weight_precision``) + optimizer state (fp32) in its tier; the cache
(``c`` x those bytes) and I/O buffers (ids, lengths, pooled outputs and gradients) in the compute tier.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .topology import Topology
from .types import OPTIMIZER_STATE, PRECISION_BYTES, TIERS, PlannerOptions

DP, TW, RW, CW, TWRW, TWCW = range(6)  # indices into types.SHARDING_TYPES
TIER_INDEX = {t: i for i, t in enumerate(TIERS)}


@dataclass
class ShardCosts:
    """Arrays (one entry per shard) of seconds and bytes."""

    compute: np.ndarray
    comms: np.ndarray
    storage: np.ndarray  # weights + optimizer state, in the shard's tier
    cache: np.ndarray  # cache bytes in the compute tier
    io: np.ndarray  # I/O buffers in the compute tier

    @property
    def total(self) -> np.ndarray:
        return self.compute + self.comms


def lookup_bytes(ids, distinct_fraction, bags, dim, weight_bytes, opt_row, opt_elem):
    """The bytes a lookup + fused update of ``ids`` ids moves (the cost model's one formula, which
    the planner's shards and the machine's fits, ``cost_fit``, both use): in the shard's tier, a
    row read per id and, per distinct id (``distinct_fraction`` of them), the row and its
    optimizer state (``opt_row`` bytes a row + ``opt_elem`` an element) read and written; in the
    compute tier, the ``bags`` pooled vectors (fp32) and their gradients. All arguments
    broadcast. -> (tier bytes, compute-tier bytes)."""
    opt = opt_row + opt_elem * dim  # optimizer bytes per row
    return (ids * (dim * weight_bytes + distinct_fraction * (2 * dim * weight_bytes + 2 * opt)),
            2 * bags * dim * 4)


class CostModel:
    """Cost of shards of tables on one topology for one local batch size."""

    def __init__(self, topology: Topology, batch_size: int, options: PlannerOptions) -> None:
        self.topo = topology
        self.options = options
        self.B = float(batch_size)
        self.W = topology.world_size
        self.Lw = topology.local_world_size
        self.wb = float(PRECISION_BYTES[options.weight_precision])
        c = options.comms
        self.fb, self.bb = float(PRECISION_BYTES[c.forward]), float(PRECISION_BYTES[c.backward])
        # int8 row-wise quantised vectors carry an fp32 scale and bias each.
        self.f_extra = 8.0 if c.forward == "int8" else 0.0
        self.b_extra = 8.0 if c.backward == "int8" else 0.0
        self.opt_row, self.opt_elem = (4.0 * x for x in OPTIMIZER_STATE[options.optimizer])
        self.ib = float(options.index_bytes)
        self.bw = np.array([max(topology.bandwidth(t), 1.0) for t in TIERS])
        # what calibration measured per item (0 on a preset): seconds per id looked up, per
        # distinct row the fused update writes, per pooled vector (compute tier)
        self.id_s = np.array([topology.id_seconds(t) for t in TIERS])
        self.row_s = np.array([topology.row_seconds(t) for t in TIERS])
        self.bag_s = topology.bag_s
        self.compute_tier = TIER_INDEX[topology.compute_tier]
        W, Lw = self.W, self.Lw
        intra = topology.intra_node_bw or 1.0
        inter = topology.inter_node_bw or 1.0
        self.intra, self.inter = intra, inter
        # seconds per byte that a rank receives from (or sends to) all ranks evenly
        self.a2a = ((Lw - 1) / W) / intra + ((W - Lw) / W) / inter

    # --- helpers ---------------------------------------------------------------------------------
    def hit_rate(self, cache: np.ndarray) -> np.ndarray:
        cache = np.asarray(cache, dtype=float)
        return np.where(cache > 0, np.power(np.maximum(cache, 1e-12),
                                            self.options.cache_hit_exponent), 0.0)

    def seconds_per_byte(self, tier: np.ndarray, cache: np.ndarray) -> np.ndarray:
        """Lookup seconds per byte of a shard in ``tier`` (index into TIERS) with a cache."""
        tier = np.asarray(tier, dtype=np.int64)
        own = 1.0 / self.bw[tier]
        fast = 1.0 / self.bw[self.compute_tier]
        h = self.hit_rate(cache)
        return np.where(tier == self.compute_tier, own, h * fast + (1.0 - h) * own)

    def per_item(self, seconds: np.ndarray, tier: np.ndarray, cache: np.ndarray) -> np.ndarray:
        """A calibrated per-item cost (one value per tier) of a shard in ``tier`` with a cache:
        hits at the compute tier's, misses at the tier's own."""
        tier = np.asarray(tier, dtype=np.int64)
        h = self.hit_rate(cache)
        fast = seconds[self.compute_tier]
        return np.where(tier == self.compute_tier, seconds[tier],
                        h * fast + (1.0 - h) * seconds[tier])

    def ring_bw(self, n: np.ndarray) -> np.ndarray:
        return np.where(np.asarray(n) > self.Lw, self.inter, self.intra)

    def storage_bytes(self, rows, cols) -> np.ndarray:
        rows = np.asarray(rows, dtype=float)
        cols = np.asarray(cols, dtype=float)
        return rows * (cols * (self.wb + self.opt_elem) + self.opt_row)

    # --- the model -------------------------------------------------------------------------------
    def shards(self, kind: int, N, L, F, rows, cols, k, tier, cache, U=1.0) -> ShardCosts:
        """Costs of shards of ``kind`` (DP..TWCW) for tables with N rows, pooling L, F features.

        ``rows``/``cols`` are the shard's extent, ``k`` the number of shards of its table, ``tier``
        the tier index, ``cache`` the cached fraction, ``U`` the distinct fraction of the ids (a
        lookup reads a row per id; the backward reads and writes a row and its optimizer state
        per distinct id). All arguments broadcast.
        """
        N, L, F, rows, cols, k, U = (np.asarray(x, dtype=float)
                                     for x in (N, L, F, rows, cols, k, U))
        tier = np.asarray(tier, dtype=np.int64)
        cache = np.where(tier == self.compute_tier, 0.0, np.asarray(cache, dtype=float))
        B, W, Lw = self.B, float(self.W), float(self.Lw)
        wb, ib = self.wb, self.ib
        spb = self.seconds_per_byte(tier, cache)
        cpb = 1.0 / self.bw[self.compute_tier]
        storage = self.storage_bytes(rows, cols)
        vec = B * W * F  # pooled vectors of the global batch for this table
        # a replica, as the runtime runs it, looks up the global batch and applies the same fused
        # update as every other replica: a whole table-wise shard's compute on every rank
        lookups = vec * L if kind == DP else vec * L * rows / N
        tier_bytes, compute_bytes = lookup_bytes(lookups, U, vec, cols, wb, self.opt_row,
                                                 self.opt_elem)
        compute = (tier_bytes * spb + compute_bytes * cpb
                   + lookups * (self.per_item(self.id_s, tier, cache)
                                + U * self.per_item(self.row_s, tier, cache)) + vec * self.bag_s)
        io = lookups * ib + vec * 4 + 2 * vec * cols * 4
        ids = lookups * ib + vec * 4  # ids and lengths in (a replica: every rank's)
        if kind == DP:  # and in backward every rank's rows of the output gradients out
            comms = (ids + vec * (cols * self.bb + self.b_extra)) * self.a2a
        else:
            comms = ids * self.a2a
            out = vec * (cols * (self.fb + self.bb) + self.f_extra + self.b_extra)
            if kind in (TWRW, TWCW) and W > Lw:
                # two stages (embedding.hierarchical): the table's ids and lengths cross hosts
                # once per sample, to the peer of the sample's rank on this host (the k shards
                # share that cost), then the shard's share spreads inside the host
                comms = ((lookups * ib + vec * 4) * ((Lw - 1) / Lw) / self.intra
                         + vec * (L * ib + 4) * ((W - Lw) / W) / np.maximum(k, 1) / self.inter)
            if kind == RW:
                comms = comms + np.where(k > 1, (k - 1) / np.maximum(k, 1), 0.0) * out / self.ring_bw(k)
            elif kind == TWRW:
                comms = comms + ((Lw - 1) / Lw) * out / self.intra + (out / Lw) * self.a2a
            elif kind == TWCW and W > Lw:
                # column shards go to the sample's peer inside the host, which sends the whole
                # vector across: per shard its columns' share
                comms = comms + ((Lw - 1) / Lw) * out / self.intra + out * ((W - Lw) / W) / self.inter
            else:
                comms = comms + out * self.a2a
        shape = np.broadcast_shapes(np.shape(compute), np.shape(comms), np.shape(storage))
        return ShardCosts(
            compute=np.broadcast_to(compute, shape).astype(float),
            comms=np.broadcast_to(comms, shape).astype(float),
            storage=np.broadcast_to(storage, shape).astype(float),
            cache=np.broadcast_to(cache * storage, shape).astype(float),
            io=np.broadcast_to(io, shape).astype(float),
        )


def column_splits(dim: int, k: int, granularity: int) -> list[int]:
    """Widths of ``k`` column shards: multiples of ``granularity`` (the first ones one unit wider)."""
    if k == 1:
        return [dim]
    units = dim // granularity
    base, extra = divmod(units, k)
    return [(base + (1 if i < extra else 0)) * granularity for i in range(k)]


def row_blocks(rows: int, k: int) -> list[tuple[int, int]]:
    """Contiguous blocks of ``ceil(rows / k)`` rows (the last shorter; empty blocks dropped), the
    layout fbgemm's ``block_bucketize_sparse_features`` expects."""
    block = -(-rows // k)
    return [(off, min(block, rows - off)) for off in range(0, rows, block)]
