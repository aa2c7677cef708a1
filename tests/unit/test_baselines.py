"""The cheap baselines (recscale.evaluate.baselines) on generated data whose answer is known: a
label drawn from one feature's click rate (the rate baseline finds that feature and matches the
oracle), a planted logistic model over ids, bags and dense features (the logistic regression
comes close to the oracle); determinism, streaming, the lift, the configs and the promotion
rule that can require beating them."""

import weakref

import numpy as np
import pytest
import torch

from recscale.config import ConfigError, parse
from recscale.data.batch import Batch, SparseFeatures
from recscale.evaluate import BASELINES, auc_score, log_loss
from recscale.evaluate.baselines import (
    BaselineConfig,
    FeatureLayout,
    fit_baselines,
    lift_metrics,
    score_baselines,
)
from recscale.evaluate.config import EvaluateConfig
from recscale.retrain import decide_promotion
from recscale.retrain.config import DLRMRetrainConfig


def _batch(rows, labels, dense, ids, bags=()):
    """A Batch of one-hot ``ids`` [n, T1] (negative = absent) followed by the multi-hot
    features ``bags`` (each a list of per-row id lists)."""
    keys = [f"c{t}" for t in range(ids.shape[1])] + [f"b{t}" for t in range(len(bags))]
    lengths = [(ids[:, t] >= 0).astype(np.int64) for t in range(ids.shape[1])]
    values = [ids[ids[:, t] >= 0, t] for t in range(ids.shape[1])]
    for bag in bags:
        lengths.append(np.asarray([len(x) for x in bag], np.int64))
        values.append(np.asarray([v for x in bag for v in x], np.int64))
    sparse = SparseFeatures(tuple(keys), torch.from_numpy(np.concatenate(values).astype(np.int64)),
                            torch.from_numpy(np.stack(lengths)))
    return Batch(torch.from_numpy(dense.astype(np.float32)), sparse,
                 torch.from_numpy(labels.astype(np.float32)), torch.from_numpy(rows))


class Data:
    """Rows held in numpy; ``source(a, b, size)`` streams rows [a, b) in batches of ``size``."""

    def __init__(self, labels, probs, dense, ids, bags=()):
        self.labels, self.probs, self.dense, self.ids, self.bags = labels, probs, dense, ids, bags

    def source(self, a, b, size):
        def gen():
            for s in range(a, b, size):
                e = min(s + size, b)
                yield _batch(np.arange(s, e), self.labels[s:e], self.dense[s:e], self.ids[s:e],
                             [bag[s:e] for bag in self.bags])
        return gen


def rate_data(n, seed=0):
    """Label ~ Bernoulli(rate of c0's id); c1 (30 ids) and c2 (20,000 ids, which a model fitted
    and judged on the same rows would prefer) carry no signal."""
    rng = np.random.default_rng(seed)
    rates = rng.uniform(0.02, 0.7, 40)
    ids = np.stack([rng.integers(0, 40, n), rng.integers(0, 30, n), rng.integers(0, 20_000, n)], 1)
    ids[rng.random(n) < 0.05, 1] = -1  # some rows lack c1
    probs = rates[ids[:, 0]]
    labels = (rng.random(n) < probs).astype(np.float64)
    return Data(labels, probs, rng.normal(size=(n, 2)), ids), \
        FeatureLayout(("c0", "c1", "c2"), (0, 1, 2), (40, 30, 20_000), ("sum",) * 3, 2)


