"""Wire codecs: round-trip error inside the documented bound, bytes per row, config checks."""

import pytest
import torch

from recscale.comm import WIRE_PRECISIONS, CommsConfig
from recscale.comm.codecs import get_codec
from recscale.config import ConfigError, parse


def random_rows(seed=0, rows=257, cols=96):
    """Rows with very different magnitudes, signs and a few outliers (never zeros)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.empty(rows, 1).uniform_(-12, 6, generator=g))
    x = torch.randn(rows, cols, generator=g) * scale
    x[::17, 3] *= 50.0
    return x


@pytest.mark.parametrize("name", WIRE_PRECISIONS)
@pytest.mark.parametrize("seed", [0, 1])
def test_round_trip_error_is_inside_the_documented_bound(name, seed):
    codec = get_codec(name)
    x = random_rows(seed)
    b = codec.encode(x)
    assert b.dtype == torch.uint8 and b.shape == (x.shape[0], codec.row_bytes(x.shape[1]))
    y = codec.decode(b, x.shape[1])
    assert y.dtype == torch.float32 and y.shape == x.shape
    err = (y - x).abs()
    assert (err <= codec.bound(x)).all(), (name, float((err - codec.bound(x)).max()))
    if name != "fp32":
        assert err.max() > 0  # it really is lossy: the bound is not vacuous
    assert torch.isfinite(y).all()


def test_bytes_per_row_halve_or_quarter_fp32():
    d = 128
    fp32 = get_codec("fp32").row_bytes(d)
    assert get_codec("fp16").row_bytes(d) * 2 == fp32 == get_codec("bf16").row_bytes(d) * 2
    assert get_codec("fp8").row_bytes(d) / fp32 == pytest.approx(0.25 + 4 / 512)
    assert get_codec("int8").row_bytes(d) / fp32 == pytest.approx(0.25 + 8 / 512)


def test_fp16_overflows_without_care_and_the_loss_scale_rescues_small_gradients():
    small = torch.full((4, 8), 1e-9)
    fp16 = get_codec("fp16")
    assert (fp16.decode(fp16.encode(small), 8) == 0).all()  # flushed to zero unscaled
    scaled = fp16.decode(fp16.encode(small * 1024), 8) / 1024
    assert torch.allclose(scaled, small, rtol=1e-2)


def test_comms_config_names_the_bad_key():
    assert parse(CommsConfig, {"forward": "fp8", "backward": "int8"}, "comms").to_dict() == {
        "forward": "fp8", "backward": "int8", "dense_allreduce": "fp32", "loss_scale": 1024.0}
    with pytest.raises(ConfigError, match=r"comms\.dense_allreduce='int8' is not allowed"):
        parse(CommsConfig, {"dense_allreduce": "int8"}, "comms")
    with pytest.raises(ConfigError, match=r"comms\.forward='fp4'"):
        parse(CommsConfig, {"forward": "fp4"}, "comms")


class _Arrived:
    def __init__(self, payload):
        self.payload = payload

    def wait(self):
        return self.payload


def _received(x: torch.Tensor, codec_name: str, scale: float) -> torch.Tensor:
    from recscale.comm.collectives import PendingEncoded

    codec = get_codec(codec_name)
    payload = codec.encode(x).reshape(-1)
    return PendingEncoded(_Arrived(payload), [tuple(x.shape)], [payload.numel()], codec, "grads",
                          scale, x).wait()


@pytest.mark.parametrize("scale", [1024.0, 1000.0])
def test_scaled_gradients_come_back_divided_and_overflow_is_refused(scale):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 24, generator=g) * 100
    got = _received(x, "fp16", scale)
    want = get_codec("fp16").decode(get_codec("fp16").encode(x), 24).reshape(-1) / scale
    assert torch.equal(got, want)
    bad = x.clone()
    bad[17, 3] = 1e6  # beyond fp16's range once encoded: inf
    with pytest.raises(FloatingPointError, match="grads: non-finite values after fp16"):
        _received(bad, "fp16", scale)
    # finite bf16 values whose sum overflows float32 are not refused
    big = torch.full((4, 8), 3e38)
    assert torch.isfinite(_received(big, "bf16", 2.0)).all()
