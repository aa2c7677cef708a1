"""Embeddings: fbgemm table-batched embedding bags with the optimizer fused into backward, in
memory, on memory tiers behind a cache, or sharded over ranks; all ``EmbeddingCollection``s.

- ``api``: ``EmbeddingCollection`` (the Protocol), ``TableShard``, ``LocalCollection``
- ``tbe``: ``FusedEmbeddingBags`` (all in memory), ``table_init``, ``InitSlice``
- ``tier_config``: ``TierConfig`` (``train.tiers``)
- ``store``: ``SlowTierStore`` (DDR tensor or SSD memmap + journal)
- ``cache``: ``TieredEmbeddingBags`` (the cache over a slow tier)
- ``placement``: ``Placement``, ``placement_for``, ``build_embedding_bags``,
  ``MultiTierEmbeddingBags``, ``managed_caching_bags``, ``merge_tier_stats``
- ``sharded``: ``ShardedEmbeddingCollection`` (with ``input_dist`` and ``sharded_autograd``)

Importing this package checks that the installed torch and fbgemm_gpu load together and fails
with both versions and the working pair named when they do not.
"""

from recscale import check_fbgemm

FBGEMM_VERSION = check_fbgemm()

from recscale.embedding.api import (  # noqa: E402
    EmbeddingCollection,
    LocalCollection,
    TableShard,
    optimizer_config_of,
    set_learning_rate,
)
from recscale.embedding.cache import CacheTooSmallError, TieredEmbeddingBags  # noqa: E402
from recscale.embedding.tbe import (  # noqa: E402
    EMBEDDING_OPTIMIZERS,
    EmbeddingOptimizerConfig,
    FusedEmbeddingBags,
    InitSlice,
    table_init,
)
from recscale.embedding.tier_config import TierConfig  # noqa: E402
from recscale.embedding.tier_placement import (  # noqa: E402
    MultiTierEmbeddingBags,
    Placement,
    build_embedding_bags,
    managed_caching_bags,
    merge_tier_stats,
    placement_for,
)

__all__ = [
    "EMBEDDING_OPTIMIZERS",
    "FBGEMM_VERSION",
    "CacheTooSmallError",
    "EmbeddingCollection",
    "EmbeddingOptimizerConfig",
    "FusedEmbeddingBags",
    "InitSlice",
    "LocalCollection",
    "MultiTierEmbeddingBags",
    "Placement",
    "TableShard",
    "TierConfig",
    "TieredEmbeddingBags",
    "build_embedding_bags",
    "managed_caching_bags",
    "merge_tier_stats",
    "optimizer_config_of",
    "placement_for",
    "set_learning_rate",
    "table_init",
]
