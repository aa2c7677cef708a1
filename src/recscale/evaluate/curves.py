"""Curves behind the evaluation pictures: ROC points and calibration (reliability) bins."""

from __future__ import annotations

import numpy as np


def roc_curve(labels: np.ndarray, probs: np.ndarray, max_points: int = 512):
    """-> (false positive rate, true positive rate), from (0, 0) to (1, 1), at most about
    ``max_points`` points (ties share one point, so the area is the AUC with ties halved)."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.asarray(probs, dtype=np.float64).ravel()
    pos, neg = y.sum(), y.size - y.sum()
    if pos == 0 or neg == 0:
        raise ValueError(f"a ROC curve needs both classes: {int(pos)} positives, {int(neg)} negatives")
    order = np.argsort(-p, kind="mergesort")
    p, y = p[order], y[order]
    last = np.r_[np.nonzero(np.diff(p))[0], p.size - 1]  # last index of each distinct score
    tp = np.cumsum(y)[last]
    fp = (last + 1) - tp
    tpr, fpr = np.r_[0.0, tp / pos], np.r_[0.0, fp / neg]
    if fpr.size > max_points:
        keep = np.unique(np.r_[np.linspace(0, fpr.size - 1, max_points).astype(np.int64), fpr.size - 1])
        fpr, tpr = fpr[keep], tpr[keep]
    return fpr, tpr


def calibration_bins(labels: np.ndarray, probs: np.ndarray, bins: int = 10):
    """Rows split into ``bins`` equal-count bins by predicted probability ->
    (mean predicted, observed click rate, rows) per non-empty bin."""
    if bins < 1:
        raise ValueError(f"bins={bins} is not allowed: expected a positive integer")
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.asarray(probs, dtype=np.float64).ravel()
    order = np.argsort(p, kind="mergesort")
    parts = [idx for idx in np.array_split(order, bins) if idx.size]
    pred = np.array([p[i].mean() for i in parts])
    obs = np.array([y[i].mean() for i in parts])
    count = np.array([i.size for i in parts])
    return pred, obs, count