def logistic_data(n, seed=1):
    """A planted logistic model: a bias, 3 dense weights, one weight per id of c0 (300 ids,
    Zipf-like) and c1 (20 ids), and the mean of the weights of a bag of 0-4 ids of b0, whose
    table c1 shares (feature b0 looks up table 1 too)."""
    rng = np.random.default_rng(seed)
    w0, w1 = rng.normal(0, 0.8, 300), rng.normal(0, 0.8, 20)
    wd = np.array([0.8, -0.5, 0.3])
    dense = rng.normal(size=(n, 3))
    p0 = 1 / np.arange(1, 301) ** 0.8
    ids = np.stack([rng.choice(300, n, p=p0 / p0.sum()), rng.integers(0, 20, n)], 1)
    bag = [list(rng.integers(0, 20, k)) for k in rng.integers(0, 5, n)]
    bag_mean = np.asarray([w1[x].mean() if x else 0.0 for x in bag])
    logit = -0.8 + dense @ wd + w0[ids[:, 0]] + w1[ids[:, 1]] + bag_mean
    probs = 1 / (1 + np.exp(-logit))
    labels = (rng.random(n) < probs).astype(np.float64)
    layout = FeatureLayout(("c0", "c1", "b0"), (0, 1, 1), (300, 20), ("sum", "sum", "mean"), 3)
    return Data(labels, probs, dense, ids, [bag]), layout


def _fit_score(data, layout, names, n_train, n_val, n_test, batch=1024, cfg=None):
    val = data.source(n_train, n_train + n_val, batch) if n_val else None
    fitted = fit_baselines(names, layout, data.source(0, n_train, batch), val, cfg)
    a, b = n_train + n_val, n_train + n_val + n_test
    return fitted, score_baselines(fitted, data.source(a, b, batch))


@pytest.mark.parametrize("n_val", [8000, 0])
def test_rate_finds_the_feature_and_matches_the_oracle(n_val):
    data, layout = rate_data(50_000 + n_val)
    fitted, s = _fit_score(data, layout, ["rate"], 30_000, n_val, 20_000)
    assert fitted.info["rate"]["feature"] == "c0"
    assert fitted.info["rate"]["chosen_on"] == ("validation" if n_val else "train (leave one out)")
    oracle = data.probs[s.rows]
    np.testing.assert_array_equal(s.labels, data.labels[s.rows])
    assert abs(auc_score(s.labels, s.probs["rate"]) - auc_score(s.labels, oracle)) < 0.005
    assert abs(log_loss(s.labels, s.probs["rate"]) - log_loss(s.labels, oracle)) < 0.005
    # the scores are the smoothed train rates of each row's c0 id
    a, prior = fitted.info["rate"]["smoothing"], fitted.info["rate"]["prior"]
    y, c0 = data.labels[:30_000], data.ids[:30_000, 0]
    shows, clicks = np.bincount(c0, minlength=40), np.bincount(c0, weights=y, minlength=40)
    want = ((clicks + a * prior) / (shows + a))[data.ids[s.rows, 0]]
    np.testing.assert_allclose(s.probs["rate"], want, rtol=1e-12)


def test_rate_scores_a_bag_by_its_ids_and_an_empty_one_by_its_own_rate():
    data, layout = rate_data(2000)
    layout1 = FeatureLayout(("c0",), (0,), (30,), ("sum",), 0)
    y = data.labels
    ids = data.ids[:, 1]

    def src():
        for s in range(0, 2000, 500):
            sl = slice(s, s + 500)
            yield _batch(np.arange(s, s + 500), y[sl], np.zeros((500, 0)),
                         ids[sl, None])
    cfg = BaselineConfig(smoothing_grid=(5.0,))
    fitted = fit_baselines(["rate"], layout1, src, None, cfg)
    prior = y.mean()
    empty = (y[ids < 0].sum() + 5 * prior) / ((ids < 0).sum() + 5)
    rate7 = (y[ids == 7].sum() + 5 * prior) / ((ids == 7).sum() + 5)
    rate9 = (y[ids == 9].sum() + 5 * prior) / ((ids == 9).sum() + 5)
    probe = lambda: iter([_batch(np.arange(3), np.zeros(3), np.zeros((3, 0)),  # noqa: E731
                                 np.array([[7], [-1], [9]]))])
    s = score_baselines(fitted, probe)
    np.testing.assert_allclose(s.probs["rate"], [rate7, empty, rate9], rtol=1e-12)
    # a bag of ids 7 and 9: the mean of their rates
    bag = lambda: iter([_batch(np.arange(1), np.zeros(1), np.zeros((1, 0)),  # noqa: E731
                               np.zeros((1, 0), np.int64), [[[7, 9]]])])
    layout_bag = FeatureLayout(("b0",), (0,), (30,), ("sum",), 0)
    fitted.layout = layout_bag
    np.testing.assert_allclose(score_baselines(fitted, bag).probs["rate"], [(rate7 + rate9) / 2],
                               rtol=1e-12)


