"""Table specs from a preprocessed dataset's manifest (plain dict: no dependency on recscale.data)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .types import TableSpec


def table_specs_from_manifest(manifest: Mapping, embedding_dim: int | Sequence[int],
                              distinct: Sequence[float] | None = None,
                              feature_tables: Sequence[int] | None = None,
                              table_names: Sequence[str] | None = None) -> list[TableSpec]:
    """One spec per table: rows = its size (``table_sizes``), dim = ``embedding_dim`` (one for
    all, or one per table, as the fitted schema gives them), the features that look it up
    (``feature_tables[f]``: feature f's table; default one table per feature, in order),
    pooling factor = the mean number of ids per sample over those features, measured in the
    data (floored at 0.001 for all-missing features); ``distinct``: per feature, the distinct
    fraction of a global batch's ids (``recscale.data.stats.distinct_fractions``; default 1.0),
    a shared table's the features' mean weighted by their pooling factors; ``table_names``:
    default each table's first feature's name."""
    features = list(manifest["sparse_features"])
    sizes = list(manifest["table_sizes"])
    tables = list(range(len(features))) if feature_tables is None else list(feature_tables)
    if len(tables) != len(features) or sorted(set(tables)) != list(range(len(sizes))):
        raise ValueError(f"feature_tables {tables} must give each of the {len(features)} "
                         f"sparse features one of the {len(sizes)} tables, using every table")
    dims = ([int(embedding_dim)] * len(sizes) if isinstance(embedding_dim, int)
            else [int(d) for d in embedding_dim])
    distinct = [1.0] * len(features) if distinct is None else list(distinct)
    if len(distinct) != len(features):
        raise ValueError(f"distinct fractions: {len(distinct)} values for {len(features)} "
                         "sparse features")
    pools = [float(p) for p in manifest["pooling_factors"]]
    out = []
    for t, rows in enumerate(sizes):
        fs = [f for f in range(len(features)) if tables[f] == t]
        pool = sum(pools[f] for f in fs)
        u = (sum(pools[f] * distinct[f] for f in fs) / pool if len(fs) > 1 and pool > 0
             else float(distinct[fs[0]]))
        name = table_names[t] if table_names is not None else features[fs[0]]
        out.append(TableSpec(name=f"t_{name}", num_embeddings=int(rows), embedding_dim=dims[t],
                             pooling_factor=max(pool, 1e-3),
                             feature_names=tuple(features[f] for f in fs),
                             distinct_fraction=min(max(float(u), 1e-6), 1.0)))
    return out
