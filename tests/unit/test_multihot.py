"""Multi-hot bags: generator -> parquet -> loader exactly, pooling factors measured from data,
the oracle AUC, and rejects with row number and reason for each kind of bad bag."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from recscale.config import ConfigError
from recscale.data.criteo import SPARSE_NAMES, RejectedRowsError
from recscale.data.loader import LoaderConfig, make_loader, regroup
from recscale.data.multihot import generate_multihot_parquet, preprocess_multihot, raw_schema
from recscale.data.preprocess import PreprocessConfig, load_manifest
from recscale.data.synthetic import MLPERF_MULTI_HOT_SIZES
from recscale.data.vocab import VocabConfig
from recscale.evaluate import auc_score, oracle_auc
from recscale.sharding.from_data import table_specs_from_manifest
from tests.conftest import small_synthetic_config

POOL = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 20, 7, 10, 3, 1, 1)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    cfg = small_synthetic_config(num_rows=3000, multi_hot=True, pooling_factors=POOL)
    d = tmp_path_factory.mktemp("mh")
    rep = generate_multihot_parquet(cfg, d / "day_00.parquet")
    pcfg = PreprocessConfig(row_group_size=700, splits=(0.8, 0.1, 0.1))
    pre = preprocess_multihot([rep.path], d / "out", pcfg, rep.cardinalities)
    return cfg, rep, pcfg, pre, load_manifest(d / "out")


def test_defaults_are_one_hot_with_mlperf_pooling_factors_ready():
    from recscale.data.synthetic import SyntheticConfig

    cfg = SyntheticConfig()
    assert cfg.multi_hot is False and cfg.pooling_factors == MLPERF_MULTI_HOT_SIZES
    with pytest.raises(ConfigError, match=r"data\.synthetic\.pooling_factors"):
        SyntheticConfig(pooling_factors=(1, 2))


def test_bags_round_trip_generator_parquet_loader_exactly(generated):
    cfg, rep, pcfg, pre, manifest = generated
    raw = pq.read_table(rep.path)
    assert pre.rows_written == cfg.num_rows and pre.rows_rejected == 0
    sizes = np.asarray(manifest["table_sizes"])
    want_len = np.stack([pc.fill_null(pc.list_value_length(raw.column(c)), 0).to_numpy()
                         for c in SPARSE_NAMES], axis=1)  # [N, T]
    want_vals = [pc.list_flatten(raw.column(c)).to_numpy() % sizes[j]
                 for j, c in enumerate(SPARSE_NAMES)]
    want_off = [np.concatenate([[0], np.cumsum(want_len[:, j])]) for j in range(len(SPARSE_NAMES))]
    assert (want_len > 1).any() and (want_len == 0).any()
    seen = 0
    for split in ("train", "validation", "test"):
        for batch in make_loader(manifest["splits"][split]["files"], LoaderConfig(batch_size=256)):
            rows = batch.row_ids.numpy()
            assert np.array_equal(rows, np.arange(seen, seen + len(rows)))
            lengths = batch.sparse.lengths.numpy()
            assert np.array_equal(lengths, want_len[rows].T)
            got = batch.sparse.values.numpy()
            want = np.concatenate([want_vals[j][want_off[j][rows[0]]: want_off[j][rows[-1] + 1]]
                                   for j in range(len(SPARSE_NAMES))])
            assert np.array_equal(got, want)
            assert np.array_equal(batch.labels.numpy(), raw.column("label").to_numpy()[rows])
            seen += len(rows)
    assert seen == cfg.num_rows


def test_pooling_factors_are_measured_from_the_data_for_the_planner(generated):
    cfg, rep, pcfg, pre, manifest = generated
    raw = pq.read_table(rep.path)
    mean = [pc.sum(pc.list_value_length(raw.column(c))).as_py() / raw.num_rows
            for c in SPARSE_NAMES]
    np.testing.assert_allclose(manifest["pooling_factors"], mean, atol=1e-6)
    specs = table_specs_from_manifest(manifest, 8)
    assert [s.pooling_factor for s in specs] == pytest.approx(mean, abs=1e-3)
    assert specs[20].pooling_factor > 10 * specs[2].pooling_factor  # C21 (20) vs C3 (1)


def test_oracle_auc_is_exact_and_informative(generated):
    cfg, rep, *_ = generated
    labels = pq.read_table(rep.path, columns=["label"]).column("label").to_numpy()
    assert np.array_equal(np.load(rep.labels_path), labels)
    assert oracle_auc(rep) == auc_score(labels, np.load(rep.oracle_path)) and oracle_auc(rep) > 0.7


def test_same_config_same_bytes(generated, tmp_path):
    cfg, rep, *_ = generated
    again = generate_multihot_parquet(cfg, tmp_path / "again.parquet")
    assert pq.read_table(again.path).equals(pq.read_table(rep.path))


def test_regroup_is_a_transpose_of_jagged_segments():
    lengths = np.array([[2, 0, 1], [1, 3, 0]])
    values = np.array([10, 11, 12, 20, 21, 22, 23])  # (0,0) (0,2) (1,0) (1,1)
    assert regroup(lengths, values).tolist() == [10, 11, 20, 21, 22, 23, 12]


def _bad_file(path):
    bags = [[1, 2], [3], None, [5] * 9, [-4, 1], [7, None], [8]]
    n = len(bags)
    cols = [pa.array([0, 1] * (n // 2) + [0] * (n % 2), pa.int8())]
    cols += [pa.array([1] * n, pa.int64()) for _ in range(13)]
    cols += [pa.array(bags, pa.list_(pa.int64()))]
    cols += [pa.array([[1]] * n, pa.list_(pa.int64())) for _ in range(25)]
    pq.write_table(pa.Table.from_arrays(cols, schema=raw_schema()), path)
    return n


def test_bad_bags_are_rejected_with_row_number_and_reason(tmp_path):
    n = _bad_file(tmp_path / "bad.parquet")
    cfg = PreprocessConfig(max_bag_size=8, max_reject_fraction=0.5, table_sizes=(100,) * 26)
    rep = preprocess_multihot([tmp_path / "bad.parquet"], tmp_path / "out", cfg)
    assert rep.rows_written + rep.rows_rejected == n and rep.rows_rejected == 3
    lines = (tmp_path / "out" / "rejects.tsv").read_text().splitlines()[1:]
    got = [(int(line.split("\t")[1]), line.split("\t")[2]) for line in lines]
    assert [r for r, _ in got] == [4, 5, 6]
    assert got[0][1] == "list too long: C1 holds 9 ids, more than max_len=8 (truncate: reject)"
    assert got[1][1] == "negative id: C1=-4"
    assert got[2][1] == "null in list: C1 holds a null id"
    assert rep.rejects_by_reason == {"list too long": 1, "negative id": 1, "null in list": 1}
    with pytest.raises(RejectedRowsError, match="max_reject_fraction"):
        preprocess_multihot([tmp_path / "bad.parquet"], tmp_path / "strict",
                            PreprocessConfig(max_bag_size=8, table_sizes=(100,) * 26))


def test_users_parquet_source_goes_through_the_multi_hot_path(tmp_path):
    from recscale.data.source import DataConfig, prepare_raw

    _bad_file(tmp_path / "mine.parquet")
    raw = prepare_raw(DataConfig(source="parquet", files=(str(tmp_path / "m*.parquet"),)))
    assert raw == {"source": "parquet", "files": [str(tmp_path / "mine.parquet")], "multi_hot": True}
    with pytest.raises(ConfigError, match=r"data\.files is empty: source 'parquet'"):
        DataConfig(source="parquet")
    pq.write_table(pa.table({"label": [1]}), tmp_path / "other.parquet")
    with pytest.raises(ConfigError, match=r"other.parquet: column 'I1' \(features.dense\[0\] "
                       r"\(I1\)\) is missing"):
        preprocess_multihot([tmp_path / "other.parquet"], tmp_path / "o", PreprocessConfig())


def test_vocab_ids_look_up_the_train_splits_vocabulary_and_unseen_ids_get_row_0(generated,
                                                                                 tmp_path):
    """preprocess.ids: vocab on multi-hot bags: every id of a bag becomes its index in its
    feature's vocabulary, counted over the train split's bags only (min_count 2: rarer ids, and
    ids the train rows never hold, look up row 0), each table as many rows as its vocabulary."""
    cfg, rep, *_ = generated
    pcfg = PreprocessConfig(row_group_size=700, splits=(0.8, 0.1, 0.1), ids="vocab",
                            vocab=VocabConfig(min_count=2))
    pre = preprocess_multihot([rep.path], tmp_path / "out", pcfg, rep.cardinalities)
    manifest = load_manifest(tmp_path / "out")
    assert pre.rows_written == cfg.num_rows and manifest["ids"] == "vocab"
    raw = pq.read_table(rep.path)
    n_train = manifest["splits"]["train"]["rows"]
    vocab = pq.read_table(manifest["vocabulary_path"]).to_pandas()
    have = [[] for _ in SPARSE_NAMES]
    for split in ("train", "validation", "test"):
        for b in make_loader(manifest["splits"][split]["files"], LoaderConfig(batch_size=512)):
            per = b.sparse.lengths.numpy().sum(axis=1)
            for j, part in enumerate(np.split(b.sparse.values.numpy(), np.cumsum(per)[:-1])):
                have[j].append(part)
    for j, c in enumerate(SPARSE_NAMES):
        v = vocab[vocab.feature == c]
        ids, counts = np.unique(pc.list_flatten(raw.column(c).slice(0, n_train)).to_numpy(),
                                return_counts=True)
        assert dict(zip(v.id.tolist(), v["count"].tolist())) == \
            dict(zip(ids[counts >= 2].tolist(), counts[counts >= 2].tolist())), c
        assert sorted(v["index"]) == list(range(1, len(v) + 1))
        assert manifest["table_sizes"][j] == len(v) + 1
        index = dict(zip(v.id.tolist(), v["index"].tolist()))
        want = np.asarray([index.get(i, 0) for i in
                           pc.list_flatten(raw.column(c)).to_numpy().tolist()], np.int64)
        assert np.array_equal(np.concatenate(have[j]), want), c
    rare = vocab.groupby("feature").size()
    assert (rare < np.asarray(rep.cardinalities)[[SPARSE_NAMES.index(f) for f in rare.index]]).any()
