"""Kedro datasets for the HF pipelines' raw inputs (read-only): IDX arrays and frame features."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from kedro.io import AbstractDataset, DatasetError

from recscale.data.frames import FrameFeatures, load_frame_features
from recscale.data.idx import read_idx


class _ReadOnly(AbstractDataset):
    def __init__(self, filepath: str, metadata: dict[str, Any] | None = None):
        self._filepath = PurePosixPath(filepath)
        self.metadata = metadata

    def save(self, data) -> None:
        raise DatasetError(f"{type(self).__name__} is read-only ({self._filepath})")

    def _exists(self) -> bool:
        return Path(self._filepath).exists()

    def _describe(self) -> dict[str, Any]:
        return {"filepath": str(self._filepath)}


class IDXDataset(_ReadOnly):
    """An IDX file (gzip or plain), e.g. MNIST images or labels, loaded as a numpy array."""

    def load(self) -> np.ndarray:
        return read_idx(self._filepath)


class FrameFeaturesDataset(_ReadOnly):
    """TIMIT-style frame features: npz with X (frames x dims), y, lengths."""

    def load(self) -> FrameFeatures:
        return load_frame_features(self._filepath)
