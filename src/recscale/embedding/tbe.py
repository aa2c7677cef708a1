"""A thin, typed wrapper over fbgemm's SplitTableBatchedEmbeddingBagsCodegen.

All tables live in one fbgemm module: one kernel call looks up every feature of the batch, and the
backward applies the embedding optimizer in place (no gradient tensor for the tables ever exists).
Weights are initialised per table from (seed, table index), so a shard of a table can later be
initialised to exactly the rows the unsharded table would hold (``InitSlice``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    CacheAlgorithm,
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
    WeightDecayMode,
)

from recscale.config import Validated, check, check_choice
from recscale.data.batch import SparseFeatures
from recscale.embedding.api import LocalCollection

# The fused optimizers fbgemm runs on the CPU (ADAM/LAMB are GPU-only in fbgemm 1.8).
EMBEDDING_OPTIMIZERS = {
    "exact_rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "exact_sgd": EmbOptimType.EXACT_SGD,
    "exact_adagrad": EmbOptimType.EXACT_ADAGRAD,
}


@dataclass(frozen=True)
class EmbeddingOptimizerConfig(Validated):
    name: str = "exact_rowwise_adagrad"
    learning_rate: float = 0.05
    eps: float = 1e-8
    weight_decay: float = 0.0

    def validate(self, prefix: str = "train.embedding_optimizer") -> None:
        check_choice(f"{prefix}.name", self.name, tuple(EMBEDDING_OPTIMIZERS))
        check(self.learning_rate > 0, f"{prefix}.learning_rate", self.learning_rate, "> 0")
        check(self.eps > 0, f"{prefix}.eps", self.eps, "> 0")
        check(self.weight_decay >= 0, f"{prefix}.weight_decay", self.weight_decay, ">= 0")


def table_init(seed: int, table: int, rows: int, dim: int) -> torch.Tensor:
    """Initial weights of one whole table: U(-1/sqrt(rows), 1/sqrt(rows)) as in the reference DLRM."""
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(table))
    bound = 1.0 / math.sqrt(rows)
    return torch.empty(rows, dim).uniform_(-bound, bound, generator=g)


def table_init_chunks(seed: int, table: int, rows: int, dim: int,
                      chunk_rows: int = 65536) -> Iterator[torch.Tensor]:
    """``table_init(seed, table, rows, dim)`` in blocks of ``chunk_rows`` rows, bitwise the same
    values (one generator drawn in order), so a table larger than memory can be initialised
    block by block (the SSD tier does)."""
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(table))
    bound = 1.0 / math.sqrt(rows)
    for r0 in range(0, rows, chunk_rows):
        yield torch.empty(min(chunk_rows, rows - r0), dim).uniform_(-bound, bound, generator=g)


@dataclass(frozen=True)
class InitSlice:
    """Initial weights of a table (or a shard of one): rows ``row_offset ..`` and columns
    ``col_offset ..`` of ``table_init(seed, table, full_rows, full_dim)``."""

    table: int
    full_rows: int
    full_dim: int
    row_offset: int = 0
    col_offset: int = 0

    def materialize(self, seed: int, rows: int, dim: int) -> torch.Tensor:
        full = table_init(seed, self.table, self.full_rows, self.full_dim)
        return full[self.row_offset: self.row_offset + rows, self.col_offset: self.col_offset + dim]

    def blocks(self, seed: int, rows: int, dim: int, chunk_rows: int = 16384):
        """(first row of the shard, block) pieces, never the whole table in memory."""
        lo, hi = self.row_offset, self.row_offset + rows
        r = 0
        for block in table_init_chunks(seed, self.table, self.full_rows, self.full_dim, chunk_rows):
            a, b = max(lo, r), min(hi, r + block.shape[0])
            if a < b:
                yield a - lo, block[a - r: b - r, self.col_offset: self.col_offset + dim]
            r += block.shape[0]
            if r >= hi:
                break


class FusedEmbeddingBags(LocalCollection):
    """Sum-pooled embedding bags for several tables, one feature per table, fused optimizer.
    An ``EmbeddingCollection`` with every table in the compute tier (or, with
    ``cache_fraction`` on CUDA, in host memory behind fbgemm's own cache)."""

    def __init__(
        self,
        rows: Sequence[int],
        dims: Sequence[int],
        optimizer: EmbeddingOptimizerConfig,
        device: torch.device | str = "cpu",
        seed: int = 0,
        table_ids: Sequence[int] | None = None,
        initial_weights: Sequence[torch.Tensor] | None = None,
        cache_fraction: float | None = None,
        cache_policy: str = "lru",
    ):
        """``cache_fraction`` (CUDA only): fbgemm's EmbeddingLocation.MANAGED_CACHING, the
        tables in host memory (UVM) behind an HBM cache of that share of the rows, ``cache_policy``
        "lru" or "lfu". On the CPU use ``recscale.embedding.cache.TieredEmbeddingBags``."""
        super().__init__()
        if len(rows) != len(dims) or not rows:
            raise ValueError(f"rows ({len(rows)}) and dims ({len(dims)}) must be equal, non-empty lists")
        for i, d in enumerate(dims):
            if d % 4 != 0:
                raise ValueError(f"embedding dim {d} of table {i} is not allowed: fbgemm needs a multiple of 4")
        device = torch.device(device)
        on_cuda = device.type == "cuda"
        if optimizer.weight_decay and not on_cuda:
            # fbgemm's CPU kernels ignore weight decay in every mode (checked with 1.8.0): refuse
            # it rather than train without it
            raise ValueError(f"train.embedding_optimizer.weight_decay={optimizer.weight_decay} is "
                             "not allowed on the CPU: fbgemm's CPU kernels ignore it; use 0.0")
        location = EmbeddingLocation.DEVICE if on_cuda else EmbeddingLocation.HOST
        compute = ComputeDevice.CUDA if on_cuda else ComputeDevice.CPU
        cache_kw = {}
        if cache_fraction is not None:
            check_choice("cache_policy", cache_policy, ("lru", "lfu"))
            check(0 < cache_fraction <= 1, "cache_fraction", cache_fraction, "in (0, 1]")
            if not on_cuda:
                raise ValueError(f"cache_fraction={cache_fraction!r} (fbgemm MANAGED_CACHING) "
                                 "needs a CUDA device; on the CPU use TieredEmbeddingBags")
            location = EmbeddingLocation.MANAGED_CACHING
            cache_kw = {"cache_load_factor": float(cache_fraction),  # fbgemm's name for it
                        "cache_algorithm": CacheAlgorithm.LFU if cache_policy == "lfu"
                        else CacheAlgorithm.LRU}
        self.managed_caching = location == EmbeddingLocation.MANAGED_CACHING
        self.rows = tuple(int(r) for r in rows)
        self.dims = tuple(int(d) for d in dims)
        self.optimizer_config = optimizer
        # fbgemm logs every constructor argument at INFO on the root logger; keep user logs readable
        previous = logging.root.manager.disable
        logging.disable(logging.INFO)
        try:
            self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
                [(r, d, location, compute) for r, d in zip(self.rows, self.dims)],
                optimizer=EMBEDDING_OPTIMIZERS[optimizer.name],
                learning_rate=optimizer.learning_rate,
                eps=optimizer.eps,
                weight_decay=optimizer.weight_decay,
                # fbgemm's default mode (NONE) would silently drop a nonzero weight_decay
                weight_decay_mode=WeightDecayMode.L2 if optimizer.weight_decay else WeightDecayMode.NONE,
                pooling_mode=PoolingMode.SUM,
                device=device,
                **cache_kw,
            )
        finally:
            logging.disable(previous)
        table_ids = range(len(self.rows)) if table_ids is None else table_ids
        with torch.no_grad():
            for i, (t, w) in enumerate(zip(table_ids, self.tbe.split_embedding_weights())):
                if initial_weights is not None:  # e.g. a shard: its slice of the full table
                    w.copy_(initial_weights[i])
                else:
                    w.copy_(table_init(seed, t, w.shape[0], w.shape[1]))

    def forward(self, sparse: SparseFeatures) -> torch.Tensor:
        """-> pooled embeddings [B, sum(dims)], table t in columns sum(dims[:t]) .. + dims[t]
        (each id's embedding times its weight where ``sparse.weights`` gives them)."""
        return self.tbe(sparse.values, sparse.offsets(), per_sample_weights=sparse.weights)

    def flush(self) -> None:
        """MANAGED_CACHING: write the HBM cache back to the host tables (else nothing to do)."""
        if self.managed_caching:
            self.tbe.flush()

    def memory_bytes(self) -> dict[str, int]:
        """{"fast": bytes of fbgemm's weight and optimizer-state tensors}."""
        total = 0
        for name, p in list(self.tbe.named_parameters()) + list(self.tbe.named_buffers()):
            if name.startswith(("weights_", "momentum")):
                total += p.numel() * p.element_size()
        return {"fast": total}

    def _sync_managed_cache(self) -> None:
        """MANAGED_CACHING: write the HBM cache back to the host tables and empty it, so the views
        below are the whole truth and a copy into them is what the next lookup sees."""
        if self.managed_caching:
            self.tbe.flush()
            self.tbe.reset_cache_states()

    def split_weights(self) -> list[torch.Tensor]:
        """Views of each table's weights [rows, dim]."""
        self._sync_managed_cache()
        return list(self.tbe.split_embedding_weights())

    def split_optimizer_states(self) -> list[list[torch.Tensor]]:
        self._sync_managed_cache()
        return [list(s) for s in self.tbe.split_optimizer_states()]
