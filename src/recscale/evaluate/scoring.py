"""Scores of a model on one split of a preprocessed dataset (labels, probabilities, row ids)."""

from __future__ import annotations

import numpy as np

from recscale.data.loader import LoaderConfig, make_loader
from recscale.evaluate.metrics import auc_score, binary_metrics


def score_split(model, manifest: dict, split: str, batch_size: int):
    """-> (labels, click probabilities, row ids) of every row of ``split``, in row order."""
    from recscale.train.loop import predict

    if split not in manifest["splits"]:
        raise ValueError(f"split={split!r} is not allowed: expected one of "
                         f"{', '.join(manifest['splits'])}")
    labels, probs, rows = predict(model, make_loader(manifest["splits"][split]["files"],
                                                     LoaderConfig(batch_size=batch_size)))
    expected = manifest["splits"][split]["rows"]
    if labels.size != expected:
        raise RuntimeError(f"scored {labels.size} rows of {split} but it holds {expected}")
    return labels, probs, rows


def metrics_with_oracle(labels: np.ndarray, probs: np.ndarray, rows: np.ndarray,
                        oracle: np.ndarray | None = None) -> dict[str, float]:
    """binary_metrics, plus the oracle AUC of the same rows when the true probabilities are known."""
    m = binary_metrics(labels, probs)
    if oracle is not None and labels.size:
        m["oracle_auc"] = auc_score(labels, np.asarray(oracle)[rows])
        m["auc_gap_to_oracle"] = m["oracle_auc"] - m["auc"]
    return m
