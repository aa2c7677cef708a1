import numpy as np
import pytest

from recscale.config import ConfigError, parse
from recscale.data.criteo import NUM_SPARSE, read_criteo_tsv
from recscale.data.synthetic import (
    BLOCK_ROWS,
    CRITEO_KAGGLE_CARDINALITIES,
    SyntheticConfig,
    generate_criteo_tsv,
    scaled_cardinalities,
)
from recscale.evaluate import auc_score, oracle_auc
from tests.conftest import small_synthetic_config


def _read_all(path):
    blocks = list(read_criteo_tsv(path))
    return (np.concatenate([b.label for b in blocks]),
            np.concatenate([b.sparse for b in blocks]),
            np.concatenate([b.sparse_present for b in blocks]),
            np.concatenate([b.dense for b in blocks]),
            np.concatenate([b.dense_present for b in blocks]))


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    cfg = small_synthetic_config()
    a = generate_criteo_tsv(cfg, tmp_path / "a.tsv")
    b = generate_criteo_tsv(cfg, tmp_path / "b.tsv")
    generate_criteo_tsv(small_synthetic_config(seed=4), tmp_path / "c.tsv")
    assert (tmp_path / "a.tsv").read_bytes() == (tmp_path / "b.tsv").read_bytes()
    assert np.array_equal(np.load(a.oracle_path), np.load(b.oracle_path))
    assert (tmp_path / "a.tsv").read_bytes() != (tmp_path / "c.tsv").read_bytes()
    assert np.array_equal(np.load(a.labels_path), np.load(b.labels_path))


def test_reuses_a_file_generated_from_the_same_config_only(tmp_path):
    cfg = small_synthetic_config(num_rows=500)
    path = tmp_path / "d.tsv"
    generate_criteo_tsv(cfg, path)
    mtime = path.stat().st_mtime_ns
    generate_criteo_tsv(cfg, path)
    assert path.stat().st_mtime_ns == mtime
    rep = generate_criteo_tsv(small_synthetic_config(num_rows=600), path)
    assert rep.num_rows == 600 and sum(1 for _ in open(path)) == 600


def test_oracle_auc_is_the_auc_of_the_true_probabilities_on_the_written_labels(synthetic_tsv):
    cfg, rep = synthetic_tsv
    labels, *_ = _read_all(rep.path)
    probs = np.load(rep.oracle_path)
    assert labels.shape == probs.shape == (cfg.num_rows,)
    assert np.array_equal(np.load(rep.labels_path), labels)  # the labels file is the TSV's
    assert oracle_auc(rep) == auc_score(labels, probs) and 0.7 < oracle_auc(rep) < 0.95
    # the probabilities are the ones the labels were drawn from: calibrated in every decile
    edges = np.quantile(probs, np.linspace(0, 1, 11))
    bins = np.clip(np.searchsorted(edges, probs, side="right") - 1, 0, 9)
    for k in range(10):
        sel = bins == k
        se = np.sqrt(probs[sel].mean() * (1 - probs[sel].mean()) / sel.sum())
        assert abs(labels[sel].mean() - probs[sel].mean()) < 5 * se + 1e-3
    assert labels.mean() == pytest.approx(cfg.base_ctr, abs=0.02)


def test_no_signal_gives_an_oracle_auc_of_one_half(tmp_path):
    rep = generate_criteo_tsv(small_synthetic_config(signal_strength=0.0, num_rows=3000),
                              tmp_path / "flat.tsv")
    assert oracle_auc(rep) == pytest.approx(0.5, abs=1e-9)


def test_ids_follow_the_cardinalities_and_a_power_law(synthetic_tsv):
    cfg, rep = synthetic_tsv
    _, sparse, present, dense, dense_present = _read_all(rep.path)
    cards = cfg.feature_cardinalities
    assert len(cards) == NUM_SPARSE
    for j in range(NUM_SPARSE):
        ids = sparse[present[:, j], j]
        uniq, counts = np.unique(ids, return_counts=True)
        assert len(uniq) <= cards[j]
        if cards[j] >= 100:  # Zipf: the most common id is far more common than the median one
            assert counts.max() > 20 * np.median(counts)
    # missing values exist where Criteo has them, and the counts are heavy-tailed
    assert (~present[:, 21]).mean() > 0.5 and present[:, 0].all()
    assert (~dense_present[:, 11]).mean() > 0.5
    assert (dense[:, 1] < 0).any()
    i5 = dense[dense_present[:, 4], 4]
    assert np.percentile(i5, 99) > 10 * np.median(i5)


def test_blocks_make_generation_independent_of_row_count():
    # the first block's rows do not depend on how many rows follow
    from recscale.data.synthetic import PlantedModel

    m = PlantedModel(small_synthetic_config(num_rows=BLOCK_ROWS + 5))
    a, pa = m.block(0, 100)
    b, pb = m.block(0, 100)
    assert np.array_equal(a.sparse, b.sparse) and np.array_equal(pa, pb)


def test_default_cardinalities_scale_the_large_kaggle_tables():
    cards = scaled_cardinalities(0.01, 1000)
    assert cards[2] == round(CRITEO_KAGGLE_CARDINALITIES[2] * 0.01)
    assert cards[8] == 3 and cards[5] == 24
    assert all(c <= max(1000, k) for c, k in zip(cards, CRITEO_KAGGLE_CARDINALITIES))


def test_bad_synthetic_parameters_name_the_key():
    with pytest.raises(ConfigError, match=r"data\.synthetic\.num_rows=0"):
        parse(SyntheticConfig, {"num_rows": 0}, "data.synthetic")
    with pytest.raises(ConfigError, match=r"data\.synthetic\.cardinalities"):
        parse(SyntheticConfig, {"cardinalities": [5, 6]}, "data.synthetic")
