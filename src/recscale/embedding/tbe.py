"""A thin, typed wrapper over fbgemm's SplitTableBatchedEmbeddingBagsCodegen.

All tables live in one fbgemm module: one kernel call looks up every feature of the batch, and the
backward applies the embedding optimizer in place (no gradient tensor for the tables ever exists).
Weights are initialised per table from (seed, table index), so a shard of a table can later be
initialised to exactly the rows the unsharded table would hold (``InitSlice``).

Weight decay (``train.embedding_optimizer.weight_decay``) applies to the rows a step touches, the
same way on every device (fbgemm's CPU kernels ignore their own weight-decay argument, so it is
never passed to fbgemm):

- ``decoupled``: when the backward pass has finished (the fused update done), every distinct row
  the batch looked up is multiplied by ``1 - lr * weight_decay`` (lr: the rate of that step);
- ``l2``: the coupled form: each touched row's gradient gets ``weight_decay * w`` added before the
  fused optimizer sees it (so Adagrad's state accumulates it too). The forward appends one extra
  bag per distinct touched row (that row alone), and the gradient of that bag's output is set to
  ``weight_decay`` times the row: fbgemm's exact optimizers sum a row's occurrences, so the row's
  gradient becomes ``g + weight_decay * w`` inside the one fused update.
"""

from __future__ import annotations

import functools
import itertools
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

from recscale.config import ConfigError, Validated, check, check_choice
from recscale.data.batch import SparseFeatures
from recscale.embedding.api import LocalCollection

# The fused optimizers fbgemm runs on the CPU (ADAM/LAMB are GPU-only in fbgemm 1.8).
EMBEDDING_OPTIMIZERS = {
    "exact_rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "exact_sgd": EmbOptimType.EXACT_SGD,
    "exact_adagrad": EmbOptimType.EXACT_ADAGRAD,
}


WEIGHT_DECAY_MODES = ("decoupled", "l2")
# learning-rate schedules after the warm-up (both optimizers; recscale.train.step.scheduled_rate)
LR_SCHEDULES = ("polynomial", "constant", "linear", "cosine", "step")


@dataclass(frozen=True)
class EmbeddingOptimizerConfig(Validated):
    """``train.embedding_optimizer``: fbgemm's fused optimizer. ``weight_decay`` on the rows a step
    touches (``weight_decay_mode``: decoupled or l2, see the module docstring). The rate follows
    the schedule ``warmup_steps`` .. ``decay_gamma`` (the dense optimizer's keys, same meaning;
    ``recscale.train.step.scheduled_rate``), set before each step's backward."""

    name: str = "exact_rowwise_adagrad"
    learning_rate: float = 0.05
    eps: float = 1e-8
    weight_decay: float = 0.0
    weight_decay_mode: str = "decoupled"
    warmup_steps: int = 0
    schedule: str = "polynomial"
    decay_start_step: int = 0
    decay_steps: int = 0
    decay_power: float = 2.0
    decay_gamma: float = 0.1

    @property
    def scheduled(self) -> bool:
        """Whether the rate changes from step to step."""
        return bool(self.warmup_steps or (self.decay_steps and self.schedule != "constant"))

    def validate(self, prefix: str = "train.embedding_optimizer") -> None:
        check_choice(f"{prefix}.name", self.name, tuple(EMBEDDING_OPTIMIZERS))
        check(self.learning_rate > 0, f"{prefix}.learning_rate", self.learning_rate, "> 0")
        check(self.eps > 0, f"{prefix}.eps", self.eps, "> 0")
        check(self.weight_decay >= 0, f"{prefix}.weight_decay", self.weight_decay, ">= 0")
        check_choice(f"{prefix}.weight_decay_mode", self.weight_decay_mode, WEIGHT_DECAY_MODES)
        if self.weight_decay_mode == "decoupled":
            check(self.learning_rate * self.weight_decay < 1, f"{prefix}.weight_decay",
                  self.weight_decay, f"< 1 / learning_rate = {1 / self.learning_rate:g} "
                  "(decoupled decay multiplies a row by 1 - learning_rate * weight_decay)")
        check_schedule(self, prefix)


