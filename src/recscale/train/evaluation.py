"""The one evaluation path (nodes, retraining, tests and benchmarks): a model's click
probabilities on a split, every row accounted for, and its metrics."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from recscale.data.batch import Batch
from recscale.data.loader import LoaderConfig, make_loader
from recscale.evaluate.metrics import metrics_with_oracle
from recscale.model.dlrm import DLRM


@torch.no_grad()
def predict(model: DLRM, batches: Iterable[Batch], device: torch.device | None = None):
    """-> (labels, click probabilities, row ids) as numpy arrays, in batch order."""
    device = device or next(model.dense_parameters()).device
    model.eval()
    labels, probs, rows = [], [], []
    for batch in batches:
        b = batch.to(device)
        probs.append(torch.sigmoid(model(b.dense, b.sparse)).cpu().numpy())
        labels.append(batch.labels.numpy())
        rows.append(batch.row_ids.numpy())
    model.train()
    if not labels:
        return np.zeros(0), np.zeros(0), np.zeros(0, np.int64)
    return np.concatenate(labels), np.concatenate(probs).astype(np.float64), np.concatenate(rows)


@dataclass
class Scores:
    labels: np.ndarray
    probs: np.ndarray
    rows: np.ndarray  # global row numbers (index the generator's oracle probabilities)


def score_split(model: DLRM, manifest: dict, split: str, batch_size: int) -> Scores:
    """Scores of every row of ``split``, in row order; fails if a row is missing."""
    if split not in manifest["splits"]:
        raise ValueError(f"split={split!r} is not allowed: expected one of "
                         f"{', '.join(manifest['splits'])}")
    labels, probs, rows = predict(model, make_loader(manifest["splits"][split]["files"],
                                                     LoaderConfig(batch_size=batch_size)))
    expected = manifest["splits"][split]["rows"]
    if labels.size != expected:
        raise RuntimeError(f"scored {labels.size} rows of {split} but it holds {expected}")
    return Scores(labels, probs, rows)


def evaluate_dlrm(model: DLRM, manifest: dict, split: str, batch_size: int,
                  oracle_probs: np.ndarray | None = None) -> dict[str, float]:
    """Click metrics of ``model`` on one split; with the generator's true probabilities, also the
    oracle AUC of the same rows (the best any model can expect)."""
    s = score_split(model, manifest, split, batch_size)
    return metrics_with_oracle(s.labels, s.probs, s.rows, oracle_probs)
