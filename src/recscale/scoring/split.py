"""The one evaluation path (nodes, retraining, tests and benchmarks): a model's click
probabilities on a split, every row accounted for, and its metrics."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from recscale.data.loader import LoaderConfig, make_loader
from recscale.data.schema import FittedSchema
from recscale.evaluate.metrics import metrics_with_oracle
from recscale.model import DLRM


@dataclass
class Scores:
    labels: np.ndarray
    probs: np.ndarray  # click probabilities (fp64)
    rows: np.ndarray  # global row numbers (index the generator's oracle probabilities)


@torch.no_grad()
def score_split(model: DLRM, manifest: dict, split: str, batch_size: int) -> Scores:
    """Scores of every row of ``split``, in row order; fails if a row is missing."""
    if split not in manifest["splits"]:
        raise ValueError(f"split={split!r} is not allowed: expected one of "
                         f"{', '.join(manifest['splits'])}")
    device = next(model.dense_parameters()).device
    model.eval()
    parts = []
    rows = FittedSchema.of(manifest).feature_rows()
    for batch in make_loader(manifest["splits"][split]["files"],
                             LoaderConfig(batch_size=batch_size, table_rows=rows)):
        b = batch.to(device)
        parts.append((batch.labels.numpy(), torch.sigmoid(model(b.dense, b.sparse)).cpu().numpy(),
                      batch.row_ids.numpy()))
    model.train()
    labels, probs, rows = (np.concatenate(p) for p in zip(*parts)) if parts else \
        (np.zeros(0), np.zeros(0), np.zeros(0, np.int64))
    expected = manifest["splits"][split]["rows"]
    if labels.size != expected:
        raise RuntimeError(f"scored {labels.size} rows of {split} but it holds {expected}")
    return Scores(labels, probs.astype(np.float64), rows)


def evaluate_dlrm(model: DLRM, manifest: dict, split: str, batch_size: int,
                  oracle_probs: np.ndarray | None = None) -> dict[str, float]:
    """Click metrics of ``model`` on one split; with the generator's true probabilities, also the
    oracle AUC of the same rows (the best any model can expect)."""
    s = score_split(model, manifest, split, batch_size)
    return metrics_with_oracle(s.labels, s.probs, s.rows, oracle_probs)
