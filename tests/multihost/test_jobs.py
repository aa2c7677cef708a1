"""Jobs across network-namespace hosts, started the way a user starts them: the driver trains as
the Kedro node does (tests/multihost/jobs.py drive), every other host runs `recscale join`."""

import json
import os
import random
import selectors
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.multihost

PORT = 29400
SMALL = {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from tests.multihost.jobs import make_dataset

    return make_dataset(tmp_path_factory.mktemp("mh-data"))


# the job's secret every host of these tests holds (the driver and `recscale join` read it from
# the environment); tests of a host without it, or with another, take it out or change it
SECRET = "f0e1d2c3" * 8


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PROJECT_ROOT / "src"),
                                                       str(PROJECT_ROOT)]),
               DO_NOT_TRACK="true", KEDRO_DISABLE_TELEMETRY="true",
               MLFLOW_DISABLE_TELEMETRY="true", PYTHONUNBUFFERED="1",
               RECSCALE_JOB_SECRET=SECRET,
               # another test's MLflow store, exported by mlflow.set_*_uri: the project's own
               MLFLOW_TRACKING_URI=None, MLFLOW_REGISTRY_URI=None)
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def config(endpoint, world, nnodes, ckpt, **train):
    launch = {"world_size": world, "nnodes": nnodes, "rdzv_endpoint": endpoint,
              "collective_timeout_s": 60, "rdzv_timeout_s": 60, "last_call_s": 1,
              "heartbeat_s": 1, "exit_timeout_s": 30, **train.pop("launch", {})}
    return {"sharding": {"local_world_size": 2},
            "model": SMALL,
            "train": {"batch_size_per_rank": 250, "progress": "off", "log_every": 5,
                      "launch": launch,
                      "checkpoint": {"dir": str(ckpt), "every_steps": 3, "keep_last": 100,
                                     **train.pop("checkpoint", {})}, **train}}


def drive_cmd(tmp, name, dataset, cfg, plan="planner", start_when=None):
    """The driver's command; ``start_when``: a file it waits for once imported (it prints
    "waiting for" then: see ``ready``)."""
    # the plans of this module's drivers, beside its dataset: a plan the planner made once is
    # read back by every later driver given the same tables, ranks and options (jobs.py)
    spec = tmp / f"{name}.json"
    spec.write_text(json.dumps({"manifest_dir": str(dataset), "config": cfg, "plan": plan,
                                "plan_cache": str(Path(dataset).parent / "plans"),
                                "start_when": start_when and str(start_when)}))
    return [sys.executable, "-m", "tests.multihost.jobs", "drive", str(spec), str(tmp / name)]


def join_cmd(endpoint, timeout=60):
    return [sys.executable, "-m", "recscale", "join", "--endpoint", endpoint, "--timeout",
            str(timeout)]


def wait(proc, who, timeout=180, before=""):
    """``proc``'s exit status and output (``before``: what ``ready`` read of it already)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"{who} did not finish within {timeout} s:\n{(before + out)[-4000:]}")
    return proc.returncode, before + out


KW = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
SPLIT = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # as Host.run captures


def outputs(proc, who, timeout, before=""):
    """A process started with SPLIT: its exit status, stdout (``before``: what ``ready`` read
    of it already) and stderr."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{who} did not finish within {timeout} s:\n{(before + out)[-2000:]}\n"
                    f"{err[-4000:]}")
    return proc.returncode, before + out, err


WAITING = "joining the job of the driver at"  # `recscale join`, imported, waits for the driver


def ready(proc, text, who, timeout=60):
    """Read ``proc``'s stdout (with its stderr under KW) until ``text`` shows, at most
    ``timeout`` s; -> what it printed so far (pass it to ``wait`` or ``outputs`` as ``before``).
    A joining host ready before the driver goes on from its imports reaches the driver's store
    within its 0.2 s poll of the store opening."""
    fd, got = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while text.encode() not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                proc.wait(timeout=10)
                pytest.fail(f"{who} did not print {text!r} within {timeout} s:\n"
                            f"{got.decode(errors='replace')[-4000:]}")
            if sel.select(min(left, 1.0)):
                chunk = os.read(fd, 1 << 16)
                if not chunk:  # it ended
                    proc.wait(timeout=10)
                    pytest.fail(f"{who} ended ({proc.returncode}) before printing {text!r}:\n"
                                f"{got.decode(errors='replace')[-4000:]}")
                got += chunk
    return got.decode(errors="replace")


def join_when_cmd(trigger, endpoint):
    """`recscale join --endpoint endpoint --timeout 60` (its join_main) once ``trigger`` exists,
    imported before: prints "waiting for" when ready (jobs.py join-when)."""
    return [sys.executable, "-m", "tests.multihost.jobs", "join-when", str(trigger), endpoint]


def start_job(hosts, tmp, name, dataset, cfg, plan="planner", joiner_cwd=None,
              joiners_first=False):
    """The driver on host 0, `recscale join` on the others. ``joiners_first``: all start at
    once, and the driver goes on from its imports once every joiner waits for it, so all reach
    its store within their 0.2 s poll of it opening (their start-up on a loaded 2-core machine
    can differ by seconds); -> (driver, joiners, what the driver printed before)."""
    ep = cfg["train"]["launch"]["rdzv_endpoint"]
    go = tmp / f"{name}-go" if joiners_first else None
    driver = hosts[0].popen(drive_cmd(tmp, name, dataset, cfg, plan, start_when=go),
                            env=_env(), cwd=PROJECT_ROOT, **KW)
    # joining first, a host waits for the driver's start-up too (its planning included)
    joiners = [h.popen(join_cmd(ep, timeout=120 if joiners_first else 60), env=_env(),
                       cwd=joiner_cwd or PROJECT_ROOT, **KW) for h in list(hosts)[1:]]
    said = ""
    if joiners_first:
        for i, j in enumerate(joiners, 1):
            ready(j, WAITING, f"host {i}")
        said = ready(driver, f"waiting for {go}", "the driver")
        go.touch()
    return driver, joiners, said