def check_schedule(cfg, prefix: str) -> None:
    """The schedule keys both optimizer configs share (``warmup_steps`` .. ``decay_gamma``)."""
    check(cfg.warmup_steps >= 0, f"{prefix}.warmup_steps", cfg.warmup_steps, ">= 0")
    check_choice(f"{prefix}.schedule", cfg.schedule, LR_SCHEDULES)
    check(cfg.decay_start_step >= 0, f"{prefix}.decay_start_step", cfg.decay_start_step, ">= 0")
    check(cfg.decay_steps >= 0, f"{prefix}.decay_steps", cfg.decay_steps, ">= 0")
    check(cfg.decay_power > 0, f"{prefix}.decay_power", cfg.decay_power, "> 0")
    check(0 < cfg.decay_gamma <= 1, f"{prefix}.decay_gamma", cfg.decay_gamma, "in (0, 1]")


class _CoupledL2(torch.autograd.Function):
    """Forward: the first ``batch`` rows of the pooled output. Backward: their gradient, and
    ``wd`` x the rest (the touched rows, one per extra bag) as the extra bags' gradient."""

    @staticmethod
    def forward(ctx, out, batch, wd):
        ctx.batch, ctx.wd = batch, wd
        ctx.save_for_backward(out)
        return out[:batch]

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return torch.cat([grad, out[ctx.batch:] * ctx.wd]), None, None


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
            if optimizer.weight_decay and optimizer.weight_decay_mode == "decoupled":
                # the rows live in fbgemm's HBM cache or in host memory: no flat view to decay
                raise ConfigError(
                    "train.embedding_optimizer.weight_decay_mode='decoupled' (with weight_decay="
                    f"{optimizer.weight_decay}) is not allowed for tables behind fbgemm's managed "
                    "cache (on CUDA, the tables the plan puts on DDR): use weight_decay_mode: l2")
            cache_kw = {"cache_load_factor": float(cache_fraction),  # fbgemm's name for it
                        "cache_algorithm": CacheAlgorithm.LFU if cache_policy == "lfu"
                        else CacheAlgorithm.LRU}
        self.managed_caching = location == EmbeddingLocation.MANAGED_CACHING
        self.rows = tuple(int(r) for r in rows)
        self.dims = tuple(int(d) for d in dims)
        self.optimizer_config = optimizer
        self.learning_rate = float(optimizer.learning_rate)  # the rate in effect (the schedule's)
        # fbgemm logs every constructor argument at INFO on the root logger; keep user logs readable
        previous = logging.root.manager.disable
        logging.disable(logging.INFO)
        try:
            self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
                [(r, d, location, compute) for r, d in zip(self.rows, self.dims)],
                optimizer=EMBEDDING_OPTIMIZERS[optimizer.name],
                learning_rate=optimizer.learning_rate,
                eps=optimizer.eps,
                # weight decay is applied here, the same on every device (module docstring)
                weight_decay=0.0,
                weight_decay_mode=WeightDecayMode.NONE,
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
        # where each table's rows start among all tables' rows (ids -> rows for the weight decay)
        first_row = torch.tensor([0, *itertools.accumulate(self.rows)][:-1], dtype=torch.int64)
        self.register_buffer("_first_row", first_row.to(device), persistent=False)
        self._flat_name = "weights_dev" if on_cuda else "weights_host"
        # the decoupled decay sees the flat weights as chunks of g floats (g: the gcd of every
        # dim and table offset, the dim itself when all tables share one): row r of table t is
        # chunks base[t] + (first_row[t] + r) * per_row[t] .. + per_row[t] - 1
        w_off = [int(x) for x in self.tbe.weights_offsets.tolist()]
        g = math.gcd(*self.dims, *w_off)
        per_row = [d // g for d in self.dims]
        base = [o // g - f * c for o, f, c in zip(w_off, first_row.tolist(), per_row)]
        self._chunk, self._one_chunk_rows = g, all(c == 1 for c in per_row)
        self.register_buffer("_chunks_per_row", torch.tensor(per_row, device=device),
                             persistent=False)
        self.register_buffer("_chunk_base", torch.tensor(base, device=device), persistent=False)

    def set_embedding_learning_rate(self, lr: float) -> None:
        """The fused optimizer's rate from the next backward on (the schedule sets it)."""
        self.tbe.set_learning_rate(float(lr))
        self.learning_rate = float(lr)

    def forward(self, sparse: SparseFeatures) -> torch.Tensor:
        """-> pooled embeddings [B, sum(dims)], table t in columns sum(dims[:t]) .. + dims[t]
        (each id's embedding times its weight where ``sparse.weights`` gives them). In training
        with weight decay on, the touched rows decay as the module docstring says."""
        wd = self.optimizer_config.weight_decay
        if not wd or not (self.training and torch.is_grad_enabled()):
            return self.tbe(sparse.values, sparse.offsets(), per_sample_weights=sparse.weights)
        if self.optimizer_config.weight_decay_mode == "l2":
            return self._forward_coupled(sparse, wd)
        out = self.tbe(sparse.values, sparse.offsets(), per_sample_weights=sparse.weights)
        if out.requires_grad:
            factor = 1.0 - self.learning_rate * wd
            out.register_hook(functools.partial(self._queue_decay, sparse.values,
                                                sparse.lengths, factor))
        return out

    def _table_keys(self, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Each id as a row number among all tables' rows (table t's rows after t-1's)."""
        per_table = lengths.reshape(len(self.rows), -1).sum(1)
        first = torch.repeat_interleave(self._first_row, per_table, output_size=values.numel())
        return values + first

    def _queue_decay(self, values, lengths, factor, grad):
        # a hook on the pooled output runs before fbgemm's fused update; the decay must follow
        # it, so it runs when the whole backward pass has finished
        torch.autograd.Variable._execution_engine.queue_callback(
            functools.partial(self.decay_rows, values, lengths, factor))
        return grad

    @torch.no_grad()
    def decay_rows(self, values: torch.Tensor, lengths: torch.Tensor, factor: float) -> None:
        """Multiply every distinct row the ids (``values`` with ``lengths`` [T, B]) look up by
        ``factor``, once each."""
        if not values.numel():
            return
        keys = torch.unique(self._table_keys(values, lengths))
        t = torch.searchsorted(self._first_row, keys, right=True) - 1
        per_row = self._chunks_per_row[t]
        chunks = self._chunk_base[t] + keys * per_row
        if not self._one_chunk_rows:  # chunk j of the k-th row: first[k] + (j - chunks before k)
            n = int(per_row.sum())
            chunks = torch.repeat_interleave(chunks - (per_row.cumsum(0) - per_row), per_row,
                                             output_size=n)
            chunks += torch.arange(n, device=chunks.device)
        flat = getattr(self.tbe, self._flat_name)
        g = self._chunk
        view = flat[: flat.numel() // g * g].view(-1, g)
        view.index_copy_(0, chunks, view.index_select(0, chunks).mul_(factor))

    def _forward_coupled(self, sparse: SparseFeatures, wd: float) -> torch.Tensor:
        """The l2 mode: the batch's bags, then one bag per distinct touched row of each table (in
        extra samples B, B+1, ...; a table with fewer rows gets empty bags), whose output's
        gradient is ``wd`` x the row (``_CoupledL2``)."""
        T, B = len(self.rows), sparse.batch_size
        values, lengths = sparse.values, sparse.lengths.reshape(T, B)
        if not values.numel():
            return self.tbe(values, sparse.offsets(), per_sample_weights=sparse.weights)
        keys = torch.unique(self._table_keys(values, lengths))
        t = torch.searchsorted(self._first_row, keys, right=True) - 1
        per_table = torch.bincount(t, minlength=T)
        extra = int(per_table.max())
        extra_lengths = (torch.arange(extra, device=values.device).unsqueeze(0)
                         < per_table.unsqueeze(1)).to(lengths.dtype)
        all_lengths = torch.cat([lengths, extra_lengths], dim=1).reshape(-1)
        # table-major: each table's own ids, then its touched rows (stable sort by table)
        per_id_table = torch.repeat_interleave(torch.arange(T, device=values.device),
                                               lengths.sum(1), output_size=values.numel())
        order = torch.argsort(torch.cat([per_id_table, t]), stable=True)
        ids = torch.cat([values, keys - self._first_row[t]])[order]
        weights = None
        if sparse.weights is not None:
            weights = torch.cat([sparse.weights, sparse.weights.new_ones(keys.numel())])[order]
        offsets = torch.zeros(all_lengths.numel() + 1, dtype=torch.int64, device=values.device)
        torch.cumsum(all_lengths, 0, out=offsets[1:])
        out = self.tbe(ids, offsets, per_sample_weights=weights)
        return _CoupledL2.apply(out, B, wd)

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
