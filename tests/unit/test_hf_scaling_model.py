"""benchmarks/bench_hf_scaling.py's model of one HF iteration, checked by what it must do rather
than by its own formula: the per-sample compute splits over the nodes, a ring all-reduce sends
2(N-1)/N of its message per rank and takes 2(N-1) latency steps, and an iteration all-reduces the
gradient and every product (P floats each) and every loss (one float)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_hf_scaling as S  # noqa: E402

CAL = {"grad": (0.01, 2e-6), "prod": (0.002, 3e-6), "eval": (0.001, 1e-6)}
P, B, C, K, E = 25_000, 65_536, 8_192, 10, 3


def _p(N, bw=1.25e9, alpha=2e-5, **kw):
    args = dict(P=P, B=B, C=C, N=N, K=K, E=E, bw_bytes=bw, alpha=alpha, **kw)
    return S.predict(CAL, **args)


def test_one_node_communicates_nothing_and_its_compute_grows_with_the_rows_at_the_calibrated_rates():
    one = _p(1)
    assert one["comm_s"] == 0.0 and one["total_s"] == one["compute_s"]
    more_b = S.predict(CAL, P=P, B=B + 1000, C=C, N=1, K=K, E=E, bw_bytes=1e9, alpha=1e-5)
    more_c = S.predict(CAL, P=P, B=B, C=C + 1000, N=1, K=K, E=E, bw_bytes=1e9, alpha=1e-5)
    # a gradient and E losses per iteration over the batch, K products over the curvature rows
    assert more_b["compute_s"] - one["compute_s"] == pytest.approx(1000 * (2e-6 + E * 1e-6))
    assert more_c["compute_s"] - one["compute_s"] == pytest.approx(1000 * K * 3e-6)


@pytest.mark.parametrize("N", [2, 4, 16])
def test_the_rows_split_over_the_nodes_and_the_fixed_costs_do_not(N):
    fixed = 0.01 + K * 0.002 + E * 0.001  # what a call costs whatever its rows
    assert _p(N)["compute_s"] - fixed == pytest.approx((_p(1)["compute_s"] - fixed) / N)


@pytest.mark.parametrize("N", [2, 3, 8])
def test_ring_all_reduces_send_2_n_minus_1_over_n_of_each_message_and_wait_2_n_minus_1_latencies(N):
    # bandwidth alone (1 byte/s, no latency): the bytes a rank sends, 1 + K messages of P floats
    # and E of one float
    sent = _p(N, bw=1.0, alpha=0.0)["comm_s"]
    assert sent == pytest.approx(2 * (N - 1) / N * ((1 + K) * 4 * P + E * 4))
    # latency alone: every all-reduce, each 2 (N - 1) steps
    waited = _p(N, bw=float("inf"), alpha=1.0)["comm_s"]
    assert waited == pytest.approx((1 + K + E) * 2 * (N - 1))
    both = _p(N, bw=1.0, alpha=1.0)["comm_s"]
    assert both == pytest.approx(sent + waited)
