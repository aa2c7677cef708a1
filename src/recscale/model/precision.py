"""Whether bf16 dense layers (``model.dense_precision: bf16``) can pay off on this CPU. Without bf16
units (AVX512_BF16 or AMX) torch emulates bf16 matrix products, measured at about 1 GFLOP/s
against 93 in fp32 on a 2-vCPU AMD EPYC with AVX2 only: the dense layers then train ~25x slower
than fp32, which a run should say at its start rather than leave to be found in its throughput."""

from __future__ import annotations

import time

import torch


def cpu_bf16_units() -> tuple[str, bool]:
    """(torch's CPU capability, e.g. ``AVX2`` or ``AVX512``; whether the CPU has bf16 units:
    AVX512_BF16 or AMX tiles)."""
    capability = str(torch.backends.cpu.get_cpu_capability())
    try:
        has = bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # a torch without these probes: trust the capability's name
        has = "BF16" in capability.upper() or "AMX" in capability.upper()
    return capability, has


def matmul_gflops(dtype: torch.dtype, n: int = 256, reps: int = 3) -> float:
    """This CPU's rate for an n x n x n matrix product in ``dtype`` (the best of ``reps``)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / max(best, 1e-9) / 1e9


def bf16_warning(dense_precision: str, device: torch.device | str = "cpu") -> str | None:
    """What a run with ``model.dense_precision=dense_precision`` on ``device`` should warn of: bf16
    dense layers on a CPU without bf16 units, with the capability and the rates measured now;
    None where there is nothing to say."""
    if dense_precision != "bf16" or torch.device(device).type != "cpu":
        return None
    capability, has_units = cpu_bf16_units()
    if has_units:
        return None
    fp32, bf16 = matmul_gflops(torch.float32), matmul_gflops(torch.bfloat16)
    return (f"model.dense_precision='bf16' on a CPU without bf16 units (torch's CPU capability "
            f"{capability}; no AVX512_BF16 or AMX), where torch emulates bf16 products: one ran "
            f"at {bf16:.1f} GFLOP/s here against {fp32:.1f} in fp32 ({bf16 / fp32:.2f}x), and the "
            "dense layers train at about that share of fp32's speed; model.dense_precision: fp32 "
            "is the setting for this machine")