def test_logreg_comes_close_to_the_planted_logistic_model():
    data, layout = logistic_data(90_000)
    fitted, s = _fit_score(data, layout, ["logreg", "rate"], 60_000, 10_000, 20_000)
    oracle = data.probs[s.rows]
    gap = auc_score(s.labels, oracle) - auc_score(s.labels, s.probs["logreg"])
    assert 0 <= gap < 0.01, gap
    assert log_loss(s.labels, s.probs["logreg"]) - log_loss(s.labels, oracle) < 0.01
    assert fitted.info["logreg"]["chosen_on"] == "validation"
    assert fitted.info["logreg"]["l2"] in BaselineConfig().l2_grid
    # the single best feature is well below a model of all of them
    assert auc_score(s.labels, s.probs["rate"]) < auc_score(s.labels, s.probs["logreg"]) - 0.03


def test_logreg_honours_pooling():
    """b0 is planted as the mean of its ids' weights: fitted as a sum, the model is worse."""
    data, layout = logistic_data(50_000)
    _, s = _fit_score(data, layout, ["logreg"], 40_000, 0, 10_000)
    summed = FeatureLayout(layout.keys, layout.feature_tables, layout.table_rows,
                           ("sum", "sum", "sum"), layout.num_dense)
    _, s_sum = _fit_score(data, summed, ["logreg"], 40_000, 0, 10_000)
    assert log_loss(s.labels, s.probs["logreg"]) < log_loss(s.labels, s_sum.probs["logreg"]) - 2e-3


def test_same_data_same_numbers():
    data, layout = logistic_data(20_000)
    one = _fit_score(data, layout, ["logreg", "rate"], 12_000, 4_000, 4_000)
    two = _fit_score(data, layout, ["logreg", "rate"], 12_000, 4_000, 4_000)
    assert one[0].info == two[0].info
    for name in ("logreg", "rate"):
        np.testing.assert_array_equal(one[1].probs[name], two[1].probs[name])


def test_it_streams_and_keeps_no_batch():
    """Batches are read one at a time and let go: no batch outlives the one after it (a batch
    holds no reference cycle, so it is freed as soon as nothing refers to it), and
    batches of 256 or 1,024 rows (cut into the same updates of 256) give the same numbers."""
    data, layout = logistic_data(12_000)
    cfg = BaselineConfig(update_rows=256, min_updates=1)
    live: list[weakref.ref] = []
    biggest = [0]

    def watched(size):
        inner = data.source(0, 8_000, size)

        def gen():
            for b in inner():
                assert all(r() is None for r in live[:-1]), "a batch was kept"
                live.append(weakref.ref(b))
                biggest[0] = max(biggest[0], b.batch_size)
                yield b
        return gen

    small = fit_baselines(["logreg", "rate"], layout, watched(256), None, cfg)
    assert len(live) == 32 and biggest[0] == 256
    large = fit_baselines(["logreg", "rate"], layout, data.source(0, 8_000, 1024), None, cfg)
    test = data.source(8_000, 12_000, 1000)
    a, b = score_baselines(small, test), score_baselines(large, test)
    for name in ("logreg", "rate"):
        np.testing.assert_array_equal(a.probs[name], b.probs[name])


def test_lift_is_model_minus_the_best_baseline():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.05, 0.9, 5000)
    y = (rng.random(5000) < p).astype(float)
    weak = np.clip(p + rng.normal(0, 0.3, 5000), 0.01, 0.99)
    weaker = np.clip(p + rng.normal(0, 0.6, 5000), 0.01, 0.99)
    m = lift_metrics(y, p, {"logreg": weak, "rate": weaker})
    assert m["best"] == {"auc": "logreg", "logloss": "logreg"}
    assert m["baseline.rate.auc"] == auc_score(y, weaker)
    assert m["lift.auc"] == auc_score(y, p) - auc_score(y, weak) > 0
    assert m["lift.logloss"] == log_loss(y, weak) - log_loss(y, p) > 0
    # a model worse than a baseline has a negative lift
    assert lift_metrics(y, weaker, {"logreg": weak})["lift.auc"] < 0
    assert lift_metrics(y, p, {}) == {"best": {}}


