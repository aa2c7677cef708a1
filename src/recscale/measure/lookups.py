"""Lookup + fused update per memory tier, and the output's assembly, as the runtime runs them: the
in-memory module (``FusedEmbeddingBags``, the compute tier) and the DDR- and SSD-backed caches
(``TieredEmbeddingBags``, uniform ids so most lookups miss; the measured hit rate separates the
slow tier's share), by embedding dim, pooling factor, id skew and batch size."""

from __future__ import annotations

import itertools
import statistics

import torch

from recscale.data.batch import SparseFeatures
from recscale.measure.config import CalibrationConfig
from recscale.measure.timing import median_time


def _ids(n: int, rows: int, skew: float, g: torch.Generator,
         perm: torch.Tensor | None = None) -> torch.Tensor:
    """``n`` ids in ``[0, rows)``: uniform (``skew`` 0) or power-law with exponent ``skew`` (a
    continuous Zipf by inverse transform), the hot ids scattered by ``perm`` as hashing does."""
    if skew <= 0:
        return torch.randint(0, rows, (n,), generator=g)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    a = 1.0 - skew
    x = ((float(rows) ** a - 1.0) * u + 1.0) ** (1.0 / a) if a else float(rows) ** u
    ids = (x.floor().long() - 1).clamp_(0, rows - 1)
    return ids if perm is None else perm[ids]


def _batch(B: int, L: int, rows: list[int], g: torch.Generator, skew: float = 0.0,
           perms: list[torch.Tensor] | None = None) -> tuple[SparseFeatures, int]:
    """A batch of one feature per table of ``rows`` (``L`` ids per sample, each table's drawn
    in its own rows) and its distinct ids (per table)."""
    T = len(rows)
    lengths = torch.full((T, B), L, dtype=torch.int64)
    values = torch.cat([_ids(B * L, n, skew, g, None if perms is None else perms[t])
                        for t, n in enumerate(rows)])
    distinct = sum(int(v.unique().numel()) for v in values.view(T, B * L))
    return SparseFeatures(("",) * T, values, lengths), distinct


def measure_module(make, cfg: CalibrationConfig, rows: list[int], progress) -> list[dict]:
    """``make(optimizer, rows, dim)``: the module of tables of ``rows`` to time, per dim."""
    from recscale.embedding.tbe import EmbeddingOptimizerConfig

    opt = EmbeddingOptimizerConfig(name=cfg.optimizer)
    pts = []
    T = len(rows)
    g = torch.Generator().manual_seed(0)
    perms = [torch.randperm(n, generator=g) for n in rows]
    for d in cfg.dims:
        mod = make(opt, rows, d)
        try:
            for L, B, skew in itertools.product(cfg.poolings, cfg.batch_sizes, cfg.skews):
                drawn = [_batch(B, L, rows, g, skew, perms) for _ in range(cfg.reps + 1)]
                batches = [b for b, _ in drawn]
                distinct = statistics.mean(n for _, n in drawn[1:])
                before = mod.tier_stats() if hasattr(mod, "tier_stats") else {}

                def step(i, mod=mod, batches=batches):
                    mod(batches[i + 1]).sum().backward()

                t = median_time(step, cfg.reps)
                after = mod.tier_stats() if hasattr(mod, "tier_stats") else {}
                look = after.get("lookups", 0) - before.get("lookups", 0)
                hits = after.get("hits", 0) - before.get("hits", 0)
                h = hits / look if look else 1.0
                pts.append({"dim": d, "pooling": L, "batch": B, "skew": skew,
                            "ids": T * B * L, "distinct": distinct, "bags": T * B,
                            "seconds": t, "hit_rate": h})
                progress()
        finally:
            if hasattr(mod, "close"):
                mod.close()
    return pts


def measure_assembly(cfg: CalibrationConfig, num_tables: int, world: int, progress) -> list[dict]:
    """The collection's placing of the pooled vectors it received into the model's
    [B, tables x dim] output, as the runtime runs it (``columns.place_columns``, once per step:
    the flat exchange's per-rank blocks and the replicas' piece, tables in shuffled order; the
    backward gathers the columns back): per output element, whatever the ranks."""
    from recscale.embedding.columns import inverse_permutation, place_columns

    pts = []
    g = torch.Generator().manual_seed(1)
    for d in cfg.dims:
        width = num_tables * d
        order = torch.randperm(num_tables, generator=g)
        cols = (order[:, None] * d + torch.arange(d)).reshape(-1)
        inv = inverse_permutation(cols, width)
        n_dp = num_tables // 3 * d  # a third of the tables replicated, the rest in rank blocks
        blocks = [len(c) * d for c in torch.arange(num_tables - num_tables // 3).chunk(
            max(world, 1))]
        for B in cfg.batch_sizes:
            wide = torch.randn(B * sum(blocks), requires_grad=True)
            dp = torch.randn(B, n_dp, requires_grad=True)
            grad = torch.randn(B, width)

            def step(i, wide=wide, dp=dp, B=B, width=width, blocks=blocks, grad=grad, cols=cols,
                     inv=inv, n_dp=n_dp):
                out = place_columns([wide, dp], [blocks, (n_dp,)], cols, inv, width, B)
                out.backward(grad)
                wide.grad = dp.grad = None

            pts.append({"dim": d, "batch": B, "elements": B * width,
                        "seconds": median_time(step, max(cfg.reps, 5))})
            progress()
    return pts
