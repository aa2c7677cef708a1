"""Jobs across network-namespace hosts, started the way a user starts them: the driver trains as
the Kedro node does (tests/multihost/jobs.py drive), every other host runs `recscale join`.
Losing a host or the driver: test_host_loss.py."""

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT
from tests.multihost.harness import (
    KW,
    PORT,
    SPLIT,
    WAITING,
    _env,
    config,
    drive_cmd,
    join_cmd,
    join_when_cmd,
    outputs,
    ready,
    result,
    run_job,
    run_single,
    same_state,
    wait,
)

pytestmark = pytest.mark.multihost


@pytest.mark.parametrize("n", [2, 3])
def test_hosts_train_bitwise_what_one_host_trains_with_every_sharding_type(
        netns_hosts, dataset, tmp_path, n):
    hosts = netns_hosts(n)
    ep = f"{hosts[0].addr}:{PORT}"
    # the hand-made plan ("mixed") keeps only the planner's tables and ranks: the baseline plans
    cfg = config(ep, 2 * n, n, tmp_path / "ck-multi", strategy="greedy", max_steps=8)
    # the joining host runs from a directory whose local config says something else: unused
    other = tmp_path / "other-project"
    (other / "conf" / "base").mkdir(parents=True)
    (other / "conf" / "base" / "parameters_dlrm.yml").write_text(
        "train:\n  batch_size_per_rank: 7\n  launch:\n    world_size: 1\n")
    multi = run_job(hosts, tmp_path, "multi", dataset, cfg, plan="mixed", joiner_cwd=other)
    single_cfg = config("127.0.0.1:0", 2 * n, 1, tmp_path / "ck-single", strategy="greedy",
                        max_steps=8)
    single = run_single(tmp_path, "single", dataset, single_cfg, plan="mixed")
    same_state(multi, single)
    r = result(multi)
    assert r["steps"] == 8 and r["samples"] == 8 * 2 * n * 250
    assert [t["world_size"] for t in r["transitions"]] == [2 * n]


def test_a_host_with_other_code_is_refused_naming_both_versions_and_the_driver_stops_waiting(
        netns_hosts, dataset, tmp_path):
    hosts = netns_hosts(2)
    ep = f"{hosts[0].addr}:{PORT}"
    other_src = tmp_path / "other-src"
    shutil.copytree(PROJECT_ROOT / "src" / "recscale", other_src / "recscale",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(other_src / "recscale" / "train" / "loop.py", "a") as fh:
        fh.write("\n# a local change\n")
    # the driver goes on from its imports once the joining host waits for it (which then reads
    # the job within its 0.2 s poll of the store opening), so its rendezvous deadline can be short
    cfg = config(ep, 4, 2, tmp_path / "ck", max_steps=4, launch={"rdzv_timeout_s": 4})
    go = tmp_path / "driver-go"
    driver = hosts[0].popen(drive_cmd(tmp_path, "job", dataset, cfg, start_when=go), env=_env(),
                            cwd=PROJECT_ROOT, **KW)
    joiner = hosts[1].popen(join_cmd(ep), cwd=PROJECT_ROOT, **KW, env=_env(
        PYTHONPATH=os.pathsep.join([str(other_src), str(PROJECT_ROOT)])))
    said = ready(joiner, WAITING, "the joining host")
    dsaid = ready(driver, f"waiting for {go}", "the driver")
    go.touch()
    jrc, jout = wait(joiner, "the joining host", timeout=60, before=said)
    assert jrc == 2, jout[-3000:]
    from recscale.distributed.job_store import code_version

    mine = code_version()
    assert f"runs recscale {mine}" in jout and "but the driver" in jout, jout[-2000:]
    theirs = jout.split("this host runs recscale ")[1].split()[0]
    assert theirs != mine
    t0 = time.monotonic()
    rc, out = wait(driver, "the driver", timeout=60, before=dsaid)
    assert rc != 0 and time.monotonic() - t0 < 40
    assert "host(s) joined the rendezvous at" in out, out[-3000:]


def test_an_unreachable_driver_is_a_clear_error_within_the_timeout(netns_hosts):
    hosts = netns_hosts(2)
    t0 = time.monotonic()
    res = hosts[1].run(join_cmd(f"{hosts[0].addr}:{PORT}", timeout=3), env=_env(),
                       cwd=PROJECT_ROOT, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"the driver at {hosts[0].addr}:{PORT} did not answer within 3 s" in res.stderr
    assert time.monotonic() - t0 < 30


def test_a_host_that_cannot_see_the_data_fails_naming_the_path(netns_hosts, dataset, tmp_path):
    hosts = netns_hosts(2)
    ep = f"{hosts[0].addr}:{PORT}"
    cfg = config(ep, 4, 2, tmp_path / "ck", max_steps=4, launch={"rdzv_timeout_s": 4})
    go = tmp_path / "driver-go"  # the driver goes on once host 1 waits for it (as above)
    driver = hosts[0].popen(drive_cmd(tmp_path, "job", dataset, cfg, start_when=go), env=_env(),
                            cwd=PROJECT_ROOT, **KW)
    # host 1 has its own mount namespace in which the data directory is an empty file system
    hidden = " ".join(join_cmd(ep))
    joiner = hosts[1].popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             f"mount -t tmpfs none {dataset} && exec {hidden}"],
                            env=_env(), cwd=PROJECT_ROOT, **KW)
    said = ready(joiner, WAITING, "host 1")
    dsaid = ready(driver, f"waiting for {go}", "the driver")
    go.touch()
    jrc, jout = wait(joiner, "host 1", timeout=120, before=said)
    rc, out = wait(driver, "the driver", timeout=120, before=dsaid)
    assert jrc == 2 and rc != 0
    assert "host(s) joined the rendezvous" in out, out[-3000:]
    assert f"this host cannot read {dataset}/" in jout and "every host must see the data" in jout, \
        jout[-3000:]


