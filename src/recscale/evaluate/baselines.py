"""Cheap baselines a model has to beat, fitted on the train split the model trains on and scored
on the rows the model is scored on. One file (over 500 lines): both baselines share the feature
layout, the batch sources, the validation choice and the lift, and each is a few dozen lines of
its own.

- ``logreg``: a logistic regression on the dense features (as preprocessed), one weight per row
  of every embedding table (so features that share a table share weights, and a bag adds its
  ids' weights, averaged for ``mean`` features, times the id weights of weighted features) and a
  bias. Fitted by FTRL-Proximal (McMahan et al., 2013: per-coordinate adaptive steps, the L2 term
  in closed form on each touched row), streaming over the train split batch by batch, for every
  L2 strength of a small grid at once (one column of state per strength). The strength kept is
  the one with the lowest log loss on the validation split, or, when that split has no rows, the
  lowest progressive log loss on the train split (each batch scored before it is learned).
- ``rate``: the best single feature's smoothed click rate. For every sparse feature and id, the
  train split's shows and clicks; an id's score is ``(clicks + a * prior) / (shows + a)`` with
  ``prior`` the train click rate (a bag: the mean over its ids; an empty bag: the rate of the
  feature's empty bags). The feature and the smoothing ``a`` (a small grid) kept are those with
  the lowest log loss on the validation split, or, when it has no rows, the lowest leave-one-out
  log loss on the train split (each train row scored by counts without itself).

Both read batches through a ``source``: a callable that returns an iterable of batches (what
``recscale.data.loader.make_loader`` yields: ``dense``, ``labels``, ``row_ids`` and ``sparse``
with ``keys``, ``values``, ``lengths`` [T, B] and optional ``weights``), so memory is one batch
plus the state per table row, whatever the split's size. There is no randomness: the same data
in the same order gives bitwise the same numbers.

"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recscale.config import Validated, check, check_choice
from recscale.evaluate.metrics import auc_score, log_loss

BASELINES = ("logreg", "rate")
_EPS = 1e-12

Source = Callable[[], Iterable[Any]]


@dataclass(frozen=True)
class FeatureLayout:
    """What the baselines know of a dataset's features: the sparse features in the batches' key
    order, each one's table (an index into ``table_rows``) and pooling, and the dense count."""

    keys: tuple[str, ...]
    feature_tables: tuple[int, ...]
    table_rows: tuple[int, ...]
    pooling: tuple[str, ...]
    num_dense: int

    def __post_init__(self) -> None:
        if not (len(self.keys) == len(self.feature_tables) == len(self.pooling)):
            raise ValueError(f"{len(self.keys)} features, {len(self.feature_tables)} tables and "
                             f"{len(self.pooling)} poolings: expected one of each per feature")


@dataclass(frozen=True)
class BaselineConfig(Validated):
    """Settings of the baselines (the library's defaults serve every run)."""

    # L2 strengths of the logistic regression tried at once (in units of the whole train loss)
    l2_grid: tuple[float, ...] = (1.0, 10.0, 100.0)
    alpha: float = 0.2  # FTRL learning rate
    beta: float = 1.0  # FTRL: added to each coordinate's root sum of squared gradients
    update_rows: int = 4096  # rows per FTRL update (a larger batch read is cut into these)
    min_updates: int = 300  # passes over the train split until this many updates were made ...
    max_epochs: int = 20  # ... but at most this many passes
    smoothing_grid: tuple[float, ...] = (1.0, 10.0, 100.0)  # ``a`` of the click rate

    def validate(self, prefix: str = "baselines") -> None:
        check(len(self.l2_grid) >= 1 and all(v >= 0 for v in self.l2_grid), f"{prefix}.l2_grid",
              self.l2_grid, "at least one non-negative number")
        check(self.alpha > 0, f"{prefix}.alpha", self.alpha, "a positive number")
        check(self.beta >= 0, f"{prefix}.beta", self.beta, "a non-negative number")
        check(self.min_updates >= 1, f"{prefix}.min_updates", self.min_updates,
              "a positive integer")
        check(self.max_epochs >= 1, f"{prefix}.max_epochs", self.max_epochs, "a positive integer")
        check(self.update_rows >= 1, f"{prefix}.update_rows", self.update_rows,
              "a positive integer")
        check(len(self.smoothing_grid) >= 1 and all(v > 0 for v in self.smoothing_grid),
              f"{prefix}.smoothing_grid", self.smoothing_grid, "at least one positive number")


