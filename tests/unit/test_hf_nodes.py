"""The hf / hf_speech nodes and the trainer behind them, on tiny data (nodes called directly, no kedro run)."""

import pytest
import torch
import yaml

from recscale.config import ConfigError
from recscale.data.frames import load_frame_features
from recscale.data.idx import read_idx
from recscale.hf import load_model
from recscale.pipelines.hf import nodes as N
from tests.conftest import PROJECT_ROOT

RAW = PROJECT_ROOT / "data" / "01_raw"


def _params(key):
    """conf/base merged with conf/test (soft merge: nested keys override)."""
    def merge(a, b):
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
        return out

    base = yaml.safe_load((PROJECT_ROOT / "conf/base/parameters_hf.yml").read_text())
    test = yaml.safe_load((PROJECT_ROOT / "conf/test/parameters_hf.yml").read_text())
    return merge(base, test)[key]


@pytest.fixture(scope="module")
def mnist_splits():
    images = read_idx(RAW / "mnist" / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(RAW / "mnist" / "t10k-labels-idx1-ubyte.gz")
    splits, metrics = N.preprocess_mnist(images, labels, N.parse_mnist_job(_params("hf")))
    assert metrics["data.train_examples"]["value"] == 1600
    return splits


def test_mnist_nodes_train_hf_and_baselines_and_compare(mnist_splits):
    p = N.parse_mnist_job(_params("hf"))
    fit, state, history, summary = N.train_hessian_free(mnist_splits, p)
    assert set(state) == {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias",
                          "6.weight", "6.bias"}  # 4 linear layers
    # loss and error against passes and wall time; CG iterations, damping, NC events per step
    for name in ("hf.val_error", "hf.val_error_by_centipass", "hf.val_error_by_wall_ms",
                 "hf.train_loss", "hf.cg_iters", "hf.damping", "hf.negative_curvature_events",
                 "hf.rho", "hf.passes", "hf.wall_s"):
        assert name in history, name
    assert len(history["hf.cg_iters"]) == summary["hf.total_steps"]["value"] == 4
    assert [h["step"] for h in history["hf.val_error_by_centipass"]] == [0, 100, 200, 300, 400]
    assert history["hf.val_error"][-1]["value"] < 0.8  # learning, from 0.9
    assert all(h["value"] >= 1 for h in history["hf.cg_iters"])

    baselines, b_hist, b_summary = N.train_baselines(mnist_splits, p)
    assert set(baselines) == {"sgd", "adam"}
    assert b_summary["sgd.total_steps"]["value"] == 40  # 1,600 / 160 per pass x 4 passes
    assert "adam.val_error_by_wall_ms" in b_hist

    metrics, report, image = N.evaluate_optimizers(mnist_splits, fit, baselines, p)
    x, y = torch.as_tensor(mnist_splits["x_test"]), torch.as_tensor(mnist_splits["y_test"])
    for o, result in (("hf", fit), *baselines.items()):
        # each optimizer's own final weights, counted by hand on the test split, and better than
        # chance (9 in 10 wrong with 10 classes)
        with torch.no_grad():
            wrong = int((load_model(result, mnist_splits, p.model)(x).argmax(1) != y).sum())
        assert metrics[f"test.{o}.error"]["value"] == pytest.approx(wrong / len(y), abs=1e-12)
        assert metrics[f"test.{o}.error"]["value"] < 0.85, o
        assert report["optimizers"][o]["test"]["error"] == metrics[f"test.{o}.error"]["value"]
    assert metrics["target_val_error"]["value"] == baselines["sgd"].summary["best_val_error"]
    assert "sgd.passes_to_target" in metrics  # SGD reaches its own best, by definition
    assert image.size[0] > 800 and image.mode in ("RGBA", "RGB")


def test_speech_nodes_run_on_frames():
    p = N.parse_speech_job(_params("hf_speech"))
    frames = load_frame_features(RAW / "fsdd_mfcc" / "digits.npz")
    splits, metrics = N.preprocess_speech(frames, p)
    assert metrics["data.input_dim"]["value"] == 143 and metrics["data.recordings"]["value"] == 300
    fit, _, history, _ = N.train_hessian_free(splits, p)
    assert history["hf.val_error"][-1]["value"] < history["hf.val_error"][0]["value"]


def test_a_bad_parameter_names_the_key(mnist_splits):
    p = _params("hf")
    bad = {**p, "train": {**p["train"], "global_batch_size": 0}}
    with pytest.raises(ConfigError, match=r"hf.train.global_batch_size=0 is not allowed: expected a positive"):
        N.parse_mnist_job(bad)
    bad = {**p, "optimizer": {**p["optimizer"], "solver": "gmres"}}
    with pytest.raises(ConfigError, match=r"hf.optimizer.solver='gmres' is not allowed: expected one of 'cg', 'bicgstab'"):
        N.parse_mnist_job(bad)
    bad = {**p, "baselines": {**p["baselines"], "optimizers": ["sgd", "rmsprop"]}}
    with pytest.raises(ConfigError, match=r"hf.baselines.optimizers\[1\]='rmsprop' is not allowed"):
        N.parse_mnist_job(bad)
    with pytest.raises(ConfigError, match=r"unknown key hf.trian"):
        N.parse_mnist_job({**p, "trian": {}})
    with pytest.raises(ConfigError, match=r"hf_speech.data.context=60 is not allowed"):
        N.parse_speech_job({"data": {"context": 60}}, key="hf_speech")


def test_renamed_keys_fail_with_their_new_name():
    p = _params("hf")
    renamed = [("train", "batch_size", "hf.train.global_batch_size"),
               ("train", "world_size", "hf.train.launch.world_size"),
               ("train", "collective_timeout_s", "hf.train.launch.collective_timeout_s"),
               ("baselines", "batch_size", "hf.baselines.global_batch_size")]
    for block, old, new in renamed:
        bad = {**p, block: {**p[block], old: 2}}
        with pytest.raises(ConfigError, match=rf"hf.{block}.{old} is not allowed: it is now {new}$"):
            N.parse_mnist_job(bad)
    bad = {**p, "train": {**p["train"], "launch": {"world_size": 2, "nnodes": 3}}}
    with pytest.raises(ConfigError, match=r"hf.train.launch.nnodes=3 is not allowed"):
        N.parse_mnist_job(bad)
