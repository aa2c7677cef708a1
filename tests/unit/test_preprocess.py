import numpy as np
import pyarrow.parquet as pq
import pytest

from recscale.config import ConfigError, parse
from recscale.data.criteo import DENSE_NAMES, SPARSE_NAMES, read_criteo_tsv
from recscale.data.loader import (
    LoaderConfig,
    list_row_groups,
    make_loader,
    shard_row_groups,
)
from recscale.data.preprocess import SPLITS, PreprocessConfig


def test_transform_matches_the_raw_rows_and_splits_follow_row_order(synthetic_tsv, parquet_dataset):
    cfg, rep = synthetic_tsv
    man = parquet_dataset
    sizes = np.asarray(man["table_sizes"])
    assert man["rows_written"] == cfg.num_rows and man["rows_rejected"] == 0
    tables = {s: pq.read_table(man["splits"][s]["files"][0]) for s in SPLITS}
    counts = [tables[s].num_rows for s in SPLITS]
    assert counts == [56_000, 7_000, 7_000]
    rows = np.concatenate([tables[s].column("row").to_numpy() for s in SPLITS])
    assert np.array_equal(rows, np.arange(cfg.num_rows))  # every row once, in order
    raw = list(read_criteo_tsv(rep.path))
    dense = np.concatenate([b.dense for b in raw])
    dpres = np.concatenate([b.dense_present for b in raw])
    sparse = np.concatenate([b.sparse for b in raw])
    spres = np.concatenate([b.sparse_present for b in raw])
    full = {c: np.concatenate([tables[s].column(c).to_numpy(zero_copy_only=False) for s in SPLITS])
            for c in DENSE_NAMES}
    for j, c in enumerate(DENSE_NAMES):
        want = np.where(dpres[:, j], np.log1p(np.maximum(dense[:, j], 0)), 0.0).astype(np.float32)
        assert np.array_equal(full[c], want)
    for j, c in enumerate(SPARSE_NAMES):
        col = np.concatenate([tables[s].column(c).to_numpy(zero_copy_only=False) for s in SPLITS])
        isnull = np.isnan(col.astype(np.float64)) if col.dtype != np.int64 else np.zeros(len(col), bool)
        assert np.array_equal(~isnull, spres[:, j])
        assert np.array_equal(col[~isnull].astype(np.int64), sparse[spres[:, j], j].astype(np.int64) % sizes[j])
    # row groups are the configured size
    md = pq.ParquetFile(man["splits"]["train"]["files"][0]).metadata
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == [5000] * 11 + [1000]
    assert man["pooling_factors"][0] == 1.0 and man["pooling_factors"][21] < 0.5


def test_loader_yields_every_row_once_in_fbgemm_layout(parquet_dataset):
    files = parquet_dataset["splits"]["train"]["files"]
    batches = list(make_loader(files, LoaderConfig(batch_size=4096)))
    assert [b.batch_size for b in batches] == [4096] * 13 + [56_000 - 13 * 4096]
    rows = np.concatenate([b.row_ids.numpy() for b in batches])
    assert np.array_equal(rows, np.arange(56_000))
    table = pq.read_table(files[0]).slice(4096, 4096)  # second batch
    b = batches[1]
    assert np.array_equal(b.labels.numpy(), table.column("label").to_numpy().astype(np.float32))
    offsets = b.sparse.offsets().numpy()
    T, B = b.sparse.lengths.shape
    assert (T, B) == (26, 4096) and offsets[-1] == b.sparse.values.numel()
    for t in (0, 21):  # feature-major: feature t, sample i at offsets[t * B + i]
        col = table.column(SPARSE_NAMES[t])
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        assert np.array_equal(b.sparse.lengths[t].numpy(), valid.astype(np.int64))
        vals = b.sparse.values[offsets[t * B]: offsets[(t + 1) * B]].numpy()
        assert np.array_equal(vals, col.drop_null().to_numpy())


def test_rank_shards_are_disjoint_contiguous_and_balanced(parquet_dataset):
    files = parquet_dataset["splits"]["train"]["files"]
    refs = list_row_groups(files)
    seen = []
    for rank in range(2):
        loader = make_loader(files, LoaderConfig(batch_size=1000, rank=rank, world_size=2))
        seen.append(np.concatenate([b.row_ids.numpy() for b in loader]))
    assert not set(seen[0]) & set(seen[1])
    assert np.array_equal(np.concatenate(seen), np.arange(56_000))
    for world in (3, 7):  # uneven splits cut row groups; ranks differ by at most one row
        parts = [shard_row_groups(refs, r, world) for r in range(world)]
        sizes = [sum(x.rows for x in p) for p in parts]
        assert sum(sizes) == 56_000 and max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="rank=2"):
        shard_row_groups(refs, 2, 2)


def test_loader_state_resumes_exactly(parquet_dataset):
    files = parquet_dataset["splits"]["validation"]["files"]
    loader = make_loader(files, LoaderConfig(batch_size=700))
    it = iter(loader)
    first = [next(it).row_ids.numpy() for _ in range(3)]
    state = loader.state_dict()
    rest = np.concatenate([b.row_ids.numpy() for b in it])
    resumed = make_loader(files, LoaderConfig(batch_size=700))
    resumed.load_state_dict(state)
    again = np.concatenate([b.row_ids.numpy() for b in resumed])
    assert np.array_equal(again, rest)
    assert np.array_equal(np.concatenate(first + [rest]), np.arange(56_000, 63_000))


def test_bad_preprocess_parameters_name_the_key():
    with pytest.raises(ConfigError, match=r"preprocess\.splits"):
        parse(PreprocessConfig, {"splits": [0.5, 0.2, 0.2]}, "preprocess")
    with pytest.raises(ConfigError, match=r"unknown key preprocess\.row_groups"):
        parse(PreprocessConfig, {"row_groups": 5}, "preprocess")
