"""A trained DLRM between processes, devices and tiers: the recipe that builds the same model
anywhere (``ModelRecipe``), an ordinary in-memory CPU copy of a model trained on any device or
tier or gathered from every rank's shards (``to_cpu_model``, ``cpu_model_from``), the inverse
(``load_state_into``: a warm start onto any device or tier), tables grown to an append-only
vocabulary (``grow_tables``), and the model a run's resolved config describes
(``model_from_resolved``: what evaluation, the retrain's champion and the registered model load).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from recscale.embedding import EmbeddingOptimizerConfig, TierConfig
from recscale.model.dlrm import DLRM, ModelConfig, build_dlrm


@dataclass(frozen=True)
class ModelRecipe:
    """What builds a run's DLRM the same way in any process: the model block, the tables' rows,
    the dense inputs, the embedding optimizer and the seed (same recipe, same initial weights);
    ``tiers``: where tables placed below memory keep their slow tier; ``table_dims``: each
    table's dim (None: ``model.embedding_dim`` for all); ``feature_tables``: each sparse
    feature's table (None: one table per feature, in order); ``pooling``: each feature's
    (None: all ``sum``)."""

    model: ModelConfig
    table_sizes: tuple[int, ...]
    num_dense: int
    embedding_optimizer: EmbeddingOptimizerConfig
    seed: int = 0
    tiers: TierConfig | None = None
    table_dims: tuple[int, ...] | None = None
    feature_tables: tuple[int, ...] | None = None
    pooling: tuple[str, ...] | None = None

    def build(self, device: torch.device | str = "cpu", placements=None) -> DLRM:
        return build_dlrm(self.model, self.table_sizes, self.num_dense, self.embedding_optimizer,
                          seed=self.seed, device=device, placements=placements, tiers=self.tiers,
                          dims=self.table_dims, feature_tables=self.feature_tables,
                          pooling=self.pooling)

    def with_tables(self, table_sizes: Sequence[int]) -> ModelRecipe:
        return replace(self, table_sizes=tuple(int(n) for n in table_sizes))


def copy_tables(dst: DLRM, tables, states, dense_state: dict) -> None:
    """Whole tables, their embedding-optimizer states (per table, as ``split_optimizer_states``
    gives them) and the dense arch's state into a one-process ``dst`` on any device or tier.
    fbgemm keeps tables in device-specific buffers (weights_dev on CUDA, weights_host on the CPU)
    and a tiered module keeps them on its slow tier, so state_dicts do not carry over: copy into
    each table's views, then make a slow tier's copy durable."""
    emb = dst.embeddings
    with torch.no_grad():
        for view, w in zip(emb.split_weights(), tables):
            view.copy_(w)
        for views, saved in zip(emb.split_optimizer_states() or [], states or []):
            for view, x in zip(views, saved):
                view.copy_(x.view_as(view))
    emb.flush()
    dst.dense.load_state_dict(dense_state)


def cpu_model_from(recipe: ModelRecipe, tables, states, dense_state: dict) -> DLRM:
    """A single-process CPU DLRM holding these full tables, optimizer states (per table, as
    ``split_optimizer_states`` gives them) and dense-arch state, from any device or tier."""
    cpu = recipe.build("cpu")
    copy_tables(cpu, tables, states, dense_state)
    return cpu


def to_cpu_model(model: DLRM, recipe: ModelRecipe) -> DLRM:
    """The same model as an ordinary in-memory CPU model (copied table by table, see
    ``copy_tables``); a tiered module's scratch files are released afterwards."""
    emb = model.embeddings
    cpu = cpu_model_from(recipe, emb.split_weights(), emb.split_optimizer_states(),
                         model.dense.state_dict())
    emb.close()
    return cpu


