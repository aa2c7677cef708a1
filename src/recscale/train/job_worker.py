"""Sharded DLRM training as a job across hosts: what the driver publishes, what every worker runs.

The driver (``train_dlrm`` with ``train.launch.nnodes`` > 1 or a range) publishes the job in its
rendezvous store (``recscale.distributed.job_store``): the run's config blocks, the data manifest with
absolute paths, the sharding plan, where the model and the events go, and its code version. Every
worker, on the driver's host and on the others (``recscale join``), runs :func:`job_worker`:

1. reads the job from the store (never a local config), and checks that it can read every data
   file of the manifest, naming the first one it cannot;
2. takes the world size the rendezvous gave: when hosts were lost (``nnodes: min:max``) or came
   back, it differs from the plan's, and the worker replans for it on the same topology preset
   (the planner is deterministic, so every rank computes the same plan);
3. trains through the one loop, resuming from the job's last checkpoint (resharded onto the new
   plan when the world size changed);
4. rank 0 appends one line per attempt to ``events.jsonl`` in the job's output directory (world
   size, replanned or not, the step it resumed from, rows replayed since that checkpoint), which
   the driver reads back for the run's record.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

from recscale.config import ConfigError, parse, to_dict
from recscale.distributed import run_in_group, worker_entry
from recscale.distributed.job_secret import JobSecretError, check_paths, host_secret
from recscale.distributed.job_store import JobError, fetch_job
from recscale.runconfig import DLRMConfig, plan_for_run
from recscale.sharding import ShardingPlan
from recscale.train.rank import train_rank

log = logging.getLogger(__name__)

EVENTS = "events.jsonl"
PROGRESS = "progress.json"
WORKER_FETCH_TIMEOUT_S = 60.0  # the store is up by then: the worker's agent met the others there


def job_payload(manifest: dict, cfg: DLRMConfig, plan: ShardingPlan, out_dir: str) -> dict:
    """What the driver publishes: every path absolute (the other hosts run elsewhere), and the
    roots those paths must lie under (``job_paths``), which every host checks."""
    m = json.loads(json.dumps(manifest))
    for split in m.get("splits", {}).values():
        split["files"] = [os.path.abspath(f) for f in split["files"]]
    cfg_d = to_dict(cfg)
    for key in ("optimizer", "comms"):  # the run's own, filled in by plan_for_run
        cfg_d["sharding"]["options"].pop(key, None)
    ck = cfg_d["train"]["checkpoint"]
    ck["dir"] = os.path.abspath(ck["dir"]) if ck.get("dir") else None
    if ck.get("init_from"):
        ck["init_from"] = os.path.abspath(ck["init_from"])
    resume = ck.get("resume") or ""
    if os.sep in resume or resume.startswith("step-"):  # a step directory, as Checkpointer finds it
        ck["resume"] = os.path.abspath(resume if os.path.isabs(resume) or os.path.exists(resume)
                                       else os.path.join(ck["dir"] or "", resume))
    tiers = cfg_d["train"]["tiers"]
    if tiers.get("scratch_dir"):
        tiers["scratch_dir"] = os.path.abspath(tiers["scratch_dir"])
    payload = {"manifest": m, "config": cfg_d, "plan": plan.to_dict(),
               "out_dir": os.path.abspath(out_dir)}
    files = [f for split in m["splits"].values() for f in split["files"]]
    roots = {"data": os.path.commonpath(files) if files else payload["out_dir"],
             "output": payload["out_dir"]}
    if len(files) == 1:  # one file: its folder is the root
        roots["data"] = os.path.dirname(files[0])
    if ck["dir"]:
        roots["checkpoints"] = ck["dir"]
    if ck.get("init_from"):
        roots["init"] = os.path.dirname(ck["init_from"])
    if os.path.isabs(ck.get("resume") or ""):
        roots["resume"] = os.path.dirname(ck["resume"])
    if tiers.get("scratch_dir"):
        roots["scratch"] = tiers["scratch_dir"]
    return {**payload, "roots": roots}


def job_paths(payload: dict) -> dict[str, list[str]]:
    """Every path a host of the job reads or writes, by the root it must lie under."""
    ck = payload["config"]["train"]["checkpoint"]
    paths = {"data": [f for s in payload["manifest"]["splits"].values() for f in s["files"]],
             "output": [payload["out_dir"]]}
    if ck.get("dir"):
        paths["checkpoints"] = [ck["dir"]]
    if os.path.isabs(ck.get("resume") or ""):
        paths["resume"] = [ck["resume"]]
    if ck.get("init_from"):
        paths["init"] = [ck["init_from"]]
    scratch = payload["config"]["train"]["tiers"].get("scratch_dir")
    if scratch:
        paths["scratch"] = [scratch]
    return paths


def check_job_paths(spec: dict) -> None:
    """A verified job's paths: absolute, normalised, under the roots its driver declared, none a
    system directory; else ``JobError`` naming the path."""
    payload = spec["payload"]
    try:
        check_paths(payload.get("roots") or {}, job_paths(payload))
    except JobSecretError as exc:
        raise JobError(str(exc)) from None


def with_world_size(cfg: DLRMConfig, world_size: int) -> DLRMConfig:
    """``cfg`` for a job running on ``world_size`` ranks (hosts lost or regained)."""
    launch = cfg.train.launch
    per_host = launch.nproc_per_node
    hosts = world_size // per_host
    launch = dataclasses.replace(launch, world_size=world_size, nnodes=hosts)
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, launch=launch))


def check_data_readable(manifest: dict, where: str) -> None:
    for name, split in manifest["splits"].items():
        for f in split["files"]:
            if not os.access(f, os.R_OK):
                raise JobError(f"{where} cannot read {f} ({name} split of the job's data "
                               "manifest): every host must see the data at the same path "
                               "(a shared filesystem)")


def check_job_here(spec: dict) -> None:
    """What a joining host checks before it joins: the job's paths lie where its driver said,
    and it can read the job's data."""
    check_job_paths(spec)
    check_data_readable(spec["payload"]["manifest"], "this host")


