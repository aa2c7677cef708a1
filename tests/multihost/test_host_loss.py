"""Losing a namespace host or the driver mid-job, and a host coming back: the job shrinks,
grows, or stops with the command that resumes it, and ends as the run that switched at that
checkpoint (the harness: tests/multihost/harness.py)."""

import random
import time

import pytest

from tests.conftest import PROJECT_ROOT
from tests.multihost.harness import (
    KW,
    PORT,
    _env,
    config,
    events,
    join_when_cmd,
    lose_host_2,
    progress_step,
    result,
    resume_reference,
    run_job,
    same_state,
    start_job,
    train_rows,
    wait,
    wait_for,
)

pytestmark = pytest.mark.multihost


def test_losing_a_host_shrinks_the_job_which_finishes_equal_to_a_run_switched_at_that_checkpoint(
        netns_hosts, dataset, tmp_path, seed):
    kill_at = random.Random(seed).randint(4, 10)
    hosts, ep, ckpt, driver, joiners, said = lose_host_2(netns_hosts, dataset, tmp_path, 2,
                                                         kill_at)
    rc, out = wait(driver, "the driver", before=said)
    assert rc == 0, out[-6000:]
    assert wait(joiners[0], "host 1")[0] == 0
    r = result(tmp_path / "job")
    worlds = [t["world_size"] for t in r["transitions"]]
    assert worlds == [6, 4], r["transitions"]
    shrink = r["transitions"][1]
    assert shrink["replanned"] and shrink["previous_world_size"] == 6
    assert shrink["start_step"] % 3 == 0 and shrink["start_step"] <= kill_at + 3
    # the rows replayed are the steps the lost attempt took after the checkpoint it resumes from
    # (one every 3 steps) times its global batch (6 ranks x 250): a whole number of steps, at
    # most 3 (a host lost while its last step's checkpoint is written leaves the one before),
    # ending at or after the step the host was lost at
    steps_replayed, part = divmod(shrink["rows_replayed"], 6 * 250)
    assert part == 0 and 0 <= steps_replayed <= 3, shrink
    assert shrink["start_step"] + steps_replayed >= kill_at, shrink
    assert r["samples"] == 2 * train_rows(dataset)  # every row once per epoch, none twice
    assert r["extra"]["resharded_from"] == 6
    ref = resume_reference(tmp_path, "ref", dataset, ckpt, shrink["start_step"], 4, epochs=2)
    same_state(tmp_path / "job", ref, rtol=1e-5)


def test_a_returning_host_is_taken_back_at_the_next_restart_and_the_job_grows(
        netns_hosts, dataset, tmp_path):
    hosts, ep, ckpt, driver, joiners, said = lose_host_2(netns_hosts, dataset, tmp_path, 3, 4)
    # host 2 comes back: `recscale join` again, started once the others went on without it
    trigger = tmp_path / "host2-back"
    back = hosts[2].popen(join_when_cmd(trigger, ep), env=_env(), cwd=PROJECT_ROOT, **KW)
    wait_for(lambda: len(events(ckpt)) >= 2, "the shrink")
    trigger.touch()
    rc, out = wait(driver, "the driver", before=said)
    assert rc == 0, out[-6000:]
    assert wait(joiners[0], "host 1")[0] == 0
    assert wait(back, "host 2, back")[0] == 0
    r = result(tmp_path / "job")
    worlds = [t["world_size"] for t in r["transitions"]]
    assert worlds == [6, 4, 6], r["transitions"]
    grow = r["transitions"][2]
    assert grow["replanned"] is False and grow["previous_world_size"] == 4
    assert r["samples"] == 3 * train_rows(dataset)
    ref = resume_reference(tmp_path, "ref", dataset, ckpt, grow["start_step"], 6, epochs=3)
    same_state(tmp_path / "job", ref, rtol=1e-5)


def test_losing_the_driver_ends_the_job_clearly_and_rerunning_it_resumes_from_the_checkpoint(
        netns_hosts, dataset, tmp_path):
    hosts = netns_hosts(2)
    ep = f"{hosts[0].addr}:{PORT}"
    ckpt = tmp_path / "ck"
    cfg = config(ep, 4, 2, ckpt, epochs=2, checkpoint={"resume": "latest"})
    driver, joiners, _ = start_job(hosts, tmp_path, "first", dataset, cfg)
    wait_for(lambda: progress_step(ckpt) >= 5, "step 5")
    t0 = time.monotonic()
    hosts.kill_host(0)
    jrc, jout = wait(joiners[0], "host 1 after the driver was lost", timeout=90)
    assert jrc == 1, jout[-3000:]
    assert "Rerun the driver's command" in jout and ep in jout, jout[-3000:]
    assert time.monotonic() - t0 < 60
    saved = sorted(int(p.name.split("-")[1]) for p in ckpt.glob("*/step-*")
                   if not p.name.endswith(".tmp"))  # a write the loss cut short
    assert saved, "no checkpoint before the driver was lost"
    second = run_job(hosts, tmp_path, "second", dataset, cfg)
    r = result(second)
    first = r["transitions"][0]
    assert first["resumed_from"] and first["start_step"] == saved[-1], (first, saved)
    rows = train_rows(dataset)
    assert r["steps"] == 2 * -(-rows // 1000) and r["samples"] == 2 * rows  # 2 epochs, 4 x 250