def check_names(names: Sequence[str], key: str = "evaluate.baselines") -> None:
    """Each name a known baseline, each at most once."""
    for i, n in enumerate(names):
        check_choice(f"{key}[{i}]", n, BASELINES)
    check(len(set(names)) == len(names), key, list(names), "each baseline at most once")


def _np(x) -> np.ndarray:
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


@dataclass
class _Flat:
    """One batch as flat numpy arrays: every id with its feature, its row in the batch and its
    weight in the bag's pooled value."""

    labels: np.ndarray  # float64 [B]
    dense: np.ndarray  # float64 [B, D]
    rows: np.ndarray  # int64 [B]
    values: np.ndarray  # int64 [V]
    feature: np.ndarray  # int64 [V]
    sample: np.ndarray  # int64 [V]
    pool: np.ndarray | None  # float64 [V]: 1 / bag length for mean features, times the id
    # weight; None: every id counts once (sum pooling, no weights)
    lengths: np.ndarray  # int64 [T, B]

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    def slice(self, a: int, b: int) -> _Flat:
        keep = (self.sample >= a) & (self.sample < b)
        return _Flat(self.labels[a:b], self.dense[a:b], self.rows[a:b], self.values[keep],
                     self.feature[keep], self.sample[keep] - a,
                     None if self.pool is None else self.pool[keep],
                     self.lengths[:, a:b])


def _flatten(batch, layout: FeatureLayout) -> _Flat:
    sp = batch.sparse
    if tuple(sp.keys) != tuple(layout.keys):
        raise ValueError(f"the batch's sparse features {list(sp.keys)} are not the layout's "
                         f"{list(layout.keys)}")
    lengths = _np(sp.lengths).astype(np.int64, copy=False)
    t, b = lengths.shape
    values = _np(sp.values).astype(np.int64, copy=False)
    flat_len = lengths.reshape(-1)
    bag = np.repeat(np.arange(t * b, dtype=np.int64), flat_len)  # t * B + b of every id
    feature = bag // max(b, 1)
    sample = bag - feature * b
    mean = np.asarray([p == "mean" for p in layout.pooling], dtype=bool)
    pool = None
    if mean.any():
        pool = np.where(mean[feature], 1.0 / np.maximum(flat_len[bag], 1), 1.0)
    if getattr(sp, "weights", None) is not None:
        weights = _np(sp.weights).astype(np.float64)
        pool = weights if pool is None else pool * weights
    dense = _np(batch.dense).astype(np.float64).reshape(b, layout.num_dense)
    return _Flat(_np(batch.labels).astype(np.float64), dense, _np(batch.row_ids).astype(np.int64),
                 values, feature, sample, pool, lengths)


