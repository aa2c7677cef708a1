"""Wire precisions for the sharded runtime's collectives.

A codec turns a float32 matrix [rows, cols] into bytes [rows, row_bytes(cols)] before a collective
and back to float32 after it; rows stay whole, so an all-to-all can split the payload by rows.
Documented error bounds (per element, ``x`` the input, ``m`` the largest |x| of its row, ``r`` the
row's max - min):

| codec | bytes per row | bound on abs(decode(encode(x)) - x) |
|---|---|---|
| fp32 | 4 cols | 0 |
| fp16 | 2 cols | 2^-11 abs(x) + 2^-24 (finite below 65504) |
| bf16 | 2 cols | 2^-8 abs(x) + 1e-38 |
| fp8 (e4m3, fp32 scale s = m / 448 per row) | cols + 4 | 2^-4 abs(x) + 2^-9 s |
| int8 (fbgemm Fused8BitRowwise: fp32 scale + bias per row) | cols + 8 | r / 510 + 1e-8 (+ fp32 rounding) |
"""

from __future__ import annotations

import torch

from recscale.comm.precision import WIRE_PRECISIONS
from recscale.config import check_choice

FP8_MAX = 448.0  # largest finite float8_e4m3fn


class Codec:
    name = "fp32"

    def row_bytes(self, cols: int) -> int:
        return 4 * cols

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """float32 [rows, cols] -> uint8 [rows, row_bytes(cols)]."""
        return x.contiguous().view(torch.uint8).view(x.shape[0], -1)

    def decode(self, b: torch.Tensor, cols: int) -> torch.Tensor:
        """uint8 [rows, row_bytes(cols)] -> float32 [rows, cols]."""
        return b.contiguous().view(torch.float32).view(b.shape[0], cols)

    def bound(self, x: torch.Tensor) -> torch.Tensor:
        """Per-element bound on the round-trip error of ``x`` (see the module docstring)."""
        return torch.zeros_like(x)


class _Cast(Codec):
    dtype = torch.float16
    rel = 2.0 ** -11
    absolute = 2.0 ** -24

    def row_bytes(self, cols: int) -> int:
        return 2 * cols

    def encode(self, x):
        return x.to(self.dtype).contiguous().view(torch.uint8).view(x.shape[0], -1)

    def decode(self, b, cols):
        return b.contiguous().view(self.dtype).view(b.shape[0], cols).float()

    def bound(self, x):
        return self.rel * x.abs() + self.absolute


class FP16(_Cast):
    name = "fp16"


class BF16(_Cast):
    name = "bf16"
    dtype = torch.bfloat16
    rel = 2.0 ** -8
    absolute = 1e-38


class FP8(Codec):
    """float8 e4m3 with one fp32 scale per row (amax / 448): 1 byte per element + 4 per row."""

    name = "fp8"

    def row_bytes(self, cols):
        return cols + 4

    def _scale(self, x):
        return (x.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(1e-30)

    def encode(self, x):
        scale = self._scale(x)
        q = (x / scale).to(torch.float8_e4m3fn).view(torch.uint8)
        return torch.cat([q, scale.view(torch.uint8).view(x.shape[0], 4)], dim=1)

    def decode(self, b, cols):
        q = b[:, :cols].contiguous().view(torch.float8_e4m3fn).float()
        scale = b[:, cols:].contiguous().view(torch.float32)
        return q * scale

    def bound(self, x):
        # 3 mantissa bits: half an ulp is 2^-4 relative; below the smallest normal (2^-6 of the
        # scaled range) the step is 2^-9 of the scale
        return 2.0 ** -4 * x.abs() + 2.0 ** -9 * self._scale(x) + 1e-30


class Int8Rowwise(Codec):
    """fbgemm's Fused8BitRowwise: uint8 codes with an fp32 scale and bias per row."""

    name = "int8"

    def __init__(self):
        from recscale import check_fbgemm

        check_fbgemm()  # loads the fbgemm operator library

    def row_bytes(self, cols):
        return cols + 8

    def encode(self, x):
        return torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(x.contiguous())

    def decode(self, b, cols):
        return torch.ops.fbgemm.Fused8BitRowwiseQuantizedToFloat(b.contiguous())

    def bound(self, x):
        r = (x.amax(dim=1, keepdim=True) - x.amin(dim=1, keepdim=True))
        # fbgemm divides by (r + 1e-8) when quantizing: up to 1e-8 more than half a step
        return r / 255.0 * 0.5 * (1 + 1e-3) + 1e-6 * x.abs() + 1.01e-8


CODECS = {"fp32": Codec, "fp16": FP16, "bf16": BF16, "fp8": FP8, "int8": Int8Rowwise}


def get_codec(name: str) -> Codec:
    check_choice("comms precision", name, WIRE_PRECISIONS)
    return CODECS[name]()
