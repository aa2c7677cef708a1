"""DLRM: dense features through a bottom MLP, sparse features through embedding bags, an
interaction (pairwise dot, concatenation, or a DCN-v2 low-rank cross network over the
concatenation: MLPerf's DLRM-DCNv2), then a top MLP to one click logit.

The embedding module is injected, so the same DLRM runs with the single-process fused embedding
bags or a sharded collection. ``dense_precision: bf16`` runs the MLPs and interaction under CPU/CUDA
autocast in bfloat16 (fp32 master weights, fp32 loss).

Dropout (``model.dropout``: ``bottom``, ``top``, ``dcn``) zeroes activations in training only:
after each hidden layer of the bottom and top MLPs (never on an MLP's output: not on the bottom
MLP's output vector, not on the logit) and on the DCN cross network's output. In ``eval()`` it
does nothing, so scoring is deterministic and equals a model built without dropout.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from recscale.config import ConfigError, Validated, check, check_choice
from recscale.model.dcn import DCNConfig, LowRankCrossNet


@dataclass(frozen=True)
class DropoutConfig(Validated):
    """``model.dropout``: the share of activations zeroed in training, after each hidden layer
    of the bottom MLP (``bottom``) and of the top MLP (``top``), and on the DCN cross network's
    output (``dcn``, interaction dcn only)."""

    bottom: float = 0.0
    top: float = 0.0
    dcn: float = 0.0

    @property
    def any(self) -> bool:
        return bool(self.bottom or self.top or self.dcn)

    def validate(self, prefix: str = "model.dropout") -> None:
        for key in ("bottom", "top", "dcn"):
            v = getattr(self, key)
            check(0 <= v < 1, f"{prefix}.{key}", v, "a share in [0, 1)")


@dataclass(frozen=True)
class ModelConfig(Validated):
    embedding_dim: int = 16
    bottom_mlp: tuple[int, ...] = (512, 256, 64, 16)
    top_mlp: tuple[int, ...] = (512, 256, 1)
    interaction: Literal["dot", "cat", "dcn"] = "dot"
    dense_precision: Literal["fp32", "bf16"] = "fp32"
    # the cross network of interaction: dcn (ignored by dot and cat)
    dcn: DCNConfig = field(default_factory=DCNConfig)
    # dropout in training (bottom and top MLPs' hidden layers, the cross network's output)
    dropout: DropoutConfig = field(default_factory=DropoutConfig)

    def validate(self, prefix: str = "model") -> None:
        check(self.embedding_dim > 0 and self.embedding_dim % 4 == 0, f"{prefix}.embedding_dim",
              self.embedding_dim, "a positive multiple of 4 (fbgemm's row alignment)")
        check(len(self.bottom_mlp) >= 1 and all(w > 0 for w in self.bottom_mlp),
              f"{prefix}.bottom_mlp", self.bottom_mlp, "a non-empty list of positive widths")
        check(len(self.top_mlp) >= 1 and all(w > 0 for w in self.top_mlp),
              f"{prefix}.top_mlp", self.top_mlp, "a non-empty list of positive widths")
        check(self.top_mlp[-1] == 1, f"{prefix}.top_mlp", self.top_mlp,
              "a last width of 1 (one click logit)")
        check_choice(f"{prefix}.interaction", self.interaction, ("dot", "cat", "dcn"))
        check_choice(f"{prefix}.dense_precision", self.dense_precision, ("fp32", "bf16"))
        if self.interaction == "dot":
            check(self.bottom_mlp[-1] == self.embedding_dim, f"{prefix}.bottom_mlp",
                  self.bottom_mlp,
                  f"a last width equal to {prefix}.embedding_dim={self.embedding_dim} "
                  "(the dot interaction multiplies the bottom MLP output with each embedding)")


def check_dot_dims(dims: Sequence[int], names: Sequence[str], bottom: int | None = None,
                   key: str = "model.interaction") -> None:
    """The ``dot`` interaction multiplies every pair of pooled vectors (and each with the bottom
    MLP's output, ``bottom`` wide): they need one dim. The error names the first table that
    differs."""
    want = dims[0] if bottom is None else bottom
    for name, d in zip(names, dims):
        if d != want:
            first = "the bottom MLP's output" if bottom is not None else f"table {names[0]}"
            raise ConfigError(f"{key}='dot' is not allowed with tables of different dims: table "
                              f"{name} has dim {d}, {first} {want}; use 'cat' or 'dcn', or give "
                              "every table that one dim")


def table_dims(cfg: ModelConfig, tables: int | Sequence[int]) -> tuple[int, ...]:
    """Each table's dim: ``tables`` as given, or that many tables at ``cfg.embedding_dim``."""
    if isinstance(tables, int):
        return (cfg.embedding_dim,) * tables
    return tuple(int(d) for d in tables)


def interaction_dim(cfg: ModelConfig, tables: int | Sequence[int]) -> int:
    """The top MLP's input width for tables of these dims (or that many at the model's dim)."""
    dims = table_dims(cfg, tables)
    d = cfg.bottom_mlp[-1]
    if cfg.interaction == "dot":
        f = len(dims) + 1
        return d + f * (f - 1) // 2
    return d + sum(dims)  # cat, and dcn (a cross net keeps the width)


class MLP(nn.Sequential):
    """Linear layers with ReLU between them (and after the last unless ``last_activation=False``).
    ``dropout``: in training, that share of each hidden layer's activations (after its ReLU) is
    zeroed and the rest scaled by 1 / (1 - dropout); never the last layer's output. The layers
    are the same modules with or without it (checkpoints load either way)."""

    def __init__(self, in_dim: int, widths: Sequence[int], last_activation: bool = True,
                 dropout: float = 0.0):
        layers: list[nn.Module] = []
        drop_after = []
        for i, w in enumerate(widths):
            with warnings.catch_warnings():  # no dense features: the first layer is a learned
                # constant (its bias, from 0); torch warns that it initialises no weights
                warnings.filterwarnings("ignore", "Initializing zero-element tensors")
                layers.append(nn.Linear(in_dim, w))
            if i < len(widths) - 1 or last_activation:
                layers.append(nn.ReLU(inplace=True))
            if i < len(widths) - 1:
                drop_after.append(len(layers) - 1)
            in_dim = w
        super().__init__(*layers)
        self.dropout = float(dropout)
        self._drop_after = frozenset(drop_after)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.dropout and self.training):
            return super().forward(x)
        for i, layer in enumerate(self):
            x = layer(x)
            if i in self._drop_after:
                x = F.dropout(x, self.dropout, training=True)
        return x