def _pooled(x: np.ndarray, pool: np.ndarray | None) -> np.ndarray:
    return x if pool is None else x * pool


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _loss_sums(y: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Summed log loss of probabilities ``p`` [B, K] against labels ``y`` [B] -> [K]."""
    p = np.clip(p, _EPS, 1 - _EPS)
    return -(y[:, None] * np.log(p) + (1 - y[:, None]) * np.log1p(-p)).sum(axis=0)


def _unique(idx: np.ndarray, scratch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values of ``idx``, each element's index among them) without sorting: one
    scatter into ``scratch`` (an int64 array as long as the largest value + 1). Which duplicate
    the scatter keeps does not matter: all copies read the same representative back."""
    pos = np.arange(idx.size, dtype=np.int64)
    scratch[idx] = pos
    first = np.take(scratch, idx)  # np.take: several times faster than indexing here
    rep = first == pos
    compact = np.cumsum(rep) - 1
    return idx[rep], np.take(compact, first)


class _LogReg:
    """FTRL-Proximal logistic regressions, one per L2 strength, trained side by side (arrays
    are [strength, ...], so each strength's values are contiguous)."""

    def __init__(self, layout: FeatureLayout, cfg: BaselineConfig):
        self.cfg = cfg
        self.l2 = np.asarray(cfg.l2_grid, dtype=np.float64)[:, None]
        g = self.l2.shape[0]
        self.row_offset = np.concatenate([[0], np.cumsum(layout.table_rows)])[
            np.asarray(layout.feature_tables, dtype=np.int64)].astype(np.int64)
        total = int(sum(layout.table_rows))
        # per sparse row and strength: FTRL's z and n (float32: the state of every table row;
        # a row's strengths side by side, so a batch's rows are gathered a cache line each)
        self.z = np.zeros((total, g), np.float32)
        self.n = np.zeros((total, g), np.float32)
        # per strength: the dense weights' and the bias's (the last coordinate) z and n, no L2
        self.zd = np.zeros((g, layout.num_dense + 1))
        self.nd = np.zeros((g, layout.num_dense + 1))
        self.scratch = np.zeros(max(total, 1), np.int64)
        self.progressive = np.zeros(g)
        self.progressive_rows = 0
        # the dense features are standardized by the mean and deviation of the rows seen so far
        # in the first pass (then fixed)
        self.moments = np.zeros((3, layout.num_dense))  # rows, sum, sum of squares
        self.frozen = False

    def _standardize(self, dense: np.ndarray, learn: bool = False) -> np.ndarray:
        if learn and not self.frozen:
            self.moments += [np.full(dense.shape[1], dense.shape[0]), dense.sum(axis=0),
                             (dense * dense).sum(axis=0)]
        mean, scale = self.dense_scale()
        return (dense - mean) * scale

    def dense_scale(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, 1 / standard deviation) of each dense feature (1 where it is constant)."""
        rows, total, squares = self.moments
        mean = total / np.maximum(rows, 1)
        var = squares / np.maximum(rows, 1) - mean * mean
        return mean, np.where(var > 1e-12, 1.0 / np.sqrt(np.maximum(var, 1e-12)), 1.0)

    def _w(self, z, n, l2):
        return -z / ((self.cfg.beta + np.sqrt(n)) / self.cfg.alpha + l2)

    def _rows(self, f: _Flat):
        """(distinct table rows of the batch, each id's index among them, their z and n)."""
        rows, inv = _unique(f.values + np.take(self.row_offset, f.feature), self.scratch)
        return (rows, inv, np.take(self.z, rows, axis=0).T.astype(np.float64),
                np.take(self.n, rows, axis=0).T.astype(np.float64))

    def _logits(self, f: _Flat, dense: np.ndarray, inv: np.ndarray, w_rows: np.ndarray,
                w_dense: np.ndarray) -> np.ndarray:
        """[G, B] logits (``dense``: the batch's dense features standardized)."""
        out = w_dense[:, :-1] @ dense.T + w_dense[:, -1:]
        contrib = _pooled(np.take(w_rows, inv, axis=1), f.pool)
        for k in range(out.shape[0]):
            out[k] += np.bincount(f.sample, weights=contrib[k], minlength=f.size)
        return out

    def learn(self, f: _Flat, track: bool) -> None:
        rows, inv, z, n = self._rows(f)
        w = self._w(z, n, self.l2)
        wd = self._w(self.zd, self.nd, 0.0)
        dense = self._standardize(f.dense, learn=True)
        p = _sigmoid(self._logits(f, dense, inv, w, wd))
        if track:
            self.progressive += _loss_sums(f.labels, p.T)
            self.progressive_rows += f.size
        r = p - f.labels  # d loss / d logit, [G, B]
        contrib = _pooled(np.take(r, f.sample, axis=1), f.pool)
        grad = np.empty_like(w)
        for k in range(grad.shape[0]):
            grad[k] = np.bincount(inv, weights=contrib[k], minlength=rows.size)
        z, n = self._step(z, n, w, grad)
        self.z[rows], self.n[rows] = z.T, n.T
        gd = np.concatenate([r @ dense, r.sum(axis=1, keepdims=True)], axis=1)
        self.zd, self.nd = self._step(self.zd, self.nd, wd, gd)

    def _step(self, z, n, w, g):
        n_new = n + g * g
        sigma = (np.sqrt(n_new) - np.sqrt(n)) / self.cfg.alpha
        return z + g - sigma * w, n_new

    def weights(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(sparse row weights, dense weights + bias) of grid member ``k``, the dense weights
        on the features as they come (the standardization folded in)."""
        w = self._w(self.z[:, k].astype(np.float64), self.n[:, k].astype(np.float64),
                    self.l2[k, 0])
        wd = self._w(self.zd[k], self.nd[k], 0.0)
        mean, scale = self.dense_scale()
        folded = wd[:-1] * scale
        return w.astype(np.float32), np.concatenate([folded, [wd[-1] - folded @ mean]])

    def scores(self, f: _Flat) -> np.ndarray:
        """[B, G] probabilities of every grid member."""
        _, inv, z, n = self._rows(f)
        return _sigmoid(self._logits(f, self._standardize(f.dense), inv, self._w(z, n, self.l2),
                                     self._w(self.zd, self.nd, 0.0))).T


class _Counts:
    """Shows and clicks per feature and id (plus one slot per feature for its empty bags)."""

    def __init__(self, layout: FeatureLayout):
        sizes = np.asarray([layout.table_rows[t] + 1 for t in layout.feature_tables], np.int64)
        self.empty_slot = np.cumsum(sizes) - 1  # per feature: its empty-bag slot
        self.offset = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.shows = np.zeros(int(sizes.sum()), np.float64)
        self.clicks = np.zeros(int(sizes.sum()), np.float64)
        # slots and labels of the batches not counted yet: counted together once they hold as
        # many entries as there are slots, so counting costs O(entries) in all
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0
        self.rows = 0
        self.positives = 0.0

    def slots(self, f: _Flat) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slot of every id and of every empty bag, its bag (t * B + b), the labels' row)."""
        t, b = f.lengths.shape
        ids = np.take(self.offset, f.feature) + f.values
        bag = f.feature * b + f.sample
        et, eb = np.nonzero(f.lengths == 0)
        return (np.concatenate([ids, self.empty_slot[et]]), np.concatenate([bag, et * b + eb]),
                np.concatenate([f.sample, eb]))

    def add(self, f: _Flat) -> None:
        slot, _, row = self.slots(f)
        self._pending.append((slot, np.take(f.labels, row)))
        self._pending_size += slot.size
        if self._pending_size >= self.shows.size:
            self.flush()
        self.rows += f.size
        self.positives += float(f.labels.sum())

    def flush(self) -> None:
        """Count the pending slots (call before reading ``shows`` and ``clicks``)."""
        if not self._pending:
            return
        slot = np.concatenate([p[0] for p in self._pending])
        label = np.concatenate([p[1] for p in self._pending])
        self._pending, self._pending_size = [], 0
        self.shows += np.bincount(slot, minlength=self.shows.size)
        self.clicks += np.bincount(slot, weights=label, minlength=self.shows.size)

    @property
    def prior(self) -> float:
        return min(max(self.positives / max(self.rows, 1), _EPS), 1 - _EPS)

    def rates(self, a: float) -> np.ndarray:
        self.flush()
        return (self.clicks + a * self.prior) / (self.shows + a)

    def feature_scores(self, f: _Flat, rates: np.ndarray) -> np.ndarray:
        """[T, B]: each feature's score of each row (the mean rate of its bag's ids)."""
        t, b = f.lengths.shape
        slot, bag, _ = self.slots(f)
        total = np.bincount(bag, weights=np.take(rates, slot), minlength=t * b).reshape(t, b)
        return total / np.maximum(f.lengths, 1)

    def leave_one_out(self, a: float, num_features: int) -> np.ndarray:
        """Per feature: the train log loss of every id occurrence scored by the counts without
        itself (summed; bags count each id, empty bags their slot)."""
        self.flush()
        prior = self.prior
        s, c = self.shows, self.clicks
        live = s > 0
        rest = np.where(live, s - 1 + a, 1.0)  # shows without the occurrence scored
        p_click = np.clip((c - 1 + a * prior) / rest, _EPS, 1 - _EPS)
        p_skip = np.clip((c + a * prior) / rest, _EPS, 1 - _EPS)
        per_slot = np.where(live, -(c * np.log(p_click) + (s - c) * np.log1p(-p_skip)), 0.0)
        bounds = np.concatenate([self.offset, [s.size]])
        return np.add.reduceat(per_slot, bounds[:-1])[:num_features]


@dataclass
class FittedBaselines:
    """The fitted baselines, ready to score any split of the same dataset."""

    layout: FeatureLayout
    names: tuple[str, ...]
    logreg: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (row offsets, rows, dense)
    rate: tuple[int, np.ndarray, int] | None = None  # (feature, rate per id, empty-bag slot)
    info: dict[str, Any] = field(default_factory=dict)  # what was chosen, and on which rows

    def scores(self, f: _Flat) -> dict[str, np.ndarray]:
        out = {}
        if self.logreg is not None:
            offset, w, wd = self.logreg
            idx = f.values + offset[f.feature]
            logit = f.dense @ wd[:-1] + wd[-1] + np.bincount(
                f.sample, weights=_pooled(np.take(w, idx).astype(np.float64), f.pool),
                minlength=f.size)
            out["logreg"] = _sigmoid(logit)
        if self.rate is not None:
            t, rates, empty = self.rate
            mine = f.feature == t
            total = np.bincount(f.sample[mine], weights=rates[f.values[mine]],
                                minlength=f.size)
            n = f.lengths[t]
            out["rate"] = np.where(n > 0, total / np.maximum(n, 1), rates[empty])
        return {k: out[k] for k in self.names}


def _cut(f: _Flat, rows: int) -> Iterable[_Flat]:
    if f.size <= rows:
        yield f
        return
    for a in range(0, f.size, rows):
        yield f.slice(a, min(a + rows, f.size))


def fit_baselines(names: Sequence[str], layout: FeatureLayout, train: Source,
                  validation: Source | None = None,
                  cfg: BaselineConfig | None = None) -> FittedBaselines:
    """Fit the baselines ``names`` (of ``BASELINES``) on the batches of ``train``; choose their
    settings on ``validation`` (a source of no rows, or None: on the train split, see the module
    docstring). Reads ``train`` once (the click counts and the logistic regression), then again
    while the logistic regression has made fewer than ``cfg.min_updates`` updates (at most
    ``cfg.max_epochs`` passes in all), and ``validation`` once."""
    cfg = cfg or BaselineConfig()
    names = tuple(names)
    check_names(names, "names")
    out = FittedBaselines(layout, names)
    if not names:
        return out
    lr = _LogReg(layout, cfg) if "logreg" in names else None
    counts = _Counts(layout) if "rate" in names else None
    updates, epochs = 0, 0
    while epochs == 0 or (lr is not None and updates < cfg.min_updates
                          and epochs < cfg.max_epochs):
        for batch in train():
            f = _flatten(batch, layout)
            if counts is not None and epochs == 0:
                counts.add(f)
            if lr is not None:
                for part in _cut(f, cfg.update_rows):
                    lr.learn(part, track=epochs == 0)
                    updates += 1
        epochs += 1
        if lr is not None:
            lr.frozen = True
    rows = lr.progressive_rows if lr is not None else counts.rows
    if rows == 0:
        raise ValueError("the baselines' train split has no rows")
    grid = list(cfg.smoothing_grid)
    t_count = len(layout.keys)
    val_lr = np.zeros(len(cfg.l2_grid))
    val_rate = np.zeros((len(grid), t_count))
    val_rows = 0
    if validation is not None:
        rates = [counts.rates(a) for a in grid] if counts is not None else []
        for batch in validation():
            f = _flatten(batch, layout)
            val_rows += f.size
            if lr is not None:
                val_lr += _loss_sums(f.labels, lr.scores(f))
            for i, r in enumerate(rates):
                val_rate[i] += _loss_sums(f.labels, counts.feature_scores(f, r).T)
    where = "validation" if val_rows else "train"
    if lr is not None:
        losses = val_lr / val_rows if val_rows else lr.progressive / lr.progressive_rows
        k = int(np.argmin(losses))
        w, wd = lr.weights(k)
        out.logreg = (lr.row_offset, w, wd)
        out.info["logreg"] = {
            "l2": float(cfg.l2_grid[k]), "epochs": epochs, "updates": updates,
            "chosen_on": where if val_rows else "train (progressive, first pass)",
            "log_loss_by_l2": {f"{v:g}": float(x) for v, x in zip(cfg.l2_grid, losses)}}
        del lr
    if counts is not None and t_count:
        if val_rows:
            losses = val_rate / val_rows
        else:
            losses = np.stack([counts.leave_one_out(a, t_count) for a in grid]) / counts.rows
        i, t = (int(v) for v in np.unravel_index(int(np.argmin(losses)), losses.shape))
        rates = counts.rates(grid[i])
        lo, hi = int(counts.offset[t]), int(counts.empty_slot[t]) + 1
        out.rate = (t, rates[lo:hi].copy(), hi - lo - 1)
        out.info["rate"] = {
            "feature": layout.keys[t], "smoothing": float(grid[i]), "prior": counts.prior,
            "chosen_on": where if val_rows else "train (leave one out)",
            "log_loss": float(losses[i, t])}
    elif counts is not None:
        out.names = tuple(n for n in names if n != "rate")
        out.info["rate"] = {"skipped": "the dataset has no sparse features"}
    return out


@dataclass
class BaselineScores:
    """Every baseline's click probabilities on the rows of one split, in its order."""

    rows: np.ndarray
    labels: np.ndarray
    probs: dict[str, np.ndarray]


def score_baselines(fitted: FittedBaselines, source: Source) -> BaselineScores:
    """The fitted baselines' probabilities on every row ``source`` yields, in its order."""
    rows, labels, parts = [], [], {n: [] for n in fitted.names}
    for batch in source():
        f = _flatten(batch, fitted.layout)
        rows.append(f.rows)
        labels.append(f.labels)
        for name, p in fitted.scores(f).items():
            parts[name].append(p)

    def cat(xs, dtype):
        return np.concatenate(xs) if xs else np.zeros(0, dtype)

    return BaselineScores(cat(rows, np.int64), cat(labels, np.float64),
                          {n: cat(p, np.float64) for n, p in parts.items()})


def lift_metrics(labels: np.ndarray, model_probs: np.ndarray,
                 baselines: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Each baseline's AUC and log loss on the model's rows, and the model's lift over the best
    one: ``lift.auc`` = model AUC - the best baseline AUC, ``lift.logloss`` = the best (lowest)
    baseline log loss - the model's (positive: the model is better). Flat keys
    ``baseline.<name>.auc`` / ``.logloss``, ``lift.auc`` / ``lift.logloss``, and the names of the
    best baselines under ``best`` (empty when there are no baselines)."""
    out: dict[str, Any] = {"best": {}}
    if not baselines:
        return out
    auc = {n: auc_score(labels, p) for n, p in baselines.items()}
    ll = {n: log_loss(labels, p) for n, p in baselines.items()}
    for n in baselines:
        out[f"baseline.{n}.auc"] = auc[n]
        out[f"baseline.{n}.logloss"] = ll[n]
    finite = [n for n in auc if math.isfinite(auc[n])]
    if finite:
        best = max(finite, key=lambda n: auc[n])
        out["lift.auc"] = auc_score(labels, model_probs) - auc[best]
        out["best"]["auc"] = best
    best_ll = min(ll, key=lambda n: ll[n])
    out["lift.logloss"] = ll[best_ll] - log_loss(labels, model_probs)
    out["best"]["logloss"] = best_ll
    return out
