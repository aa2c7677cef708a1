"""The one batch type that flows from ingestion to the embedding layer.

Sparse features are jagged, feature-major: ``lengths[t, b]`` ids for feature t of sample b, and
``values`` holds them in that order (all of feature 0, then feature 1, ...). ``offsets()`` is the
``T * B + 1`` prefix sum that fbgemm's table-batched embedding takes with ``values`` as indices.
``weights`` (optional, float32, one per id): each id's weight in its bag's sum (fbgemm's
``per_sample_weights``); 1.0 for the ids of unweighted features, None when no feature is
weighted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class SparseFeatures:
    keys: tuple[str, ...]
    values: torch.Tensor  # int64 [sum(lengths)]
    lengths: torch.Tensor  # int64 [T, B]
    weights: torch.Tensor | None = None  # float32 [sum(lengths)]

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[1])

    def offsets(self) -> torch.Tensor:
        flat = self.lengths.reshape(-1)
        out = torch.zeros(flat.numel() + 1, dtype=torch.int64, device=flat.device)
        torch.cumsum(flat, 0, out=out[1:])
        return out

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SparseFeatures:
        return SparseFeatures(
            self.keys,
            self.values.to(device, non_blocking=non_blocking),
            self.lengths.to(device, non_blocking=non_blocking),
            None if self.weights is None else self.weights.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> SparseFeatures:
        return SparseFeatures(self.keys, self.values.pin_memory(), self.lengths.pin_memory(),
                              None if self.weights is None else self.weights.pin_memory())

    @staticmethod
    def from_dense_ids(keys: Sequence[str], ids: np.ndarray, present: np.ndarray) -> SparseFeatures:
        """[B, T] ids with a [B, T] presence mask -> jagged (absent ids become empty bags)."""
        present_t = np.ascontiguousarray(present.T)
        values = np.ascontiguousarray(ids.T)[present_t]
        return SparseFeatures(
            tuple(keys),
            torch.from_numpy(values.astype(np.int64, copy=False)),
            torch.from_numpy(present_t.astype(np.int64)),
        )


@dataclass
class Batch:
    dense: torch.Tensor  # float32 [B, num_dense]
    sparse: SparseFeatures
    labels: torch.Tensor  # float32 [B]
    row_ids: torch.Tensor  # int64 [B]: global row numbers, for exact accounting and error messages

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            self.dense.to(device, non_blocking=non_blocking),
            self.sparse.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
            self.row_ids,
        )

    def pin_memory(self) -> Batch:
        return Batch(self.dense.pin_memory(), self.sparse.pin_memory(), self.labels.pin_memory(),
                     self.row_ids)
