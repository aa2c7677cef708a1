"""Distinct ids per batch, measured in the data (what the cost model's update term counts)."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recscale.data.stats import distinct_fractions


def _manifest(tmp_path, cols, row_group_size):
    path = tmp_path / "part-00000.parquet"
    pq.write_table(pa.table(cols), path, row_group_size=row_group_size)
    return {"sparse_features": list(cols), "splits": {"train": {"files": [str(path)]}}}


def test_distinct_fractions_count_each_batchs_distinct_ids_single_and_multi_hot(tmp_path):
    rng = np.random.default_rng(0)
    n = 1000
    single = rng.zipf(1.5, n) % 300
    nulls = rng.random(n) < 0.1
    bags = [list(rng.integers(0, 50, rng.integers(0, 6))) for _ in range(n)]
    cols = {"C1": pa.array(single, mask=nulls), "C2": pa.array(bags, type=pa.list_(pa.int64()))}
    m = _manifest(tmp_path, cols, row_group_size=128)  # batches cross row groups
    got = distinct_fractions(m, batch_rows=300, max_batches=3)
    want = []
    for ids_of in (lambda a, b: single[a:b][~nulls[a:b]],
                   lambda a, b: np.concatenate([np.array(x, dtype=np.int64) for x in bags[a:b]])):
        want.append(np.mean([np.unique(ids_of(a, a + 300)).size / ids_of(a, a + 300).size
                             for a in (0, 300, 600)]))
    assert got == pytest.approx(want, rel=1e-12)
    # fewer rows than a batch: one batch of all of them
    assert distinct_fractions(m, batch_rows=5000)[0] == pytest.approx(
        np.unique(single[~nulls]).size / (~nulls).sum())
    with pytest.raises(ValueError, match="batch_rows=0"):
        distinct_fractions(m, 0)


def test_a_run_plans_with_the_datas_distinct_fractions(parquet_dataset):
    from recscale.config import parse
    from recscale.runconfig import DLRMConfig, plan_for_run

    cfg = parse(DLRMConfig, {"model": {"embedding_dim": 16, "bottom_mlp": [32, 16]},
                             "train": {"batch_size_per_rank": 256,
                                       "launch": {"world_size": 2}}}, "")
    plan = plan_for_run(parquet_dataset, cfg)
    want = distinct_fractions(parquet_dataset, 512, max_batches=4)
    assert [t.distinct_fraction for t in plan.tables] == pytest.approx(want)
    assert min(want) < 0.5  # skewed synthetic ids repeat within a batch
