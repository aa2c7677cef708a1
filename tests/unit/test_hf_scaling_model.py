"""benchmarks/bench_hf_scaling.py's model of one HF iteration: compute split over the nodes, ring
all-reduces of the gradient and every product (P floats) and of every loss (one float)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_hf_scaling as S  # noqa: E402

CAL = {"grad": (0.01, 2e-6), "prod": (0.002, 3e-6), "eval": (0.001, 1e-6)}


def test_one_node_has_no_communication_and_the_compute_adds_up():
    p = S.predict(CAL, P=1000, B=8000, C=2000, N=1, K=10, E=2, bw_bytes=1e9, alpha=1e-5)
    assert p["comm_s"] == 0.0
    assert p["compute_s"] == pytest.approx(0.01 + 2e-6 * 8000 + 10 * (0.002 + 3e-6 * 2000)
                                           + 2 * (0.001 + 1e-6 * 8000))


def test_ring_all_reduces_count_bytes_and_latency():
    P, K, E, bw, alpha, N = 25_000, 10, 3, 1.25e9, 2e-5, 4
    p = S.predict(CAL, P=P, B=65536, C=8192, N=N, K=K, E=E, bw_bytes=bw, alpha=alpha)
    ring = 2 * (N - 1) / N
    expected = (1 + K) * (ring * 4 * P / bw + 2 * (N - 1) * alpha) + E * (
        ring * 4 / bw + 2 * (N - 1) * alpha)
    assert p["comm_s"] == pytest.approx(expected)
    # more nodes: less compute each, more latency
    q = S.predict(CAL, P=P, B=65536, C=8192, N=2 * N, K=K, E=E, bw_bytes=bw, alpha=alpha)
    assert q["compute_s"] < p["compute_s"] and q["comm_s"] > p["comm_s"]
