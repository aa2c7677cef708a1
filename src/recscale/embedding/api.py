"""The declared interface of every embedding collection, and the checkpoint's unit.

``EmbeddingCollection`` (a runtime-checkable Protocol) is what the model and the trainers call;
``FusedEmbeddingBags`` (all in memory), ``TieredEmbeddingBags`` (a slow tier behind a cache),
``MultiTierEmbeddingBags`` (groups of tables on different tiers) and
``ShardedEmbeddingCollection`` (one rank's shards) implement it. ``TableShard`` is one piece of
one table with views of its weights and optimizer state, what checkpoints save and restore into.
``LocalCollection`` holds what the single-process modules share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from recscale.data.batch import SparseFeatures


@dataclass
class TableShard:
    """One piece of one table held here: rows [row_offset, +rows), columns [col_offset, +cols).
    ``weight``: a view of its weights; ``states``: views of its fused-optimizer state, [rows]
    (row-wise) or [rows, cols] (element-wise). Copying into the views restores the piece.
    ``average``: the training loop's average of ``weight`` (``train.average``) and
    ``average_counts`` each row's count of averaged steps [rows] (int32), which a checkpoint
    saves and restores beside it; None: none."""

    table: int
    row_offset: int
    col_offset: int
    weight: torch.Tensor
    states: list[torch.Tensor]
    average: torch.Tensor | None = None
    average_counts: torch.Tensor | None = None

    @property
    def key(self) -> str:
        return f"emb.t{self.table}.r{self.row_offset}.c{self.col_offset}"


def assemble_tables(parts, shapes: Sequence[tuple[int, int]]
                    ) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Whole tables [rows, dim] and their optimizer states from every rank's pieces: ``parts``,
    one list per rank (in rank order) of ``(table, row_offset, col_offset, weight, states)``;
    ``shapes``: each table's (rows, dim). A rank's pieces are placed in (table, row, descending
    column) order, so where column shards each keep their own row-wise state a rank's first
    column shard's is the one kept."""
    tables = [torch.zeros(rows, dim) for rows, dim in shapes]
    states: list[list[torch.Tensor]] = [[] for _ in shapes]
    for part in parts:
        for t, r0, c0, w, st in sorted(part, key=lambda x: (x[0], x[1], -x[2])):
            tables[t][r0: r0 + w.shape[0], c0: c0 + w.shape[1]] = w
            for i, x in enumerate(st):
                if len(states[t]) <= i:
                    shape = (tables[t].shape[0],) + ((tables[t].shape[1],) if x.dim() == 2 else ())
                    states[t].append(torch.zeros(shape))
                if x.dim() == 2:
                    states[t][i][r0: r0 + x.shape[0], c0: c0 + x.shape[1]] = x
                else:
                    states[t][i][r0: r0 + x.shape[0]] = x
    return tables, states


def gather_tables(pieces: Sequence[TableShard], shapes: Sequence[tuple[int, int]], rank: int,
                  world_size: int, dst: int = 0, group=None
                  ) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]] | None:
    """Every rank's ``pieces`` copied to the CPU and sent to rank ``dst``, which assembles the
    whole tables and their optimizer states (``assemble_tables``); None on the other ranks."""
    import torch.distributed as dist

    mine = [(sh.table, sh.row_offset, sh.col_offset, sh.weight.detach().cpu().clone(),
             [x.detach().cpu().clone() for x in sh.states]) for sh in pieces]
    gathered = [None] * world_size if rank == dst else None
    dist.gather_object(mine, gathered, dst=dst, group=group)
    return assemble_tables(gathered, shapes) if rank == dst else None


def set_learning_rate(collection: nn.Module, lr: float) -> None:
    """Set the embedding optimizer's rate of every table in ``collection`` (each fused module
    inside it, whatever the wrappers, tiers or sharding, and a sharded collection's column
    shards) for the steps from now on."""
    for m in collection.modules():
        setter = getattr(type(m), "set_embedding_learning_rate", None)
        if setter is not None:
            setter(m, lr)


def optimizer_config_of(collection: nn.Module):
    """The ``EmbeddingOptimizerConfig`` the collection's tables train with (None if it holds
    no fused module)."""
    for m in collection.modules():
        cfg = getattr(m, "optimizer_config", None)
        if cfg is not None:
            return cfg
    return None


