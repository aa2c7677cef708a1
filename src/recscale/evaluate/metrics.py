"""Click-prediction metrics: AUC, log loss, normalized entropy, calibration, accuracy.

Pure numpy (fp64), so they serve as the reference the training loop and tests compare against.
"""

from __future__ import annotations

import numpy as np

_EPS = 1e-12


def auc_score(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve, exact, with tied scores counted as half (Mann-Whitney U)."""
    y = np.asarray(labels).astype(bool).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.shape} vs {s.shape}")
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    s_sorted = s[order]
    # average rank (1-based) of each run of tied scores
    boundaries = np.flatnonzero(np.diff(s_sorted)) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [s.size]))
    avg_rank = (starts + ends + 1) / 2.0
    ranks = np.repeat(avg_rank, ends - starts)
    pos_rank_sum = ranks[y[order]].sum()
    return float((pos_rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def oracle_auc(report) -> float:
    """The AUC of a generated file's true probabilities on its drawn labels (a generator's
    report, or a raw manifest: anything with ``labels_path`` and ``oracle_path``, as attributes
    or keys): the ceiling no model of those rows can expect to pass."""
    get = report.get if isinstance(report, dict) else lambda k: getattr(report, k)
    return auc_score(np.load(get("labels_path")), np.load(get("oracle_path"), mmap_mode="r"))


def log_loss(labels: np.ndarray, probs: np.ndarray) -> float:
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), _EPS, 1 - _EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def binary_entropy(p: float) -> float:
    p = min(max(p, _EPS), 1 - _EPS)
    return float(-(p * np.log(p) + (1 - p) * np.log(1 - p)))


def binary_metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """All click metrics on one evaluation set.

    normalized_entropy = log loss / entropy of the set's own click rate (below 1 means the model
    beats always predicting the average CTR); calibration = mean predicted CTR / observed CTR.
    """
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.asarray(probs, dtype=np.float64).ravel()
    ctr = float(y.mean()) if y.size else float("nan")
    ll = log_loss(y, p)
    return {
        "auc": auc_score(y, p),
        "log_loss": ll,
        "normalized_entropy": ll / binary_entropy(ctr),
        "calibration": float(p.mean() / ctr) if ctr > 0 else float("nan"),
        "accuracy": float(((p >= 0.5) == (y >= 0.5)).mean()),
        "ctr": ctr,
        "count": float(y.size),
    }


def metrics_with_oracle(labels: np.ndarray, probs: np.ndarray, rows: np.ndarray,
                        oracle: np.ndarray | None = None) -> dict[str, float]:
    """binary_metrics, plus the oracle AUC and log loss of the same rows when the true
    probabilities are known (``oracle[rows]``: the generator's click probability of each row)."""
    m = binary_metrics(labels, probs)
    if oracle is not None and np.asarray(labels).size:
        truth = np.asarray(oracle)[rows]
        m["oracle_auc"] = auc_score(labels, truth)
        m["auc_gap_to_oracle"] = m["oracle_auc"] - m["auc"]
        m["oracle_log_loss"] = log_loss(labels, truth)
    return m
