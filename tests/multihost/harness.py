"""What the namespace-host job tests share (test_jobs.py, test_host_loss.py,
test_kedro_cluster.py): the configs, the driver's and `recscale join`'s commands, waiting on them
with deadlines, and comparing what they trained."""

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import PROJECT_ROOT

PORT = 29400
SMALL = {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}


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


def config(endpoint, world, nnodes, ckpt, strategy="balanced", **train):
    """A job's blocks; ``strategy``: the planner's (greedy where the plan is not what a test is
    about: the balanced search of 6 ranks takes 17 s of CPU)."""
    launch = {"world_size": world, "nnodes": nnodes, "rdzv_endpoint": endpoint,
              "collective_timeout_s": 60, "rdzv_timeout_s": 60, "last_call_s": 1,
              "heartbeat_s": 1, "exit_timeout_s": 30, **train.pop("launch", {})}
    return {"sharding": {"local_world_size": 2, "options": {"strategy": strategy}},
            "model": SMALL,
            "train": {"batch_size_per_rank": 250, "progress": "off", "log_every": 5,
                      "launch": launch,
                      "checkpoint": {"dir": str(ckpt), "every_steps": 3, "keep_last": 100,
                                     **train.pop("checkpoint", {})}, **train}}


def drive_cmd(tmp, name, dataset, cfg, plan="planner", start_when=None):
    """The driver's command; ``start_when``: a file it waits for once imported (it prints
    "waiting for" then: see ``ready``)."""
    # the plans of the drivers, beside their (session's) dataset: a plan the planner made once is
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
    uninterrupted run that switched world size at that checkpoint. Its tables are placed by the
    greedy baseline (every table whole on a rank, as the job's plans place these small tables;
    the two runs are compared within a tolerance)."""
    path = next(ckpt.glob(f"*/step-{step:08d}"))
    cfg = config("127.0.0.1:0", world, 1, tmp / f"ck-{name}", strategy="greedy", epochs=epochs,
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