def load_state_into(model: DLRM, state: dict[str, torch.Tensor], recipe: ModelRecipe,
                    state_table_sizes: Sequence[int] | None = None,
                    feature_names: Sequence[str] | None = None) -> None:
    """The inverse of ``to_cpu_model``: the state_dict of an in-memory CPU model (tables,
    embedding-optimizer state, dense layers) into ``model`` on any device or tier (a warm start).

    ``state_table_sizes``: the state's tables when they are smaller than the recipe's (a
    vocabulary grown append-only): the tables grow (``grow_tables``), each new row as a fresh
    model of the new sizes initialises it, with fresh optimizer state (``feature_names`` name
    the tables in the error when one would shrink)."""
    ref = recipe.build("cpu")
    src = ref
    if state_table_sizes is not None and list(state_table_sizes) != list(recipe.table_sizes):
        check_table_growth(state_table_sizes, recipe.table_sizes,
                           feature_names or [f"#{i}" for i in range(len(recipe.table_sizes))])
        src = recipe.with_tables(state_table_sizes).build("cpu")
    try:
        src.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(f"the warm-start state does not fit model={recipe.model} with table "
                         f"sizes {list(state_table_sizes or recipe.table_sizes)}: {exc}") from None
    if src is not ref:
        grow_tables(ref, src)
    copy_tables(model, ref.embeddings.split_weights(), ref.embeddings.split_optimizer_states(),
                ref.dense.state_dict())


def check_table_growth(old: Sequence[int], new: Sequence[int], names: Sequence[str]) -> None:
    """Tables may only grow (append-only vocabularies); raises ValueError naming the table and
    both sizes when one shrinks or the number of tables differs."""
    if len(old) != len(new):
        raise ValueError(f"the warm-start state has {len(old)} tables but the data has {len(new)}")
    for name, a, b in zip(names, old, new):
        if int(b) < int(a):
            raise ValueError(f"table {name} would shrink from {a} to {b} rows: a warm start only "
                             "grows tables (an append-only vocabulary keeps every row)")


def grow_tables(dst: DLRM, src: DLRM) -> None:
    """Every table of ``src`` into the first rows of the same (at least as large) table of
    ``dst``, weights and per-row embedding-optimizer state; ``dst``'s other rows keep what they
    hold (a freshly built model's initial rows and state). The dense arch is copied."""
    src_states = src.embeddings.split_optimizer_states() or []
    dst_states = dst.embeddings.split_optimizer_states() or []
    with torch.no_grad():
        for t, (d, s) in enumerate(zip(dst.embeddings.split_weights(),
                                       src.embeddings.split_weights())):
            d[:s.shape[0]].copy_(s)
            for dv, sv in zip(dst_states[t] if dst_states else [],
                              src_states[t] if src_states else []):
                # per-row state ([rows] or [rows * dim] flat): the old rows' part
                dv.view(d.shape[0], -1)[:s.shape[0]].copy_(sv.view(s.shape[0], -1))
    dst.embeddings.flush()
    dst.dense.load_state_dict(src.dense.state_dict())


def recipe_from_resolved(resolved: dict) -> ModelRecipe:
    """The recipe of the model a resolved config (``recscale.train.resolved_config``) describes:
    only the model block, the fitted schema (the dense inputs, the tables' rows and dims), the
    embedding optimizer and the seed matter, so configs of older runs (no schema: the Criteo
    preset) load too."""
    from recscale.config import parse
    from recscale.data.schema import FittedSchema

    train = resolved.get("train", {})
    model_cfg = parse(ModelConfig, resolved["model"], "model")
    fitted = FittedSchema.of(resolved)
    return ModelRecipe(model_cfg, fitted.table_rows, fitted.num_dense,
                       parse(EmbeddingOptimizerConfig, train.get("embedding_optimizer"),
                             "train.embedding_optimizer"), seed=train.get("seed", 0),
                       table_dims=fitted.table_dims(model_cfg.embedding_dim),
                       feature_tables=fitted.feature_tables(), pooling=fitted.pooling())


def model_from_resolved(resolved: dict, state: dict[str, torch.Tensor]) -> DLRM:
    """The in-memory CPU model a resolved config describes, holding ``state``."""
    model = recipe_from_resolved(resolved).build("cpu")
    model.load_state_dict(state)
    return model
