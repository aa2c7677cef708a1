"""TIMIT-style frame features: npz with ``X`` (frames x dims), ``y`` and ``lengths``.

``lengths[i]`` frames of recording i follow each other in ``X``. ``y`` holds one label per
recording (the Free Spoken Digit MFCC file the project ships) or one label per frame (TIMIT phone
states). :func:`prepare_speech_frames` builds +-context frame windows inside each recording
(edges repeat the first/last frame, windows never cross recordings) and splits by recording, so
no recording has frames in two splits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recscale.config import Validated, check
from recscale.data.idx import SPLITS, split_indices, validate_splits


class FrameFormatError(ValueError):
    """The frame-feature file is inconsistent; the message names the arrays and their sizes."""


@dataclass(frozen=True)
class FrameFeatures:
    X: np.ndarray  # (frames, dims) float32
    y: np.ndarray  # (recordings,) or (frames,) int64
    lengths: np.ndarray  # (recordings,) int64

    @property
    def per_frame_labels(self) -> np.ndarray:
        return self.y if len(self.y) == len(self.X) and len(self.y) != len(self.lengths) \
            else np.repeat(self.y, self.lengths)


def check_frames(X: np.ndarray, y: np.ndarray, lengths: np.ndarray, where: str = "frames") -> FrameFeatures:
    X, y, lengths = np.asarray(X), np.asarray(y), np.asarray(lengths)
    if X.ndim != 2:
        raise FrameFormatError(f"{where}: X has shape {X.shape}; expected (frames, dims)")
    if lengths.ndim != 1 or (lengths < 0).any():
        raise FrameFormatError(f"{where}: lengths must be a 1-D array of frame counts >= 0")
    if int(lengths.sum()) != len(X):
        raise FrameFormatError(f"{where}: lengths sum to {int(lengths.sum())} but X has {len(X)} frames")
    if len(y) not in (len(lengths), len(X)):
        raise FrameFormatError(f"{where}: y has {len(y)} labels; expected one per recording "
                               f"({len(lengths)}) or one per frame ({len(X)})")
    if not np.issubdtype(y.dtype, np.integer) or (y < 0).any():
        raise FrameFormatError(f"{where}: y must hold non-negative integer class labels")
    return FrameFeatures(X.astype(np.float32, copy=False), y.astype(np.int64), lengths.astype(np.int64))


def load_frame_features(path: str | Path) -> FrameFeatures:
    """Read and check an npz with arrays X, y, lengths."""
    with np.load(path) as d:
        missing = [k for k in ("X", "y", "lengths") if k not in d.files]
        if missing:
            raise FrameFormatError(f"{path}: missing array(s) {', '.join(missing)}; "
                                   f"has {', '.join(d.files)}; expected X, y, lengths")
        return check_frames(d["X"], d["y"], d["lengths"], str(path))


def context_windows(X: np.ndarray, lengths: np.ndarray, context: int) -> np.ndarray:
    """(frames, (2 context + 1) dims): each frame with its +-context neighbours of the same
    recording (repeated edge frames at its ends), oldest first."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(X)
    rec = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])[rec]
    ends = starts + lengths[rec] - 1
    pos = np.arange(n)
    cols = [X[np.clip(pos + o, starts, ends)] for o in range(-context, context + 1)]
    return np.concatenate(cols, axis=1) if cols else X[:0]


@dataclass(frozen=True)
class SpeechFramesConfig(Validated):
    """The ``hf_speech.data`` block."""

    context: int = 5  # frames on each side
    splits: tuple[float, float, float] = (0.8, 0.1, 0.1)  # by recording
    seed: int = 0
    normalize: bool = True  # per-dimension mean/std from the training frames
    max_recordings: int | None = None  # use only the first N recordings (tests)

    def validate(self, prefix: str = "data") -> None:
        check(0 <= self.context <= 50, f"{prefix}.context", self.context, "an integer in [0, 50]")
        validate_splits(self.splits, f"{prefix}.splits")
        check(self.max_recordings is None or self.max_recordings >= 3, f"{prefix}.max_recordings",
              self.max_recordings, "null or >= 3")


def _take(f: FrameFeatures, recordings: Sequence[int]) -> FrameFeatures:
    offsets = np.concatenate([[0], np.cumsum(f.lengths)])
    rows = np.concatenate([np.arange(offsets[r], offsets[r + 1]) for r in recordings]) \
        if len(recordings) else np.zeros(0, dtype=np.int64)
    per_frame = len(f.y) == len(f.X) and len(f.y) != len(f.lengths)
    return FrameFeatures(f.X[rows], f.y[rows] if per_frame else f.y[np.asarray(recordings, int)],
                         f.lengths[np.asarray(recordings, int)])


def prepare_speech_frames(features: FrameFeatures, cfg: SpeechFramesConfig) -> dict:
    """Frame classification splits: {x_<split>: float32 (frames, (2c+1) dims), y_<split>,
    recordings_<split>: recording indices, info} for train, validation, test."""
    f = features
    if cfg.max_recordings is not None and cfg.max_recordings < len(f.lengths):
        f = _take(f, range(cfg.max_recordings))
    n_rec = len(f.lengths)
    parts = dict(zip(SPLITS, split_indices(n_rec, cfg.splits, cfg.seed)))
    train = _take(f, parts["train"])
    mean = train.X.mean(0) if cfg.normalize else np.zeros(f.X.shape[1], np.float32)
    std = train.X.std(0) + 1e-6 if cfg.normalize else np.ones(f.X.shape[1], np.float32)
    out: dict = {"info": {"source": "frames", "recordings": n_rec, "frames": int(len(f.X)),
                          "context": cfg.context, "frame_dim": int(f.X.shape[1]),
                          "input_dim": int(f.X.shape[1] * (2 * cfg.context + 1)),
                          "num_classes": int(f.y.max()) + 1}}
    for name, recs in parts.items():
        sub = _take(f, recs)
        xs = ((sub.X - mean) / std).astype(np.float32)
        out[f"x_{name}"] = context_windows(xs, sub.lengths, cfg.context)
        out[f"y_{name}"] = sub.per_frame_labels
        out[f"recordings_{name}"] = np.asarray(recs, dtype=np.int64)
        out["info"][f"{name}_examples"] = int(len(sub.X))
        out["info"][f"{name}_recordings"] = int(len(recs))
    return out