@runtime_checkable
class EmbeddingCollection(Protocol):
    """Sum-pooled embedding bags of every sparse feature (one table per feature), the embedding
    optimizer fused into backward. ``forward(sparse)`` -> [B, output_dim], table t in columns
    sum(dims[:t]) .. + dims[t]."""

    @property
    def output_dim(self) -> int:
        """sum of the tables' embedding dims: the width of the pooled output."""
        ...

    def forward(self, sparse) -> torch.Tensor:
        """Pooled embeddings [B, output_dim] of a SparseFeatures (or of what ``start`` returned)."""
        ...

    def start(self, sparse: SparseFeatures) -> object:
        """Begin the input distribution of a batch (sharded: its ids all-to-alls, left in
        flight). One process has nothing to distribute: ``sparse`` comes back unchanged."""
        ...

    def lookup(self, started) -> torch.Tensor | Callable[[], torch.Tensor]:
        """Pooled embeddings of a batch, given a SparseFeatures or what ``start`` returned; a
        collection that overlaps its output exchange with the bottom MLP returns a function that
        completes the exchange (DenseArch calls it after the bottom MLP)."""
        ...

    def prefetch(self, started) -> None:
        """Name the next batch (a SparseFeatures, or what ``start`` returned) so a slow-tier
        cache loads its rows while the current batch computes; a no-op where no table is on a
        slow tier, and for a sharded collection given a batch it has not started."""
        ...

    def flush(self) -> None:
        """Write every cached row back to its slow tier (a no-op in memory)."""
        ...

    def table_shapes(self) -> list[tuple[int, int]]:
        """(rows, dim) of every whole table, in table order (sharded: the full tables, not this
        rank's pieces)."""
        ...

    def shards(self, replicated: bool = True) -> list[TableShard]:
        """This process's pieces of every table, with weight and optimizer-state views (one
        process: whole tables; sharded: its shards, plus the replicated tables when
        ``replicated``). Copy into them to restore, then ``flush()``."""
        ...

    def tier_stats(self) -> dict[str, float]:
        """Cumulative slow-tier counters (hit rate, rows and bytes read/written per tier,
        prefetch seconds); {} when nothing is tiered."""
        ...

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held per tier: ``fast`` = weights + optimizer state (and cache bookkeeping)
        resident in the compute tier, plus one entry per slow tier holding tables."""
        ...

    def close(self) -> None:
        """Release scratch files and background threads (a no-op in memory)."""
        ...


class LocalCollection(nn.Module):
    """What the single-process modules share: nothing to distribute, whole tables as shards.
    Subclasses define ``dims``, ``forward``, ``split_weights``, ``split_optimizer_states`` and
    ``memory_bytes``; tiered ones also ``prefetch``, ``flush``, ``tier_stats`` and ``close``."""

    dims: tuple[int, ...]

    @property
    def output_dim(self) -> int:
        return sum(self.dims)

    def split_weights(self) -> list[torch.Tensor]:
        """Views of each whole table's weights [rows, dim]."""
        raise NotImplementedError

    def split_optimizer_states(self) -> list[list[torch.Tensor]]:
        """Views of each table's fused-optimizer state ([] for exact_sgd)."""
        raise NotImplementedError

    def start(self, sparse: SparseFeatures) -> SparseFeatures:
        return sparse

    def lookup(self, started: SparseFeatures) -> torch.Tensor:
        return self(started)

    def prefetch(self, started: SparseFeatures) -> None:
        return None

    def flush(self) -> None:
        return None

    def tier_stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        return None

    def table_shapes(self) -> list[tuple[int, int]]:
        return [tuple(w.shape) for w in self.split_weights()]

    def shards(self, replicated: bool = True) -> list[TableShard]:
        """Every table whole (row and column offset 0); ``replicated`` does not apply."""
        states = self.split_optimizer_states()
        weights = self.split_weights()
        states = states or [[] for _ in weights]
        return [TableShard(t, 0, 0, w, list(st))
                for t, (w, st) in enumerate(zip(weights, states))]

    def load_state(self, weights: Sequence[torch.Tensor],
                   states: Sequence[Sequence[torch.Tensor]] | None = None) -> None:
        """Restore whole tables (and optimizer states, as ``split_optimizer_states`` gives
        them) by copying into the views, durably (``flush()`` after)."""
        with torch.no_grad():
            for view, w in zip(self.split_weights(), weights):
                view.copy_(w)
            for views, st in zip(self.split_optimizer_states(), states or []):
                for view, x in zip(views, st):
                    view.copy_(x.view_as(view))
        self.flush()
