"""Table specs from a preprocessed dataset's manifest (plain dict: no dependency on recscale.data)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .types import TableSpec


def table_specs_from_manifest(manifest: Mapping, embedding_dim: int | Sequence[int],
                              distinct: Sequence[float] | None = None) -> list[TableSpec]:
    """One table per categorical feature: rows = its table size, dim = ``embedding_dim`` (one for
    all, or one per table, as the fitted schema gives them), pooling factor = the mean number of
    ids per sample measured in the data (floored at 0.001 for all-missing features);
    ``distinct``: per feature, the distinct fraction of a global batch's ids (measured in the
    data, ``recscale.data.stats.distinct_fractions``; default 1.0)."""
    features = manifest["sparse_features"]
    dims = ([int(embedding_dim)] * len(features) if isinstance(embedding_dim, int)
            else [int(d) for d in embedding_dim])
    distinct = [1.0] * len(features) if distinct is None else list(distinct)
    if len(distinct) != len(features):
        raise ValueError(f"distinct fractions: {len(distinct)} values for {len(features)} "
                         "sparse features")
    return [
        TableSpec(name=f"t_{f}", num_embeddings=int(rows), embedding_dim=dim,
                  pooling_factor=max(float(pool), 1e-3), feature_names=(f,),
                  distinct_fraction=min(max(float(u), 1e-6), 1.0))
        for f, rows, dim, pool, u in zip(features, manifest["table_sizes"], dims,
                                         manifest["pooling_factors"], distinct)
    ]
