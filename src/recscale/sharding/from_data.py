"""Table specs from a preprocessed dataset's manifest (plain dict: no dependency on recscale.data)."""

from __future__ import annotations

from collections.abc import Mapping

from .types import TableSpec


def table_specs_from_manifest(manifest: Mapping, embedding_dim: int) -> list[TableSpec]:
    """One table per categorical feature: rows = its hashed table size, pooling factor = the mean
    number of ids per sample measured in the data (floored at 0.001 for all-missing features)."""
    return [
        TableSpec(name=f"t_{f}", num_embeddings=int(rows), embedding_dim=embedding_dim,
                  pooling_factor=max(float(pool), 1e-3), feature_names=(f,))
        for f, rows, pool in zip(manifest["sparse_features"], manifest["table_sizes"],
                                 manifest["pooling_factors"])
    ]