class _Progress:
    """Rank 0's record of the attempt: the events line at its first step, the furthest step
    after every step (what the next attempt replays from its checkpoint)."""

    def __init__(self, out_dir: str, rank: int, world_size: int, replanned: bool):
        self.out_dir, self.rank = out_dir, rank
        self.world_size, self.replanned = world_size, replanned
        self.started = False
        self.previous = _read_json(os.path.join(out_dir, PROGRESS)) if rank == 0 else None

    def __call__(self, res, global_batch: int) -> None:
        if self.rank != 0:
            return
        if not self.started:
            self.started = True
            start_step, start_samples = res.steps - 1, res.global_samples - global_batch
            prev = self.previous
            replayed = max(0, prev["global_samples"] - start_samples) if prev else 0
            event = {"time": time.time(), "world_size": self.world_size,
                     "replanned": self.replanned, "start_step": start_step,
                     "resumed_from": res.resumed_from, "rows_replayed": replayed,
                     "previous_world_size": prev["world_size"] if prev else None}
            with open(os.path.join(self.out_dir, EVENTS), "a") as fh:
                fh.write(json.dumps(event) + "\n")
            if prev and prev["world_size"] != self.world_size:
                log.warning("job continues on %d ranks (was %d) from step %d; %d rows since "
                            "that checkpoint are trained again", self.world_size,
                            prev["world_size"], start_step, replayed)
        _write_json(os.path.join(self.out_dir, PROGRESS),
                    {"step": res.steps, "global_samples": res.global_samples,
                     "world_size": self.world_size})


def read_events(out_dir: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(out_dir, EVENTS)) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _write_json(path: str, obj: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


@record
@worker_entry
def job_worker(endpoint: str) -> dict[str, Any]:
    """Entry point of every worker of a job across hosts (see the module docstring)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        secret = host_secret(None)  # the launch's environment: the driver's or join's
    except JobSecretError as exc:
        raise JobError(str(exc)) from None
    spec = fetch_job(endpoint, WORKER_FETCH_TIMEOUT_S, secret)
    check_job_paths(spec)
    job = spec["payload"]
    manifest = job["manifest"]
    check_data_readable(manifest, f"rank {rank} (host {os.environ.get('GROUP_RANK', '?')})")
    cfg = parse(DLRMConfig, job["config"], "")
    plan = ShardingPlan.from_dict(job["plan"])
    replanned = plan.world_size != world
    if replanned:
        if world % cfg.train.launch.nproc_per_node:
            raise ConfigError(f"the job has {world} ranks, not a multiple of "
                              f"{cfg.train.launch.nproc_per_node} per host")
        cfg = with_world_size(cfg, world)
        plan = plan_for_run(manifest, cfg)
        if rank == 0:
            log.warning("replanned for %d ranks (the job's plan was for %d)", world,
                        ShardingPlan.from_dict(job["plan"]).world_size)
    progress = _Progress(job["out_dir"], rank, world, replanned)
    return run_in_group(cfg.train.launch, train_rank, manifest, cfg.model, cfg.train, cfg.comms,
                        plan, job["out_dir"], spec["run_id"], on_step=progress,
                        device=cfg.train.device)

