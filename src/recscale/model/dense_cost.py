"""The dense arch as the cost model sees it: ``dense_spec`` gives the step-time prediction
(``recscale.sharding.step_time``) a model's FLOPs, parameters and interaction work per sample, for
the planner's report, training's predicted-vs-measured step time and the machine's measurement
alike; ``dense_model`` is a model config at another embedding dim (what the measurement times)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from recscale.model.dlrm import ModelConfig, interaction_dim, table_dims
from recscale.sharding.step_time import DenseSpec


def dense_spec(model_cfg: ModelConfig, tables: int | Sequence[int], num_dense: int) -> DenseSpec:
    """The dense arch of ``model_cfg`` on ``num_dense`` inputs and tables of these dims (or that
    many at the model's dim) as the step-time prediction sees it."""
    dims = table_dims(model_cfg, tables)
    num_tables = len(dims)
    top_in = interaction_dim(model_cfg, dims)
    d = model_cfg.embedding_dim
    if model_cfg.interaction == "dot":  # [B, F, d] x [B, d, F]
        f = num_tables + 1
        return DenseSpec.mlps(num_dense, model_cfg.bottom_mlp, top_in, model_cfg.top_mlp,
                              2.0 * f * f * d, float(f * f * d))
    cross_f = cross_p = 0  # cat: the concatenation; dcn: and the cross layers over it
    n = layers = 0
    if model_cfg.interaction == "dcn":
        n, layers, r = top_in, model_cfg.dcn.num_layers, model_cfg.dcn.low_rank
        cross_f, cross_p = layers * 4 * n * r, layers * (2 * n * r + n)
    return DenseSpec.mlps(num_dense, model_cfg.bottom_mlp, top_in, model_cfg.top_mlp, 0.0,
                          float(top_in + n * layers), float(cross_f), cross_p)


def dense_model(model_cfg: ModelConfig, dim: int) -> ModelConfig:
    """``model_cfg`` with embedding dim ``dim`` (and a bottom MLP ending at it, as the dot
    interaction needs)."""
    bottom = model_cfg.bottom_mlp
    if model_cfg.interaction == "dot":
        bottom = (*bottom[:-1], dim)
    return replace(model_cfg, embedding_dim=dim, bottom_mlp=tuple(bottom))