def run_job(hosts, tmp, name, dataset, cfg, plan="planner", joiner_cwd=None):
    """The driver on host 0, `recscale join` on every other host; -> the driver's output dir."""
    driver, joiners, _ = start_job(hosts, tmp, name, dataset, cfg, plan, joiner_cwd)
    rc, out = wait(driver, "the driver")
    assert rc == 0, out[-6000:]
    for i, j in enumerate(joiners, 1):
        jrc, jout = wait(j, f"host {i}")
        assert jrc == 0, jout[-4000:]
    return tmp / name


def run_single(tmp, name, dataset, cfg, plan="planner"):
    """The same job on one host (the root namespace), nnodes 1."""
    res = subprocess.run(drive_cmd(tmp, name, dataset, cfg, plan), env=_env(), cwd=PROJECT_ROOT,
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    return tmp / name


def same_state(a: Path, b: Path, rtol=0.0):
    sa = torch.load(a / "state.pt", weights_only=True)
    sb = torch.load(b / "state.pt", weights_only=True)
    assert sa.keys() == sb.keys()
    if rtol == 0.0:
        bad = [k for k in sa if not torch.equal(sa[k], sb[k])]
    else:
        bad = [k for k in sa if not torch.allclose(sa[k], sb[k], rtol=rtol, atol=1e-7)]
    assert not bad, f"differ: {bad[:5]}"


def train_rows(dataset) -> int:
    from recscale.data.loader import count_rows
    from recscale.data.preprocess import load_manifest

    return count_rows(load_manifest(dataset)["splits"]["train"]["files"])


def result(d: Path) -> dict:
    return json.loads((d / "result.json").read_text())


@pytest.mark.parametrize("n", [2, 3])
def test_hosts_train_bitwise_what_one_host_trains_with_every_sharding_type(
        netns_hosts, dataset, tmp_path, n):
    hosts = netns_hosts(n)
    ep = f"{hosts[0].addr}:{PORT}"
    cfg = config(ep, 2 * n, n, tmp_path / "ck-multi", max_steps=8)
    # the joining host runs from a directory whose local config says something else: unused
    other = tmp_path / "other-project"
    (other / "conf" / "base").mkdir(parents=True)
    (other / "conf" / "base" / "parameters_dlrm.yml").write_text(
        "train:\n  batch_size_per_rank: 7\n  launch:\n    world_size: 1\n")
    multi = run_job(hosts, tmp_path, "multi", dataset, cfg, plan="mixed", joiner_cwd=other)
    single_cfg = config("127.0.0.1:0", 2 * n, 1, tmp_path / "ck-single", max_steps=8)
    single = run_single(tmp_path, "single", dataset, single_cfg, plan="mixed")
    same_state(multi, single)
    r = result(multi)
    assert r["steps"] == 8 and r["samples"] == 8 * 2 * n * 250
    assert [t["world_size"] for t in r["transitions"]] == [2 * n]


def _job_file(ckpt: Path, name: str) -> Path | None:
    found = sorted(ckpt.glob(f"*/job/{name}"))
    return found[0] if found else None


def wait_for(pred, what, timeout=120, every=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    pytest.fail(f"{what} did not happen within {timeout} s")


def progress_step(ckpt):
    f = _job_file(ckpt, "progress.json")
    if f is None:
        return 0
    try:
        return json.loads(f.read_text())["step"]
    except (ValueError, KeyError):
        return 0


def events(ckpt):
    f = _job_file(ckpt, "events.jsonl")
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f else []


def resume_reference(tmp, name, dataset, ckpt, step, world, epochs):
    """One host, ``world`` ranks, resuming from the job's own checkpoint of ``step``: the
    uninterrupted run that switched world size at that checkpoint."""
    path = next(ckpt.glob(f"*/step-{step:08d}"))
    cfg = config("127.0.0.1:0", world, 1, tmp / f"ck-{name}", epochs=epochs,
                 checkpoint={"resume": str(path), "every_steps": 0})
    return run_single(tmp, name, dataset, cfg)


def lose_host_2(netns_hosts, dataset, tmp_path, epochs, kill_at):
    """A job on 3 hosts with nnodes 2:3 whose host 2 is SIGKILLed once step ``kill_at`` is done;
    -> (hosts, endpoint, checkpoint dir, driver, joiners, what the driver printed before)."""
    hosts = netns_hosts(3)
    ep = f"{hosts[0].addr}:{PORT}"
    ckpt = tmp_path / "ck"
    # the first round must hold all 3 hosts: the joiners wait for the driver before it starts,
    # so they reach its store within their 0.2 s poll of it opening and the rendezvous within
    # this of each other; a round of 3 closes as soon as the third joins, so only the round
    # after the loss waits this long (and a returning host's round, should an agent be slow)
    cfg = config(ep, 6, "2:3", ckpt, epochs=epochs,
                 launch={"max_restarts": 3, "last_call_s": 5})
    driver, joiners, said = start_job(hosts, tmp_path, "job", dataset, cfg, joiners_first=True)
    wait_for(lambda: progress_step(ckpt) >= kill_at, f"step {kill_at}")
    hosts.kill_host(2)
    return hosts, ep, ckpt, driver, joiners, said


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
