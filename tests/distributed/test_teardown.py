"""Leaving the process group (2 gloo ranks, the real launcher): the safe teardown order never
hangs, and a rank that does not exit is ended within its deadline and named."""

import time

import pytest

from recscale.distributed import (
    LaunchConfig,
    RankExitTimeoutError,
    WorkerFailedError,
    launch,
)
from tests.distributed import teardown_workers as TW

pytestmark = pytest.mark.dist

EXIT_S = 3.0


def test_the_safe_teardown_order_never_hangs():
    """The order that hung benchmarks/bench_sharded.py (a DDP model, steps, a barrier,
    destroy_process_group(), the model freed after it) done the safe way by run_in_group, on the
    sharded DLRM and on a plain DDP MLP, 2 launches x 10 groups each: every one of the 40 groups
    must finish (each launch is bounded by the exit watch). HANG_NOTE"""
    cfg = LaunchConfig(world_size=2, exit_timeout_s=30)
    for kind in ("dlrm", "mlp"):
        for _ in range(2):
            res = launch(TW.safe_teardown_worker, (kind, 3, 10), cfg)
            assert sorted(res) == [0, 1] and all(len(r) == 10 for r in res.values())


def test_a_rank_stuck_holding_the_gil_is_ended_and_named(tmp_path):
    cfg = LaunchConfig(world_size=2, exit_timeout_s=EXIT_S)
    with pytest.raises(RankExitTimeoutError) as err:
        launch(TW.stuck_worker, ("inside", str(tmp_path)), cfg)
    failed_after = time.time() - float((tmp_path / "returned.rank1").read_text())
    msg = str(err.value)
    assert err.value.ranks == (0,)
    assert msg.startswith("rank 0 did not exit within 3 s after rank 1 returned: it was still "
                          "inside stuck_worker"), msg
    assert "_hold_the_gil_forever" in msg  # where it was: its Python stack
    assert failed_after < EXIT_S + 10, failed_after


def test_an_ended_rank_is_not_restarted_by_the_elastic_agent(tmp_path):
    cfg = LaunchConfig(world_size=2, exit_timeout_s=EXIT_S, max_restarts=2)
    t0 = time.perf_counter()
    with pytest.raises(RankExitTimeoutError, match=r"^rank 0 did not exit within 3 s"):
        launch(TW.stuck_worker, ("inside", str(tmp_path)), cfg)
    # the restarted workers found the launch ended and failed at once: the job ran once
    assert len((tmp_path / "entered.rank0").read_text().split()) == 1
    assert len((tmp_path / "entered.rank1").read_text().split()) == 1
    assert time.perf_counter() - t0 < 120


def test_a_rank_stuck_in_its_exit_after_returning_is_ended_and_named(tmp_path):
    cfg = LaunchConfig(world_size=2, exit_timeout_s=EXIT_S)
    with pytest.raises(RankExitTimeoutError,
                       match=r"^rank 0 did not exit within 3 s after (it|rank 1) returned: it had "
                             r"returned from stuck_worker but did not exit") as err:
        launch(TW.stuck_worker, ("exit", str(tmp_path)), cfg)
    assert err.value.ranks == (0,)


def test_a_ddp_model_that_outlives_its_work_fails_the_worker_instead_of_risking_the_hang():
    cfg = LaunchConfig(world_size=2, exit_timeout_s=10)
    with pytest.raises(WorkerFailedError, match=r"WorkerTeardownError: rank \d: 1 "
                       r"DistributedDataParallel model\(s\) still alive after _leaky returned"):
        launch(TW.leaky_worker, (), cfg)