def test_host_bound_types_move_fewer_inter_host_bytes_than_flat_ones_as_the_planner_estimates(
        netns_hosts, dataset, tmp_path):
    from recscale.report import bytes_against_plan
    from recscale.sharding import ShardingPlan

    hosts = netns_hosts(2)
    ep = f"{hosts[0].addr}:{PORT}"
    got = {}
    for name, kinds in (("flat", "row_wise,column_wise"),
                        ("hier", "table_row_wise,table_column_wise")):
        cfg = config(ep, 4, 2, tmp_path / f"ck-{name}", max_steps=4)
        out = run_job(hosts, tmp_path, name, dataset, cfg, plan=f"kinds:{kinds}")
        extra = result(out)["extra"]
        vs = bytes_against_plan(extra, ShardingPlan.load(out / "plan.json"))
        for side in ("intra_host", "inter_host"):
            ratio = vs[f"bytes_per_step.embedding.{side}.measured_over_estimate"]
            assert 0.95 <= ratio <= 1.05, (name, side, vs, extra)
        got[name] = extra["bytes_per_step.embedding.inter_host"]
    assert got["hier"] < 0.5 * got["flat"], got  # the same tables, half or less across hosts


def test_hosts_without_the_jobs_secret_or_with_another_are_refused_and_the_job_trains_without_them(
        netns_hosts, dataset, tmp_path):
    """Host 2 joins without the secret, then with another: each refused within its deadline,
    the reason named, having written nothing; the job trains with the hosts that hold it."""
    hosts = netns_hosts(3)
    ep = f"{hosts[0].addr}:{PORT}"
    cfg = config(ep, 4, 2, tmp_path / "ck", max_steps=4, launch={"rdzv_timeout_s": 60})
    # host 1 holds the secret; it starts now (its imports beside the others') and joins once
    # both of host 2's attempts were refused
    trigger = tmp_path / "host1-go"
    joiner = hosts[1].popen(join_when_cmd(trigger, ep), env=_env(), cwd=PROJECT_ROOT, **KW)
    driver = hosts[0].popen(drive_cmd(tmp_path, "job", dataset, cfg), env=_env(),
                            cwd=PROJECT_ROOT, **KW)
    stranger = tmp_path / "stranger"  # host 2's working directory: it must stay empty
    stranger.mkdir()
    # host 2's two attempts at once (each its own `recscale join`, neither needs the other)
    attempts = [(time.monotonic(), why, hosts[2].popen(join_cmd(ep, timeout=60), env=env,
                                                       cwd=stranger, **SPLIT))
                for env, why in ((_env(RECSCALE_JOB_SECRET=None), "this host has no secret for "
                                  "the job: pass --secret-file"),
                                 (_env(RECSCALE_JOB_SECRET="not-the-jobs"), "this host's secret "
                                  "is not the driver's"))]
    for t0, why, attempt in attempts:
        arc, aout, aerr = outputs(attempt, "host 2", timeout=90)
        assert arc == 2, aout + aerr
        assert why in aerr, aerr[-2000:]
        assert time.monotonic() - t0 < 60
    trigger.touch()
    rc, out = wait(driver, "the driver")
    assert rc == 0, out[-6000:]
    assert wait(joiner, "host 1")[0] == 0
    assert result(tmp_path / "job")["steps"] == 4
    assert not list(stranger.iterdir()), "a refused host wrote into its working directory"


