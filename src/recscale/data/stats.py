"""What the planner needs to know of a dataset beyond its manifest: how many distinct rows of each
table a batch touches.

A batch's backward updates each distinct row once (fbgemm sums the gradients of repeated ids
first), so the update work of a table is its distinct ids per batch, not its ids: on skewed data
(a few ids in most samples) a table of 200,000 rows looked up 1,024 times may touch 200 rows.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def distinct_fractions(manifest: Mapping, batch_rows: int, max_batches: int = 4) -> list[float]:
    """Per sparse feature of ``manifest``: distinct ids / ids in a batch of ``batch_rows``
    consecutive train rows, the mean over the first ``max_batches`` batches (1.0 where a feature
    has no ids there). Fewer train rows than a batch: one batch of all of them."""
    if batch_rows <= 0:
        raise ValueError(f"batch_rows={batch_rows}: expected a positive number of rows")
    features = list(manifest["sparse_features"])
    want = batch_rows * max_batches
    tables, got = [], 0
    for path in manifest["splits"]["train"]["files"]:
        f = pq.ParquetFile(path)
        for g in range(f.num_row_groups):
            t = f.read_row_group(g, columns=features)
            tables.append(t)
            got += t.num_rows
            if got >= want:
                break
        if got >= want:
            break
    if not got:
        return [1.0] * len(features)
    n = max(1, min(max_batches, got // batch_rows))
    size = min(batch_rows, got)
    out = []
    for name in features:
        col = pa.chunked_array([c for t in tables for c in t.column(name).chunks])
        fractions = []
        for b in range(n):
            chunk = col.slice(b * size, size)
            if pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type):
                chunk = pc.list_flatten(chunk)  # multi-hot bags: every id of the batch
            ids = chunk.drop_null().to_numpy()
            if ids.size:
                fractions.append(np.unique(ids).size / ids.size)
        out.append(float(np.mean(fractions)) if fractions else 1.0)
    return out

