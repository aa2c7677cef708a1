"""Leaving the process group (2 gloo ranks, the real launcher): the safe teardown order never
hangs, and a rank that does not exit is ended within its deadline and named."""

import os
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


def test_the_safe_teardown_order_never_hangs(tmp_path):
    """The order that hung benchmarks/bench_sharded.py (DDP with a Python comm hook, steps, a
    barrier, destroy_process_group(), the model freed after it), done the safe way by
    run_in_group: 2 ranks x 60 groups joined and left, both ranks on one CPU (the affinity the
    spawned ranks inherit), so each one's gloo thread waits for the core behind the other rank:
    what makes it late. Each group is bounded (20 s, then the rank's stacks are dumped and it
    exits); all 60 must finish on both ranks. The unsafe order under the same conditions hung in
    every one of 3 launches of 60 groups (1 hang per 7 groups): ``python
    benchmarks/repro_teardown_hang.py --tries 3 --stress 0 --pin 0 --start-method spawn``
    (unpinned, beside 2 busy-loop processes, 1 per 35 groups: ``--stress 2``). Spawned workers,
    as measured there: forked from the fork server (the launcher's default) the unsafe order
    hangs too, but less often."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(cpus)})
    res, error = None, None
    try:
        res = launch(TW.safe_teardown_worker, ("mlp", 4, 60, str(tmp_path), 20.0),
                     LaunchConfig(world_size=2, exit_timeout_s=30, start_method="spawn"))
    except Exception as exc:  # noqa: BLE001 - reported below with the hung rank's stacks
        error = exc
    finally:
        os.sched_setaffinity(0, cpus)
    hung = {f.name: f.read_text() for f in tmp_path.glob("hang.rank*.txt") if f.read_text()}
    assert not hung and error is None, (error, hung)
    assert sorted(res) == [0, 1] and all(len(r) == 60 for r in res.values())


def test_a_rank_stuck_holding_the_gil_is_ended_named_and_not_restarted(tmp_path):
    """Ended within the deadline, named with where it was; and although the elastic agent may
    restart the group (max_restarts=2), the restarted workers find the launch ended and fail at
    once: the job ran once."""
    cfg = LaunchConfig(world_size=2, exit_timeout_s=EXIT_S, max_restarts=2)
    with pytest.raises(RankExitTimeoutError) as err:
        launch(TW.stuck_worker, ("inside", str(tmp_path)), cfg)
    failed_after = time.time() - float((tmp_path / "returned.rank1").read_text())
    msg = str(err.value)
    assert err.value.ranks == (0,)
    assert msg.startswith("rank 0 did not exit within 3 s after rank 1 returned: it was still "
                          "inside stuck_worker"), msg
    assert "_hold_the_gil_forever" in msg  # where it was: its Python stack
    assert failed_after < EXIT_S + 15, failed_after
    assert len((tmp_path / "entered.rank0").read_text().split()) == 1
    assert len((tmp_path / "entered.rank1").read_text().split()) == 1


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