# waits for the driver's store (polling as `recscale join` does: TCPStore's own connect retries
# back off to seconds apart), then rewrites the job it published
REWRITE = """
import json, socket, sys, time
from datetime import timedelta
import torch.distributed as dist
host, port = sys.argv[1].rsplit(":", 1)
print("waiting for the store", flush=True)
deadline = time.monotonic() + 60
while True:
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
job = json.loads(store.get("recscale/job"))  # waits for the driver to publish it
job["spec"]["payload"]["out_dir"] = "/etc/recscale"
store.set("recscale/job", json.dumps(job))
print("rewritten")
"""


def test_a_job_rewritten_in_the_store_by_a_third_host_is_refused_and_the_driver_names_the_missing_host(
        netns_hosts, dataset, tmp_path):
    """Host 2 reaches the driver's store and rewrites the job after it was published: host 1,
    which holds the secret, refuses it naming the alteration and writes nothing; the driver,
    short of a host, fails within its rendezvous deadline saying so (it never hangs)."""
    hosts = netns_hosts(3)
    ep = f"{hosts[0].addr}:{PORT}"
    ckpt = tmp_path / "ck"
    # host 2 and host 1 (the latter told to join once the job was rewritten) are imported and
    # waiting before the driver goes on from its imports: the rewrite and host 1's refusal
    # follow the store's opening within a second, so the driver's rendezvous deadline can be short
    cfg = config(ep, 4, 2, ckpt, max_steps=4, launch={"rdzv_timeout_s": 5})
    here = tmp_path / "host1"
    here.mkdir()
    trigger, go = tmp_path / "host1-go", tmp_path / "driver-go"
    driver = hosts[0].popen(drive_cmd(tmp_path, "job", dataset, cfg, start_when=go), env=_env(),
                            cwd=PROJECT_ROOT, **KW)
    host1 = hosts[1].popen(join_when_cmd(trigger, ep), env=_env(), cwd=here, **SPLIT)
    rewrite = hosts[2].popen([sys.executable, "-c", REWRITE, ep],
                             env=_env(RECSCALE_JOB_SECRET=None), cwd=PROJECT_ROOT, **SPLIT)
    said1 = ready(host1, f"waiting for {trigger}", "host 1")
    said2 = ready(rewrite, "waiting for the store", "host 2")
    dsaid = ready(driver, f"waiting for {go}", "the driver")
    go.touch()
    _, rout, rerr = outputs(rewrite, "host 2's rewrite", timeout=90, before=said2)
    assert "rewritten" in rout, rerr[-2000:]
    t0 = time.monotonic()
    trigger.touch()
    jrc, jout, jerr = outputs(host1, "host 1", timeout=90, before=said1)
    assert jrc == 2, jout + jerr
    assert f"the job at {ep} was altered after the driver signed it" in jerr, jerr[-2000:]
    assert time.monotonic() - t0 < 30
    assert not list(here.iterdir()) and not Path("/etc/recscale").exists()
    t0 = time.monotonic()
    rc, out = wait(driver, "the driver", timeout=120, before=dsaid)
    assert rc != 0 and time.monotonic() - t0 < 60
    assert "fewer than 2 host(s) joined the rendezvous at" in out, out[-3000:]
    assert not list(ckpt.glob("*/step-*")), "a checkpoint was written"
