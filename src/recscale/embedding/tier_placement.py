"""Where each table lives, and one module for tables on different tiers.

- ``Placement`` / ``placement_for``: a plan's shard tier and cache fraction -> how the runtime
  holds the table: ``memory`` (the compute tier), ``managed`` (CUDA: fbgemm's MANAGED_CACHING,
  host memory behind an HBM cache; ``managed_caching_bags``) or ``ddr`` / ``ssd``
  (``TieredEmbeddingBags``, the software cache over a slow tier).
- ``build_embedding_bags``: one ``EmbeddingCollection`` for tables with given placements, all
  starting from the same initial values whatever the placement.
- ``MultiTierEmbeddingBags``: groups of tables on different placements behind one interface.
- ``merge_tier_stats``: the tier counters of several modules (or ranks) as one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from recscale.data.batch import SparseFeatures
from recscale.embedding.api import LocalCollection
from recscale.embedding.cache import TieredEmbeddingBags
from recscale.embedding.columns import place_columns
from recscale.embedding.tbe import EmbeddingOptimizerConfig, FusedEmbeddingBags, InitSlice
from recscale.embedding.tier_config import TierConfig


def merge_tier_stats(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """Sum the counters of several modules; hit rate over all their lookups."""
    out: dict[str, float] = {}
    for p in parts:
        for k, v in p.items():
            if k != "hit_rate":
                out[k] = out.get(k, 0) + v
    if out:
        out["hit_rate"] = out["hits"] / out["lookups"] if out.get("lookups") else float("nan")
    return out


# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """Where one table lives: ``memory`` (the compute tier), ``managed`` (CUDA: fbgemm
    MANAGED_CACHING in host memory), ``ddr`` or ``ssd`` (TieredEmbeddingBags)."""

    kind: str = "memory"
    cache_fraction: float = 0.0


def placement_for(tier: str, compute_tier: str, cache_fraction: float, device_type: str,
                  config: TierConfig | None = None) -> Placement:
    """A plan's shard tier -> how the runtime holds it. The compute tier is plain memory (HBM on
    a GPU; on the CPU the tables are in RAM either way); DDR on CUDA is fbgemm's MANAGED_CACHING;
    other slow tiers are the software cache. ``config.cache_fraction`` overrides the plan's."""
    if tier == compute_tier:
        return Placement("memory")
    c = cache_fraction
    if config is not None and config.cache_fraction is not None:
        c = config.cache_fraction
    if device_type == "cuda" and tier == "ddr":
        return Placement("managed", c)
    return Placement(tier, c)


def managed_caching_bags(rows: Sequence[int], dims: Sequence[int],
                         optimizer: EmbeddingOptimizerConfig, cache_fraction: float,
                         policy: str = "lru", device: torch.device | str = "cuda", seed: int = 0,
                         table_ids: Sequence[int] | None = None,
                         initial_weights: Sequence[torch.Tensor] | None = None
                         ) -> FusedEmbeddingBags:
    """CUDA only: tables in host memory (UVM) behind fbgemm's HBM cache of ``cache_fraction`` x
    rows (EmbeddingLocation.MANAGED_CACHING), LRU or LFU. ``split_weights()`` flushes and empties
    the HBM cache first."""
    return FusedEmbeddingBags(rows, dims, optimizer, device=device, seed=seed, table_ids=table_ids,
                              initial_weights=initial_weights, cache_fraction=cache_fraction,
                              cache_policy=policy)


def _same_batch(a: SparseFeatures, b: SparseFeatures) -> bool:
    """The same ids in memory: ``b`` is ``a`` or a view of the same tensors (the sharded
    collection names its received ids to the cache and looks them up through fresh views)."""
    return all(x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.stride() == y.stride()
               and x.dtype == y.dtype for x, y in ((a.values, b.values), (a.lengths, b.lengths)))


