"""Reduced-precision collectives on 2 gloo ranks: error bounds through autograd, bytes, training."""

import numpy as np
import pytest

from recscale.distributed import LaunchConfig, launch
from tests.distributed import workers as W

pytestmark = pytest.mark.dist

PRECISIONS = ["fp32", "fp16", "bf16", "fp8", "int8"]


@pytest.fixture(scope="module")
def cfg():
    return LaunchConfig(world_size=2, collective_timeout_s=60)


def test_encoded_all_to_all_values_and_gradients_stay_inside_the_codec_bounds(cfg):
    pairs = [(p, p) for p in PRECISIONS] + [("fp16", "bf16"), ("int8", "fp16")]
    res = launch(W.encoded_a2a_worker, (pairs,), cfg)
    for rank, per_pair in res.items():
        for pair, r in per_pair.items():
            assert r["fwd_excess"] <= 0, (rank, pair, r)
            assert r["bwd_excess"] <= 0, (rank, pair, r)
        assert per_pair["fp32/fp32"]["bwd_err"] == 0
        assert per_pair["int8/int8"]["bwd_err"] > 0  # lossy, yet inside the bound


def test_every_codec_trains_without_nan_and_cuts_the_bytes(cfg):
    steps = W.make_global_batches(5, sizes=(24, 40), seed=5)
    res = launch(W.codec_training_worker, (PRECISIONS, steps), cfg)
    for rank, per_p in res.items():
        for p, r in per_p.items():
            assert np.isfinite(r["losses"]).all() and r["finite"], (rank, p)
        full = per_p["fp32"]["bytes"]
        for name in ("output", "output_grad", "dp_output_grad"):
            assert per_p["fp16"]["bytes"][name] * 2 == full[name]
            assert per_p["bf16"]["bytes"][name] * 2 == full[name]
            for p in ("fp8", "int8"):  # about a quarter: 1 byte per value + row scales
                assert 0.25 < per_p[p]["bytes"][name] / full[name] < 0.30, (p, name)
        assert per_p["fp16"]["bytes"]["dense_allreduce"] * 2 == full["dense_allreduce"]
        # ids are integers: never encoded
        assert per_p["int8"]["bytes"]["input"] == full["input"]
