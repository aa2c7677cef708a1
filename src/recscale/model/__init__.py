"""Models: DLRM (bottom MLP, fused embedding bags, feature interaction, top MLP; ``dlrm.py``,
the DCNv2 cross network in ``dcn.py``), a trained model between processes, devices and tiers
(``convert.py``: ``ModelRecipe``, CPU copies, warm starts, table growth, the model a resolved
config describes), and the dense arch as the cost model sees it (``dense_cost.py``)."""

from recscale.model.convert import (
    ModelRecipe,
    check_table_growth,
    copy_tables,
    cpu_model_from,
    grow_tables,
    load_state_into,
    model_from_resolved,
    recipe_from_resolved,
    to_cpu_model,
)
from recscale.model.dense_cost import dense_model, dense_spec
from recscale.model.dlrm import (
    DLRM,
    MLP,
    DenseArch,
    DropoutConfig,
    ModelConfig,
    build_dlrm,
    interaction_dim,
)

__all__ = [
    "DLRM",
    "MLP",
    "DenseArch",
    "DropoutConfig",
    "ModelConfig",
    "ModelRecipe",
    "build_dlrm",
    "check_table_growth",
    "copy_tables",
    "cpu_model_from",
    "dense_model",
    "dense_spec",
    "grow_tables",
    "interaction_dim",
    "load_state_into",
    "model_from_resolved",
    "recipe_from_resolved",
    "to_cpu_model",
]