def test_configs_name_the_key():
    assert EvaluateConfig().baselines == BASELINES
    assert parse(EvaluateConfig, {"baselines": []}, "evaluate").baselines == ()
    with pytest.raises(ConfigError, match=r"evaluate\.baselines\[1\]='gbdt'"):
        parse(EvaluateConfig, {"baselines": ["rate", "gbdt"]}, "evaluate")
    with pytest.raises(ConfigError, match=r"evaluate\.baselines="):
        parse(EvaluateConfig, {"baselines": ["rate", "rate"]}, "evaluate")
    with pytest.raises(ConfigError, match=r"retrain\.promotion\.beat_baseline"):
        parse(DLRMRetrainConfig, {"retrain": {"promotion": {"beat_baseline": True}},
                                  "evaluate": {"baselines": []}}, "")
    cfg = parse(DLRMRetrainConfig, {"retrain": {"promotion": {"beat_baseline": True}}}, "")
    assert cfg.retrain.promotion.beat_baseline


def test_promotion_can_require_beating_the_baseline():
    below = decide_promotion(0.70, 0.65, 0.0, "rows X", baseline=("logreg", 0.72))
    assert not below.promote
    assert "logreg" in below.reason and "0.7000" in below.reason and "0.7200" in below.reason
    assert decide_promotion(0.70, 0.65, 0.0, "rows X").promote  # without the requirement
    assert decide_promotion(0.70, None, 0.0, "rows X").promote
    assert not decide_promotion(0.70, None, 0.0, "rows X", baseline=("rate", 0.71)).promote
    assert decide_promotion(0.73, 0.65, 0.0, "rows X", baseline=("logreg", 0.72)).promote
    # beating the baseline does not excuse losing to the champion
    assert not decide_promotion(0.73, 0.75, 0.0, "rows X", baseline=("logreg", 0.72)).promote


def test_an_untrained_challenger_is_refused_when_it_must_beat_the_baseline(tmp_path):
    """The retrain's comparison on a prepared night: an untrained challenger (AUC near 0.5)
    is refused with beat_baseline, naming the baseline and both AUCs, and promoted without."""
    from recscale.data.synthetic import generate_criteo_tsv
    from recscale.retrain import (
        WarmStart,
        compare_with_champion,
        find_partitions,
        prepare_partitions,
    )
    from recscale.runconfig import recipe_for
    from tests.conftest import small_synthetic_config

    generate_criteo_tsv(small_synthetic_config(num_rows=4000), tmp_path / "day_00.tsv")
    cfg = parse(DLRMRetrainConfig, {
        "preprocess": {"row_group_size": 500, "workers": 1},
        "retrain": {"work_dir": str(tmp_path / "work"), "model_dir": str(tmp_path / "models"),
                    "promotion": {"beat_baseline": True}}}, "")
    manifest = prepare_partitions(find_partitions(tmp_path, "day_*.tsv"), WarmStart("cold"), cfg)
    model = recipe_for(manifest, cfg.model, cfg.train).build()
    strict = compare_with_champion(model, manifest, 1024, 0.0, None, cfg.evaluate.baselines,
                                   beat_baseline=True)
    name, auc = strict.best_baseline
    assert name in BASELINES and auc > strict.challenger["auc"]
    assert not strict.decision.promote
    assert name in strict.decision.reason and f"{auc:.4f}" in strict.decision.reason
    assert f"{strict.challenger['auc']:.4f}" in strict.decision.reason
    assert strict.challenger[f"baseline.{name}.auc"] == auc
    assert strict.challenger["lift.auc"] == pytest.approx(strict.challenger["auc"] - auc)
    lenient = compare_with_champion(model, manifest, 1024, 0.0, None, cfg.evaluate.baselines)
    assert lenient.decision.promote and lenient.best_baseline == strict.best_baseline