class DenseArch(nn.Module):
    """Everything dense: bottom MLP, interaction, top MLP. This is what DDP wraps."""

    def __init__(self, num_dense: int, tables: int | Sequence[int], cfg: ModelConfig):
        """``tables``: the dims of the tables the pooled embeddings come from (or how many, at
        ``cfg.embedding_dim``)."""
        super().__init__()
        self.cfg = cfg
        self.dims = table_dims(cfg, tables)
        self.num_tables = num_tables = len(self.dims)
        if cfg.interaction == "dot":
            check_dot_dims(self.dims, [f"#{i}" for i in range(num_tables)],
                           bottom=cfg.bottom_mlp[-1])
        self.bottom = MLP(num_dense, cfg.bottom_mlp, dropout=cfg.dropout.bottom)
        self.top = MLP(interaction_dim(cfg, self.dims), cfg.top_mlp, last_activation=False,
                       dropout=cfg.dropout.top)
        if cfg.interaction == "dcn":
            self.cross = LowRankCrossNet(interaction_dim(cfg, self.dims), cfg.dcn.num_layers,
                                         cfg.dcn.low_rank)
        if cfg.interaction == "dot":
            f = num_tables + 1
            li, lj = torch.tril_indices(f, f, offset=-1)
            # flat positions of the strictly-lower triangle: index_select (backward: index_add)
            # is cheaper than 2-D advanced indexing (backward: index_put with accumulate)
            self.register_buffer("_tril", li * f + lj, persistent=False)

    def autocast(self):
        if self.cfg.dense_precision == "bf16":
            device = next(self.top.parameters()).device.type
            return torch.autocast(device_type=device, dtype=torch.bfloat16)
        return nullcontext()

    def interact(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """x: [B, d] bottom output; emb: [B, T * D] pooled embeddings."""
        if self.cfg.interaction == "cat":
            return torch.cat([x, emb.to(x.dtype)], dim=1)
        if self.cfg.interaction == "dcn":
            crossed = self.cross(torch.cat([x, emb.to(x.dtype)], dim=1))
            p = self.cfg.dropout.dcn
            return F.dropout(crossed, p, training=True) if p and self.training else crossed
        b = x.shape[0]
        feats = torch.cat([x.unsqueeze(1), emb.to(x.dtype).view(b, self.num_tables, -1)], dim=1)
        z = torch.bmm(feats, feats.transpose(1, 2)).flatten(1)
        return torch.cat([x, z.index_select(1, self._tril)], dim=1)

    def forward(self, dense: torch.Tensor, emb) -> torch.Tensor:
        """``emb``: pooled embeddings [B, T * D], or a function returning them, called after the
        bottom MLP (so a sharded lookup's output all-to-all travels while it computes)."""
        with self.autocast():
            x = self.bottom(dense)
            if callable(emb):
                emb = emb()
            logits = self.top(self.interact(x, emb)).squeeze(1)
        # reduced-precision logits become fp32 (an fp64 arch, as tests of HF use, stays fp64)
        return logits if logits.dtype == torch.float64 else logits.float()


class DLRM(nn.Module):
    """Embeddings (a ``recscale.embedding.EmbeddingCollection``: SparseFeatures -> [B, T * D])
    + the dense arch.

    The dense arch is initialised from ``seed`` on its own, so a single-process and a sharded
    model built with the same seed start from the same dense weights.
    """

    def __init__(self, num_dense: int, tables: int | Sequence[int], cfg: ModelConfig,
                 embeddings: nn.Module, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.num_tables = len(table_dims(cfg, tables))
        self.embeddings = embeddings
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.dense_arch = DenseArch(num_dense, tables, cfg)

    @property
    def dense(self) -> DenseArch:
        """The dense arch itself (under the sharded runtime ``dense_arch`` is its DDP wrapper):
        what checkpoints save and a single-process model loads."""
        arch = self.dense_arch
        return arch.module if isinstance(arch, DistributedDataParallel) else arch

    @property
    def bottom(self) -> MLP:
        return self.dense.bottom

    @property
    def top(self) -> MLP:
        return self.dense.top

    def forward(self, dense: torch.Tensor, sparse) -> torch.Tensor:
        """-> click logits [B] (fp32). ``sparse``: SparseFeatures, or what the embeddings'
        ``start`` returned. A collection that overlaps its output exchange with the bottom MLP
        (sharded, ``overlap_output``) hands the dense arch a deferred lookup."""
        return self.dense_arch(dense, self.embeddings.lookup(sparse))

    def dense_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters for the dense optimizer (the embeddings update themselves in backward)."""
        yield from self.dense.parameters()


def build_dlrm(
    cfg: ModelConfig,
    table_sizes: Sequence[int],
    num_dense: int,
    embedding_optimizer,
    seed: int = 0,
    device: torch.device | str = "cpu",
    placements=None,
    tiers=None,
    dims: Sequence[int] | None = None,
    feature_tables: Sequence[int] | None = None,
    pooling: Sequence[str] | None = None,
) -> DLRM:
    """Single-process DLRM with all tables in one fused fbgemm module. Same seed, same weights.
    ``placements`` (``recscale.embedding.Placement`` per table, e.g. from a plan) put
    tables on the DDR/SSD tiers behind a cache (``tiers``: TierConfig); training is unchanged.
    ``dims``: each table's dim (default: ``cfg.embedding_dim`` for all); ``feature_tables``
    and ``pooling``: each sparse feature's table and pooling (``recscale.embedding.features``;
    default: one table per feature, summed)."""
    from recscale.embedding import FusedEmbeddingBags
    from recscale.embedding.features import feature_bags

    dims = list(table_dims(cfg, len(table_sizes) if dims is None else dims))
    if placements is not None and any(p.kind != "memory" for p in placements):
        from recscale.embedding.tier_placement import build_embedding_bags

        emb = build_embedding_bags(table_sizes, dims, embedding_optimizer, placements, tiers,
                                   device=device, seed=seed)
    else:
        emb = FusedEmbeddingBags(table_sizes, dims, embedding_optimizer, device=device, seed=seed)
    emb = feature_bags(emb, feature_tables, pooling)
    model = DLRM(num_dense, emb.dims, cfg, emb, seed=seed)
    return model.to(device)