class MultiTierEmbeddingBags(LocalCollection):
    """Tables with different placements behind one ``EmbeddingCollection``: each group of tables
    is one module; the features are permuted to the groups (one fbgemm permute) and the pooled
    columns put back in table order (exact copies). A batch named by ``prefetch`` is split once:
    its forward takes the groups' parts the prefetch made (the cache then knows them as the
    batch it prefetched without comparing ids)."""

    def __init__(self, groups: Sequence[tuple[Sequence[int], LocalCollection]],
                 dims: Sequence[int]):
        super().__init__()
        self.dims = tuple(int(d) for d in dims)
        self.rows = None
        self.group_tables = [list(ts) for ts, _ in groups]
        self.groups = nn.ModuleList([m for _, m in groups])
        order = [t for ts in self.group_tables for t in ts]
        if sorted(order) != list(range(len(self.dims))):
            raise ValueError(f"groups must cover tables 0..{len(self.dims) - 1} once: {order}")
        # only a software cache does anything with the next batch's ids: skip the permute else
        self._prefetching = any(isinstance(m, TieredEmbeddingBags) for m in self.groups)
        # the batches named by prefetch and not yet looked up, with their parts: the loop names
        # batch i + 1 before it looks up batch i, so two at most
        self._named: list[tuple[SparseFeatures, list[SparseFeatures]]] = []
        self.register_buffer("_perm", torch.tensor(order, dtype=torch.int32), persistent=False)
        col0 = np.concatenate([[0], np.cumsum(self.dims)])
        cols = [c for t in order for c in range(col0[t], col0[t + 1])]
        inv = np.empty(len(cols), dtype=np.int64)
        inv[cols] = np.arange(len(cols))
        self.register_buffer("_cols", torch.from_numpy(inv), persistent=False)
        self.register_buffer("_dest", torch.tensor(cols, dtype=torch.int64), persistent=False)

    def _split(self, sparse: SparseFeatures) -> list[SparseFeatures]:
        B = sparse.lengths.shape[1]
        p_l, p_v, p_w = torch.ops.fbgemm.permute_2D_sparse_data(
            self._perm, sparse.lengths.view(len(self.dims), B), sparse.values, sparse.weights,
            None)
        counts = p_l.sum(1).tolist()
        out, f, v = [], 0, 0
        for ts in self.group_tables:
            n = int(sum(counts[f: f + len(ts)]))
            out.append(SparseFeatures(("",) * len(ts), p_v[v: v + n], p_l[f: f + len(ts)],
                                      None if p_w is None else p_w[v: v + n]))
            f, v = f + len(ts), v + n
        return out

    def _parts(self, sparse: SparseFeatures) -> list[SparseFeatures]:
        """The groups' parts of a batch: those its prefetch made, else a new split (a batch
        never named, or an older one named and not looked up, is dropped from the list)."""
        for i, (named, parts) in enumerate(self._named):
            if _same_batch(named, sparse):
                del self._named[: i + 1]
                return parts
        return self._split(sparse)

    def forward(self, sparse: SparseFeatures) -> torch.Tensor:
        parts = [m(s) for m, s in zip(self.groups, self._parts(sparse))]
        # the groups' columns back into table order: a gather both ways (columns.place_columns)
        return place_columns(parts, [(p.shape[1],) for p in parts], self._dest, self._cols,
                             len(self._dest), sparse.lengths.shape[1])

    def prefetch(self, started: SparseFeatures) -> None:
        if self._prefetching:
            parts = self._split(started)
            self._named = [*self._named[-1:], (started, parts)]
            for m, s in zip(self.groups, parts):
                m.prefetch(s)

    def _by_table(self, per_group: list[list]) -> list:
        out = [None] * len(self.dims)
        for ts, items in zip(self.group_tables, per_group):
            for t, x in zip(ts, items):
                out[t] = x
        return out

    def split_weights(self) -> list[torch.Tensor]:
        return self._by_table([m.split_weights() for m in self.groups])

    def split_optimizer_states(self) -> list[list[torch.Tensor]]:
        per = [m.split_optimizer_states() for m in self.groups]
        if not any(per):
            return []
        return self._by_table(per)

    def flush(self) -> None:
        for m in self.groups:
            m.flush()

    def close(self) -> None:
        for m in self.groups:
            m.close()

    def tier_stats(self) -> dict[str, float]:
        return merge_tier_stats([m.tier_stats() for m in self.groups])

    def memory_bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in self.groups:
            for k, v in m.memory_bytes().items():
                out[k] = out.get(k, 0) + v
        return out


def build_embedding_bags(
    rows: Sequence[int],
    dims: Sequence[int],
    optimizer: EmbeddingOptimizerConfig,
    placements: Sequence[Placement] | None = None,
    config: TierConfig | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
    init_slices: Sequence[InitSlice] | None = None,
    store_prefix: str = "tiered-",
) -> LocalCollection:
    """One embedding module for tables with the given placements: FusedEmbeddingBags when all
    are in memory, a TieredEmbeddingBags when all share one slow tier, else a
    MultiTierEmbeddingBags of groups. Initial weights: ``init_slices`` (default: whole tables
    0..T-1 from ``seed``), so every placement starts from the same values."""
    T = len(rows)
    placements = list(placements or [Placement()] * T)
    init_slices = list(init_slices or [InitSlice(t, int(r), int(d))
                                       for t, (r, d) in enumerate(zip(rows, dims))])
    config = config or TierConfig()
    groups: dict[tuple, list[int]] = {}
    for t, p in enumerate(placements):
        key = (p.kind, p.cache_fraction) if p.kind == "managed" else (p.kind,)
        groups.setdefault(key, []).append(t)
    mods = []
    for key, ts in groups.items():
        r, d = [rows[t] for t in ts], [dims[t] for t in ts]
        if key[0] in ("memory", "managed"):
            init = [init_slices[t].materialize(seed, rows[t], dims[t]) for t in ts]
            if key[0] == "memory":
                m = FusedEmbeddingBags(r, d, optimizer, device=device, initial_weights=init)
            else:
                m = managed_caching_bags(r, d, optimizer, key[1], config.policy, device,
                                         initial_weights=init)
        else:
            cfg = dataclasses.replace(config, tier=key[0])
            m = TieredEmbeddingBags(r, d, optimizer, device=device, seed=seed, config=cfg,
                                    cache_fractions=[placements[t].cache_fraction for t in ts],
                                    init_slices=[init_slices[t] for t in ts],
                                    store_prefix=store_prefix)
        mods.append((ts, m))
    if len(mods) == 1 and mods[0][0] == list(range(T)):
        return mods[0][1]
    return MultiTierEmbeddingBags(mods, dims)


def placements_from_plan(plan, feature_names, device_type: str, tiers=None):
    """One process: each table's placement from the plan (the tier and cache fraction of its
    shard), in ``feature_names`` order; None when every table is in the compute tier."""
    if plan is None:
        return None
    by_feature = {f: tp for tp in plan.tables for f in tp.feature_names}
    out = []
    for f in feature_names:
        if f not in by_feature:
            raise ValueError(f"the sharding plan has no table for feature {f!r}")
        s = by_feature[f].shards[0]
        out.append(placement_for(s.tier, plan.topology.compute_tier, s.cache_fraction,
                                 device_type, tiers))
    return out if any(p.kind != "memory" for p in out) else None
