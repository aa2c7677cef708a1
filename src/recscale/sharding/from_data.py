"""Table specs from a preprocessed dataset's manifest (plain dict: no dependency on recscale.data)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .types import TableSpec


def table_specs_from_manifest(manifest: Mapping, embedding_dim: int,
                              distinct: Sequence[float] | None = None) -> list[TableSpec]:
    """One table per categorical feature: rows = its hashed table size, pooling factor = the mean
    number of ids per sample measured in the data (floored at 0.001 for all-missing features);
    ``distinct``: per feature, the distinct fraction of a global batch's ids (measured in the
    data, ``recscale.data.stats.distinct_fractions``; default 1.0)."""
    features = manifest["sparse_features"]
    distinct = [1.0] * len(features) if distinct is None else list(distinct)
    if len(distinct) != len(features):
        raise ValueError(f"distinct fractions: {len(distinct)} values for {len(features)} "
                         "sparse features")
    return [
        TableSpec(name=f"t_{f}", num_embeddings=int(rows), embedding_dim=embedding_dim,
                  pooling_factor=max(float(pool), 1e-3), feature_names=(f,),
                  distinct_fraction=min(max(float(u), 1e-6), 1.0))
        for f, rows, pool, u in zip(features, manifest["table_sizes"],
                                    manifest["pooling_factors"], distinct)
    ]
