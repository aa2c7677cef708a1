"""MNIST IDX reader and TIMIT-style frame loader (context windows, split by recording)."""

import gzip

import numpy as np
import pytest

from recscale.config import ConfigError, parse
from recscale.data.frames import (
    FrameFormatError,
    SpeechFramesConfig,
    check_frames,
    context_windows,
    load_frame_features,
    prepare_speech_frames,
)
from recscale.data.idx import IDXFormatError, MnistConfig, prepare_mnist, read_idx, write_idx
from tests.conftest import PROJECT_ROOT

RAW = PROJECT_ROOT / "data" / "01_raw"


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip(tmp_path, dtype, suffix):
    arr = (np.arange(2 * 3 * 4) - 5).astype(dtype).reshape(2, 3, 4)
    if dtype == np.uint8:
        arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = write_idx(tmp_path / f"a.idx{suffix}", arr)
    out = read_idx(path)
    assert out.dtype == np.dtype(dtype) and out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)


def test_idx_header_is_big_endian_and_matches_the_mnist_layout(tmp_path):
    path = write_idx(tmp_path / "labels.idx", np.array([7, 2, 1], dtype=np.uint8))
    assert path.read_bytes() == bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 2, 1])


def test_bad_idx_files_name_the_file_and_the_problem(tmp_path):
    bad = tmp_path / "bad.idx"
    bad.write_bytes(bytes([1, 0, 8, 1, 0, 0, 0, 1, 5]))
    with pytest.raises(IDXFormatError, match="bad magic number"):
        read_idx(bad)
    bad.write_bytes(bytes([0, 0, 0x42, 1, 0, 0, 0, 1, 5]))
    with pytest.raises(IDXFormatError, match="unknown IDX type code 0x42"):
        read_idx(bad)
    with gzip.open(tmp_path / "short.gz", "wb") as fh:
        fh.write(bytes([0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3]))
    with pytest.raises(IDXFormatError, match=r"short.gz: shape \(2, 3\) of uint8 needs 6 bytes"):
        read_idx(tmp_path / "short.gz")


def test_shipped_mnist_reads_and_splits_disjointly():
    images = read_idx(RAW / "mnist" / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(RAW / "mnist" / "t10k-labels-idx1-ubyte.gz")
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (10000,) and set(np.unique(labels)) == set(range(10))
    s = prepare_mnist(images, labels, parse(MnistConfig, {}, "hf.data"))
    assert [len(s[f"y_{k}"]) for k in ("train", "validation", "test")] == [8000, 1000, 1000]
    assert s["x_train"].shape == (8000, 784) and s["x_train"].dtype == np.float32
    assert 0.0 <= s["x_train"].min() and s["x_train"].max() <= 1.0
    # disjoint: no image row appears in two splits
    rows = {k: {r.tobytes() for r in s[f"x_{k}"]} for k in ("train", "validation", "test")}
    assert not (rows["train"] & rows["test"]) and not (rows["validation"] & rows["test"])
    with pytest.raises(ConfigError, match=r"hf.data.splits=\[0.5, 0.2, 0.2\] is not allowed"):
        parse(MnistConfig, {"splits": [0.5, 0.2, 0.2]}, "hf.data")


def test_context_windows_stay_inside_each_recording():
    X = np.arange(7, dtype=np.float32).reshape(7, 1)  # recordings: [0 1 2] [3] [4 5 6]
    w = context_windows(X, np.array([3, 1, 3]), context=2)
    assert w.shape == (7, 5)
    np.testing.assert_array_equal(w[0], [0, 0, 0, 1, 2])  # left edge repeats frame 0
    np.testing.assert_array_equal(w[2], [0, 1, 2, 2, 2])  # never reaches frame 3
    np.testing.assert_array_equal(w[3], [3, 3, 3, 3, 3])  # one-frame recording
    np.testing.assert_array_equal(w[4], [4, 4, 4, 5, 6])


def test_speech_frames_split_by_recording_with_per_recording_labels():
    f = load_frame_features(RAW / "fsdd_mfcc" / "digits.npz")
    assert f.X.shape == (53999, 13) and len(f.y) == 3000 and int(f.lengths.sum()) == 53999
    s = prepare_speech_frames(f, parse(SpeechFramesConfig, {"max_recordings": 200}, "hf_speech.data"))
    recs = [set(s[f"recordings_{k}"].tolist()) for k in ("train", "validation", "test")]
    assert not (recs[0] & recs[1]) and not (recs[0] & recs[2]) and not (recs[1] & recs[2])
    assert set().union(*recs) == set(range(200))
    assert s["x_train"].shape[1] == 11 * 13 and s["info"]["input_dim"] == 143
    n_frames = sum(len(s[f"y_{k}"]) for k in ("train", "validation", "test"))
    assert n_frames == int(f.lengths[:200].sum())
    # each frame's label is its recording's digit
    r0 = sorted(recs[0])[0]
    first = int(np.searchsorted(np.sort(s["recordings_train"]), r0))
    assert first == 0 and s["y_train"][0] == f.y[r0]
    # normalized on the training frames: the centre frame columns have mean 0, std 1
    centre = s["x_train"][:, 5 * 13: 6 * 13]
    np.testing.assert_allclose(centre.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(centre.std(0), 1, atol=1e-3)


def test_timit_style_per_frame_labels_and_format_errors(tmp_path):
    rng = np.random.default_rng(0)
    lengths = np.array([4, 6, 5, 3, 7])
    X = rng.normal(size=(25, 3)).astype(np.float32)
    y = rng.integers(0, 4, size=25)  # one label per frame (phone states)
    np.savez(tmp_path / "timit.npz", X=X, y=y, lengths=lengths)
    f = load_frame_features(tmp_path / "timit.npz")
    s = prepare_speech_frames(f, SpeechFramesConfig(context=1, splits=(0.6, 0.2, 0.2)))
    for k in ("train", "validation", "test"):
        recs = s[f"recordings_{k}"]
        expected = np.concatenate([y[lengths[:r].sum(): lengths[: r + 1].sum()] for r in recs])
        np.testing.assert_array_equal(s[f"y_{k}"], expected)
    with pytest.raises(FrameFormatError, match="lengths sum to 24 but X has 25 frames"):
        check_frames(X, y, lengths - np.array([1, 0, 0, 0, 0]))
    with pytest.raises(FrameFormatError, match="y has 7 labels"):
        check_frames(X, y[:7], lengths)
    np.savez(tmp_path / "nolen.npz", X=X, y=y)
    with pytest.raises(FrameFormatError, match="missing array\\(s\\) lengths"):
        load_frame_features(tmp_path / "nolen.npz")
