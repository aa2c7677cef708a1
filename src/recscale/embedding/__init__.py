"""Embeddings: fbgemm table-batched embedding bags with the optimizer fused into backward.

Importing this package checks that the installed torch and fbgemm_gpu load together and fails
with both versions and the working pair named when they do not.
"""

from recscale import check_fbgemm

FBGEMM_VERSION = check_fbgemm()

from recscale.embedding.tbe import (  # noqa: E402
    EMBEDDING_OPTIMIZERS,
    EmbeddingOptimizerConfig,
    FusedEmbeddingBags,
    table_init,
)

__all__ = [
    "EMBEDDING_OPTIMIZERS",
    "FBGEMM_VERSION",
    "EmbeddingOptimizerConfig",
    "FusedEmbeddingBags",
    "table_init",
]
