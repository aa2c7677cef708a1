"""Enumerate the sharding options of every table (vectorised over tables).

One option = a sharding type and a shard count. For each (table, option) the geometry of the widest
shard and of the mean shard is recorded; shard costs are affine in rows and columns, so
``n_shards * cost(mean shard)`` is the exact total and ``cost(widest shard)`` the largest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cost import CW, DP, RW, TW, TWCW, TWRW
from .topology import Topology
from .types import SHARDING_TYPES, PlannerOptions, TableSpec


@dataclass
class TableArrays:
    names: list[str]
    N: np.ndarray
    D: np.ndarray
    L: np.ndarray
    F: np.ndarray
    allowed: np.ndarray  # (n, 6) bool, columns in SHARDING_TYPES order
    pinned: np.ndarray  # (n,) tier index or -1
    U: np.ndarray | None = None  # (n,) distinct fraction (TableSpec.distinct_fraction)

    @classmethod
    def build(cls, tables: list[TableSpec]) -> TableArrays:
        from .cost import TIER_INDEX

        n = len(tables)
        allowed = np.zeros((n, len(SHARDING_TYPES)), dtype=bool)
        pinned = np.full(n, -1, dtype=np.int64)
        for i, t in enumerate(tables):
            for s in t.allowed_types():
                allowed[i, SHARDING_TYPES.index(s)] = True
            if t.constraints is not None and t.constraints.tier is not None:
                pinned[i] = TIER_INDEX[t.constraints.tier]
        return cls(
            names=[t.name for t in tables],
            N=np.array([t.num_embeddings for t in tables], dtype=float),
            D=np.array([t.embedding_dim for t in tables], dtype=float),
            L=np.array([t.pooling_factor for t in tables], dtype=float),
            F=np.array([t.num_features for t in tables], dtype=float),
            allowed=allowed,
            pinned=pinned,
            U=np.array([t.distinct_fraction for t in tables], dtype=float),
        )


@dataclass
class OptionGrid:
    kind: np.ndarray  # (m,) sharding type index per option
    k: np.ndarray  # (m,) shard count used by the cost model (group size)
    valid: np.ndarray  # (n, m)
    n_shards: np.ndarray  # (n, m) non-empty shards
    wide_rows: np.ndarray
    wide_cols: np.ndarray
    mean_rows: np.ndarray
    mean_cols: np.ndarray

    @property
    def m(self) -> int:
        return len(self.kind)


def enumerate_options(t: TableArrays, topo: Topology, opts: PlannerOptions) -> OptionGrid:
    """All sharding options of every table; ``valid`` honours constraints and column granularity."""
    n = len(t.N)
    W, Lw = topo.world_size, topo.local_world_size
    g, min_w = opts.column_granularity, opts.min_column_width
    D = t.D.astype(np.int64)
    max_col_k = int(max(1, (D // min_w).max())) if n else 1
    col_ok = (D % g == 0)

    kinds, ks, cols = [], [], []

    def add(kind, k, valid, n_sh, wr, wc, mr, mc):
        kinds.append(kind)
        ks.append(k)
        cols.append((valid, n_sh, wr, wc, mr, mc))

    ones = np.ones(n)
    add(TW, 1, t.allowed[:, TW], ones, t.N, t.D, t.N, t.D)
    add(DP, W, t.allowed[:, DP], ones * W, t.N, t.D, t.N, t.D)
    for kind, kmax in ((CW, min(W, max_col_k)), (TWCW, min(Lw, max_col_k))):
        for k in range(1, kmax + 1):
            units = D // g
            base, extra = units // k, units % k
            wide = np.where(k == 1, D, (base + (extra > 0)) * g)
            ok = (k == 1) | (col_ok & (base * g >= min_w))
            add(kind, k, t.allowed[:, kind] & ok, ones * k, t.N, wide.astype(float), t.N, t.D / k)
    for kind, k in ((RW, W), (TWRW, Lw)):
        block = np.ceil(t.N / k)
        n_sh = np.ceil(t.N / block)
        add(kind, k, t.allowed[:, kind], n_sh, block, t.D, t.N / n_sh, t.D)

    def stack(i):
        return np.stack([c[i] for c in cols], axis=1).astype(float)

    return OptionGrid(
        kind=np.array(kinds, dtype=np.int64),
        k=np.array(ks, dtype=np.int64),
        valid=np.stack([c[0] for c in cols], axis=1).astype(bool),
        n_shards=stack(1),
        wide_rows=stack(2),
        wide_cols=stack(3),
        mean_rows=stack(4),
        mean_cols=stack(5),
    )
