"""IDX files (the MNIST format) and MNIST train/validation/test splits for dense classifiers.

IDX: a big-endian header ``0 0 <type> <ndims>``, ndims uint32 sizes, then the array. Any IDX file
reads (gzip or plain), so the full 60,000-image MNIST works by pointing the catalog at its files;
the project ships the 10,000-image t10k split and divides it with :func:`split_indices`.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recscale.config import Validated, check

# IDX type code -> numpy big-endian dtype
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_CODES = {np.dtype(v).newbyteorder("="): k for k, v in IDX_TYPES.items()}


class IDXFormatError(ValueError):
    """The bytes are not a well-formed IDX file; the message names the file and the problem."""


def _open(path: str | Path):
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


def read_idx(path: str | Path) -> np.ndarray:
    """The array stored in an IDX file (gzip-compressed or not), in native byte order."""
    with _open(path) as fh:
        data = fh.read()
    if len(data) < 4:
        raise IDXFormatError(f"{path}: {len(data)} bytes, too short for an IDX header")
    if data[0] != 0 or data[1] != 0:
        raise IDXFormatError(f"{path}: bad magic number {data[:4].hex()} (expected 0000xxyy)")
    code, ndim = data[2], data[3]
    if code not in IDX_TYPES:
        raise IDXFormatError(f"{path}: unknown IDX type code 0x{code:02x} "
                             f"(expected one of {', '.join(f'0x{c:02x}' for c in IDX_TYPES)})")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IDXFormatError(f"{path}: header declares {ndim} dimensions but the file ends first")
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", ndim, 4))
    dtype = np.dtype(IDX_TYPES[code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise IDXFormatError(f"{path}: shape {shape} of {dtype.name} needs {expected} bytes of "
                             f"data, the file has {len(data) - header}")
    arr = np.frombuffer(data, dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="))


def write_idx(path: str | Path, array: np.ndarray) -> Path:
    """Write ``array`` as IDX (gzip when the name ends in .gz)."""
    arr = np.asarray(array)
    dt = arr.dtype.newbyteorder("=")
    if dt not in _CODES:
        raise IDXFormatError(f"dtype {arr.dtype} has no IDX type code "
                             "(uint8, int8, int16, int32, float32, float64)")
    code = _CODES[dt]
    payload = (bytes([0, 0, code, arr.ndim]) + np.asarray(arr.shape, ">u4").tobytes()
               + arr.astype(IDX_TYPES[code]).tobytes())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as fh:
        fh.write(payload)
    return path


def split_indices(n: int, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    """Disjoint random index sets covering range(n), sized by ``fractions`` (summing to 1)."""
    perm = np.random.default_rng(seed).permutation(n)
    bounds = np.round(np.cumsum([0.0, *fractions]) * n).astype(int)
    bounds[-1] = n
    return [np.sort(perm[bounds[i]: bounds[i + 1]]) for i in range(len(fractions))]


SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class MnistConfig(Validated):
    """The ``hf.data`` block: how the IDX images and labels become splits."""

    splits: tuple[float, float, float] = (0.8, 0.1, 0.1)  # train / validation / test
    seed: int = 0
    max_examples: int | None = None  # use only the first N images (tests)

    def validate(self, prefix: str = "data") -> None:
        validate_splits(self.splits, f"{prefix}.splits")
        check(self.max_examples is None or self.max_examples >= 10, f"{prefix}.max_examples",
              self.max_examples, "null or >= 10")


def validate_splits(splits: Sequence[float], key: str) -> None:
    check(len(splits) == 3 and all(f >= 0 for f in splits) and splits[0] > 0
          and abs(sum(splits) - 1.0) < 1e-6, key, list(splits),
          "3 non-negative fractions (train > 0) summing to 1")


def prepare_mnist(images: np.ndarray, labels: np.ndarray, cfg: MnistConfig) -> dict:
    """IDX images (N, rows, cols) uint8 and labels (N,) -> {x_<split>: float32 (n, rows*cols) in
    [0, 1], y_<split>: int64, info: {...}} for train, validation, test."""
    if images.ndim < 2 or len(images) != len(labels):
        raise IDXFormatError(f"images {images.shape} and labels {labels.shape} do not match: "
                             "expected (N, ...) images and N labels")
    n = len(images) if cfg.max_examples is None else min(cfg.max_examples, len(images))
    x = images[:n].reshape(n, -1).astype(np.float32)
    if images.dtype == np.uint8:
        x /= 255.0
    y = labels[:n].astype(np.int64)
    out: dict = {"info": {"source": "idx", "examples": n, "input_dim": int(x.shape[1]),
                          "num_classes": int(y.max()) + 1, "image_shape": list(images.shape[1:])}}
    for name, idx in zip(SPLITS, split_indices(n, cfg.splits, cfg.seed)):
        out[f"x_{name}"], out[f"y_{name}"] = x[idx], y[idx]
        out["info"][f"{name}_examples"] = int(len(idx))
    return out
