"""Vocabularies: counts, thresholds, order, the OOV row, append-only growth, and files that do not
fit the data (no Spark here: the Spark engine builds its vocabulary with the same code, and
tests/unit/test_spark_preprocess.py checks that both engines write the same file)."""

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from recscale.config import ConfigError
from recscale.data.criteo import NUM_SPARSE, SPARSE_NAMES, read_criteo_tsv
from recscale.data.preprocess import PreprocessConfig, load_manifest, preprocess_criteo
from recscale.data.vocab import (
    OOV_INDEX,
    IdCounter,
    VocabConfig,
    VocabularyMismatch,
    build_vocabulary,
    load_vocabulary,
    vocab_schema,
    vocabulary_table,
)


def _counter(columns):
    """columns: per feature, a list of raw ids (None = missing)."""
    n = max(len(c) for c in columns)
    sparse = np.zeros((n, len(columns)), np.uint32)
    present = np.zeros((n, len(columns)), bool)
    for j, col in enumerate(columns):
        for i, v in enumerate(col):
            if v is not None:
                sparse[i, j], present[i, j] = v, True
    c = IdCounter(len(columns))
    c.add(sparse[: n // 2], present[: n // 2])  # in two chunks: counts must merge
    c.add(sparse[n // 2:], present[n // 2:])
    return c


def test_thresholds_order_and_the_oov_row():
    col = [5] * 4 + [9] * 4 + [7] * 3 + [3] * 1 + [None] * 2 + [11] * 2
    c = _counter([col])
    v = build_vocabulary(c, VocabConfig(min_count=2), None, features=("C1",))
    assert v.ids[0].tolist() == [5, 9, 7, 11]  # most frequent first, ties by smaller id
    assert v.counts[0].tolist() == [4, 4, 3, 2]
    assert v.table_sizes == (5,)  # 4 ids + the OOV row
    assert v.lookup(0, np.array([5, 9, 7, 11, 3, 12345])).tolist() == [1, 2, 3, 4, OOV_INDEX, OOV_INDEX]
    capped = build_vocabulary(c, VocabConfig(min_count=1, max_size=2), None, features=("C1",))
    assert capped.ids[0].tolist() == [5, 9] and capped.table_sizes == (3,)


def test_append_only_growth_keeps_every_index():
    old = build_vocabulary(_counter([[1, 1, 2, 2, 2, 3]]), VocabConfig(min_count=2), None,
                           features=("C1",))
    assert old.ids[0].tolist() == [2, 1]
    new_day = _counter([[8, 8, 8, 1, 1, 9, 9, 4]])
    grown = build_vocabulary(new_day, VocabConfig(min_count=2, max_size=3), existing=old,
                             features=("C1",))
    assert grown.ids[0].tolist() == [2, 1, 8]  # old rows first, unchanged; 9 did not fit max_size
    assert grown.counts[0].tolist() == [3, 4, 3]  # old ids add the new counts
    again = build_vocabulary(new_day, VocabConfig(min_count=2), existing=grown, features=("C1",))
    assert again.ids[0].tolist() == [2, 1, 8, 9]


def test_vocab_mode_counts_the_training_rows_like_plain_python(synthetic_tsv, tmp_path):
    cfg, rep = synthetic_tsv
    pcfg = PreprocessConfig(ids="vocab", vocab=VocabConfig(min_count=3), row_group_size=8192)
    out = preprocess_criteo([rep.path], tmp_path / "out", pcfg)
    man = load_manifest(out.out_dir)
    n_train = man["splits"]["train"]["rows"]
    checked = (0, 2, 5, 25)
    counts = {j: Counter() for j in checked}
    seen = 0
    for block in read_criteo_tsv(rep.path):
        for j in checked:
            take = block.sparse_present[: max(0, n_train - seen), j]
            counts[j].update(block.sparse[: len(take), j][take].tolist())
        seen += len(block)
    vocab = load_vocabulary(out.vocabulary_path, SPARSE_NAMES)
    for j in checked:
        want = {k: n for k, n in counts[j].items() if n >= 3}
        assert dict(zip(vocab.ids[j].tolist(), vocab.counts[j].tolist())) == want
    assert man["table_sizes"] == [len(a) + 1 for a in vocab.ids] == list(out.table_sizes)
    # every written id is its vocabulary row; rare ids are the OOV row
    test = pq.read_table(man["splits"]["test"]["files"])
    block = next(read_criteo_tsv(rep.path))
    raw = {int(r): block.sparse[i, 2] for i, r in enumerate(block.line - 1)}
    rows = test.column("row").to_numpy()[:200]
    got = test.column("C3").to_numpy(zero_copy_only=False)[:200]
    for r, g in zip(rows, got):
        if r in raw and not np.isnan(g):
            assert int(g) == vocab.lookup(2, np.array([raw[r]]))[0]
            assert (int(g) == OOV_INDEX) == (counts[2][int(raw[r])] < 3)


def test_the_vocabulary_artifact_is_the_vocabulary_and_empty_when_ids_are_hashed(synthetic_tsv,
                                                                               tmp_path):
    cfg, rep = synthetic_tsv
    pcfg = PreprocessConfig(ids="vocab", vocab=VocabConfig(min_count=2), row_group_size=8192)
    out = preprocess_criteo([rep.path], tmp_path / "out", pcfg)
    table = vocabulary_table(out.vocabulary_path)  # what the preprocess node logs to MLflow
    vocab = load_vocabulary(out.vocabulary_path, SPARSE_NAMES)
    assert table.num_rows == sum(len(a) for a in vocab.ids) > 0
    assert table.schema.equals(vocab_schema())
    c1 = table.filter(pc.equal(table.column("feature"), "C1"))
    assert c1.column("id").to_pylist() == vocab.ids[0].tolist()
    assert c1.column("index").to_pylist() == list(range(1, len(vocab.ids[0]) + 1))
    assert c1.column("count").to_pylist() == vocab.counts[0].tolist()
    empty = vocabulary_table(None)  # ids: hash
    assert empty.num_rows == 0 and empty.schema.equals(vocab_schema())


def test_a_vocabulary_that_does_not_fit_the_data_is_refused_naming_it(synthetic_tsv, tmp_path):
    _, rep = synthetic_tsv
    bad = tmp_path / "bad_vocab.parquet"
    pq.write_table(pa.table({"feature": ["C1", "C27"], "id": [1, 2], "index": [1, 1],
                             "count": [5, 5]}), bad)
    cfg = PreprocessConfig(ids="vocab", vocab=VocabConfig(path=str(bad)))
    with pytest.raises(VocabularyMismatch, match=r"feature\(s\) C27 that the data does not have"):
        preprocess_criteo([rep.path], tmp_path / "out", cfg)
    no_count = tmp_path / "no_count.parquet"
    pq.write_table(pa.table({"feature": ["C1"], "id": [1], "index": [1]}), no_count)
    with pytest.raises(VocabularyMismatch, match=r"missing column\(s\) count"):
        load_vocabulary(no_count, SPARSE_NAMES)
    with pytest.raises(ConfigError, match="preprocess.table_sizes.*cannot be used with "
                                          "preprocess.ids='vocab'"):
        PreprocessConfig(ids="vocab", table_sizes=(10,) * NUM_SPARSE)
