"""Models: DLRM (bottom MLP, fused embedding bags, feature interaction, top MLP)."""

from recscale.model.dlrm import (
    DLRM,
    MLP,
    DenseArch,
    ModelConfig,
    build_dlrm,
    copy_tables,
    interaction_dim,
)

__all__ = ["DLRM", "MLP", "DenseArch", "ModelConfig", "build_dlrm", "copy_tables", "interaction_dim"]
