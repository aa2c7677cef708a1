"""Features over tables: several features looking up one table, and mean pooling.

Every collection below this (fused, tiered, multi-tier, sharded under all six sharding types)
looks up one bag per table and sample. ``FeatureBags`` puts any number of features on one table
by giving the inner collection ``m`` bags per sample and table, ``m`` the most features any table
serves: slot ``j * B + b`` of table ``t`` holds sample ``b``'s bag of the ``j``-th feature of ``t``
(an empty bag where ``t`` has fewer features). The inner collection thus sees one table with
``m * B`` samples and updates it once per step with the ids of all its features together, as one
table shared by features should be (fbgemm's ``feature_table_map`` does the same inside one
kernel). Its pooled output [m * B, sum(table dims)] is then cut into one block of columns per
feature, in feature order.

Mean pooling divides a feature's pooled sum by its bag's length (an empty bag stays 0) *after*
the inner collection has reduced it, so it is exact under every sharding type: a row-wise
shard's partial sums are summed first, then divided, never divided per shard.

Costs, where a table is shared (``m > 1``): the inner collection looks up ``m * B`` bags for every
table (the padding ones empty), so its output exchange carries ``m`` times the columns. With one
feature per table and sum pooling no wrapper is built at all (``feature_bags`` returns the inner
collection).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from recscale.data.batch import SparseFeatures

POOLING = ("sum", "mean")


@dataclass
class FeatureStart:
    """What ``FeatureBags.start`` returns: the inner collection's start and the batch's
    per-feature lengths (for mean pooling) and size."""

    inner: object
    lengths: torch.Tensor  # [F, B]
    B: int


class FeatureBags(nn.Module):
    """An ``EmbeddingCollection`` of features over the tables of ``inner`` (one bag per table):
    ``feature_tables[f]`` is feature f's table, ``pooling[f]`` its pooling (``sum`` or ``mean``).
    ``dims``: per feature (its table's dim); output [B, sum(dims)], features in order."""

    def __init__(self, inner: nn.Module, feature_tables: Sequence[int],
                 pooling: Sequence[str] | None = None):
        super().__init__()
        self.inner = inner
        self.feature_tables = tuple(int(t) for t in feature_tables)
        T = len(inner.dims)
        if sorted(set(self.feature_tables)) != list(range(T)):
            raise ValueError(f"feature_tables {list(self.feature_tables)} must use each of the "
                             f"{T} tables 0..{T - 1}")
        pooling = tuple(pooling or ("sum",) * len(self.feature_tables))
        if len(pooling) != len(self.feature_tables):
            raise ValueError(f"{len(pooling)} poolings for {len(self.feature_tables)} features")
        for f, p in enumerate(pooling):
            if p not in POOLING:
                raise ValueError(f"pooling {p!r} of feature #{f} is not allowed: one of {POOLING}")
        self.pooling = pooling
        table_dims = [int(d) for d in inner.dims]
        self.dims = tuple(table_dims[t] for t in self.feature_tables)
        F = len(self.feature_tables)
        # the j-th feature of each table
        slot = []
        seen = [0] * T
        for t in self.feature_tables:
            slot.append(seen[t])
            seen[t] += 1
        self.m = m = max(seen)
        # rows of the inner batch's lengths, table-major then j: a feature, or F (an empty row)
        where = {(t, j): f for f, (t, j) in enumerate(zip(self.feature_tables, slot))}
        perm = [where.get((t, j), F) for t in range(T) for j in range(m)]
        # the index buffers live where the inner collection's ids do (a sharded collection on
        # CUDA is built there; nothing moves this wrapper afterwards)
        dev = _device_of(inner)
        self.register_buffer("_perm", torch.tensor(perm, dtype=torch.int32, device=dev),
                             persistent=False)
        col0 = [0]
        for d in table_dims:
            col0.append(col0[-1] + d)
        width = col0[-1]
        # output column c of feature f: column col0[t] + c of slot j, in the [B, m * width] view
        cols = [j * width + col0[t] + c for t, j in zip(self.feature_tables, slot)
                for c in range(table_dims[t])]
        self.register_buffer("_cols", torch.tensor(cols, dtype=torch.int64, device=dev),
                             persistent=False)
        self._averages = "mean" in pooling
        # which feature each output column belongs to (for the mean's divisor), and whether
        # that feature is averaged
        owner = [f for f, d in enumerate(self.dims) for _ in range(d)]
        self.register_buffer("_owner", torch.tensor(owner, dtype=torch.int64, device=dev),
                             persistent=False)
        self.register_buffer("_mean_cols", torch.tensor([pooling[f] == "mean" for f in owner],
                                                        device=dev), persistent=False)
        self._identity = m == 1 and list(self.feature_tables) == list(range(T))
        self._made: list[tuple[SparseFeatures, SparseFeatures]] = []  # see _to_tables

    @property
    def output_dim(self) -> int:
        return sum(self.dims)

    @property
    def last_batch_sizes(self) -> list[int]:
        """Samples each rank looked up in the last batch (the inner collection's, over m)."""
        return [b // self.m for b in self.inner.last_batch_sizes]

    def _to_tables(self, sparse: SparseFeatures) -> SparseFeatures:
        """The batch as the inner collection takes it; the same object for the same batch
        (the loop names batch i + 1 to the cache before it looks up batch i, and a multi-tier
        collection knows a named batch by its tensors)."""
        if self._identity:
            return sparse
        for given, made in self._made:
            if given is sparse:
                return made
        made = self._permute(sparse)
        self._made = [*self._made[-1:], (sparse, made)]
        return made

    def _permute(self, sparse: SparseFeatures) -> SparseFeatures:
        F, B = sparse.lengths.shape
        if F != len(self.feature_tables):
            raise ValueError(f"expected {len(self.feature_tables)} features, got {F}")
        lengths = torch.cat([sparse.lengths, sparse.lengths.new_zeros(1, B)])
        weights = sparse.weights
        p_l, p_v, p_w = torch.ops.fbgemm.permute_2D_sparse_data(
            self._perm, lengths, sparse.values, weights, None)
        T = len(self.inner.dims)
        return SparseFeatures(("",) * T, p_v, p_l.reshape(T, self.m * B), p_w)

    def start(self, sparse: SparseFeatures) -> FeatureStart:
        return FeatureStart(self.inner.start(self._to_tables(sparse)), sparse.lengths,
                            sparse.batch_size)

    def _features(self, pooled: torch.Tensor, pend: FeatureStart) -> torch.Tensor:
        B = pend.B
        if not self._identity:
            width = pooled.shape[1]  # explicit: a rank's batch may be empty
            pooled = pooled.reshape(self.m, B, width).transpose(0, 1).reshape(B, self.m * width)
            pooled = pooled.index_select(1, self._cols)
        if self._averages:
            n = pend.lengths.to(pooled.dtype).clamp(min=1.0).t().index_select(1, self._owner)
            pooled = torch.where(self._mean_cols, pooled / n, pooled)
        return pooled

    def lookup(self, started):
        pend = started if isinstance(started, FeatureStart) else self.start(started)
        got = self.inner.lookup(pend.inner)
        if callable(got):
            return lambda: self._features(got(), pend)
        return self._features(got, pend)

    def forward(self, sparse) -> torch.Tensor:
        got = self.lookup(sparse)
        return got() if callable(got) else got

    def prefetch(self, started) -> None:
        if isinstance(started, FeatureStart):
            self.inner.prefetch(started.inner)
        elif isinstance(started, SparseFeatures):
            self.inner.prefetch(self._to_tables(started))

    # --- the tables: the inner collection's ------------------------------------------------------
    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()

    def shards(self, replicated: bool = True):
        return self.inner.shards(replicated)

    def table_shapes(self) -> list[tuple[int, int]]:
        return self.inner.table_shapes()

    def tier_stats(self) -> dict[str, float]:
        return self.inner.tier_stats()

    def memory_bytes(self) -> dict[str, int]:
        return self.inner.memory_bytes()

    def split_weights(self):
        return self.inner.split_weights()

    def split_optimizer_states(self):
        return self.inner.split_optimizer_states()

    def load_state(self, weights, states=None) -> None:
        self.inner.load_state(weights, states)

    def full_tables(self, dst: int = 0):
        return self.inner.full_tables(dst)


def _device_of(inner: nn.Module) -> torch.device:
    """Where a collection keeps its tensors: its first parameter's or buffer's device (CPU
    when it has none)."""
    first = next(itertools.chain(inner.parameters(), inner.buffers()), None)
    return first.device if first is not None else torch.device("cpu")


def feature_bags(inner: nn.Module, feature_tables: Sequence[int] | None,
                 pooling: Sequence[str] | None = None) -> nn.Module:
    """``inner`` itself where every feature has a table of its own, in order, and sums its
    bag; else a ``FeatureBags`` over it."""
    T = len(inner.dims)
    tables = list(range(T)) if feature_tables is None else [int(t) for t in feature_tables]
    if tables == list(range(T)) and all(p == "sum" for p in (pooling or ())):
        return inner
    return FeatureBags(inner, tables, pooling)
