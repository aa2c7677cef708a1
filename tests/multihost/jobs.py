"""What the multi-host tests run inside the namespace hosts: a driver that trains exactly as the
Kedro training node does (``train_dlrm`` with the run's blocks), and the data and plans they use.

    python -m tests.multihost.jobs drive SPEC.json OUT_DIR

SPEC.json: {"manifest_dir", "config" (DLRMConfig blocks), "plan": "planner" | "mixed",
"plan_cache": a directory (optional), "start_when": a file (optional: once imported, the driver
prints "waiting for <file>" and goes on when the file exists)}; the driver writes
OUT_DIR/state.pt (the trained model), OUT_DIR/result.json (counters and the job's transitions).

The planner is deterministic (the same inputs give the same plan, on any machine) and a plan of
6 ranks takes it about 17 s of CPU here (its exact stage); with "plan_cache" the driver keeps each
plan it computed in that directory, keyed by everything the planner is given, and a later driver
(or the one-host reference run) with the same inputs reads it back instead of planning again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path


def finish(proc, who: str, timeout: float) -> str:
    """Wait for a host's process (text output): its output, or SystemExit naming ``who`` when it
    failed or did not end within ``timeout`` seconds (then it is killed). For the benchmarks."""
    import subprocess

    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise SystemExit(f"{who} did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise SystemExit(f"{who} failed:\n{out[-4000:]}")
    return out


KINDS = ["table_wise", "row_wise", "column_wise", "data_parallel", "table_row_wise",
         "table_column_wise"]


def make_dataset(out: Path, rows: int = 24_000, row_group_size: int = 2000) -> Path:
    from recscale.data.preprocess import PreprocessConfig, preprocess_criteo
    from recscale.data.synthetic import generate_criteo_tsv
    from tests.conftest import small_synthetic_config

    rep = generate_criteo_tsv(small_synthetic_config(num_rows=rows), out / "day_00.tsv")
    preprocess_criteo([rep.path], out / "parquet", PreprocessConfig(row_group_size=row_group_size),
                      rep.cardinalities)
    return out / "parquet"


def mixed_plan(plan, kinds=KINDS):
    """``plan`` with every sharding type: table i gets kinds[i % len(kinds)], laid out by hand
    over the plan's hosts (hierarchical types inside host i % hosts)."""
    from tests.distributed.workers import shard

    W, L = plan.world_size, plan.local_world_size
    hosts = W // L
    tables = []
    for i, tp in enumerate(plan.tables):
        kind, rows, dim = kinds[i % len(kinds)], tp.num_embeddings, tp.embedding_dim
        home = [(i % hosts) * L + k for k in range(L)]
        if kind == "table_wise":
            shards = [(W - 1 - i % W, 0, rows, 0, dim)]
        elif kind in ("row_wise", "table_row_wise"):
            holders = list(range(W))[::-1] if kind == "row_wise" else home
            block = -(-rows // len(holders))
            shards = [(r, k * block, min(block, rows - k * block), 0, dim)
                      for k, r in enumerate(holders) if k * block < rows]
        elif kind in ("column_wise", "table_column_wise"):
            holders = [W - 1, 0] if kind == "column_wise" else home[::-1]
            cut = dim // 4 if len(holders) == 2 else dim // len(holders)
            shards = [(holders[0], 0, rows, 0, cut), (holders[1], 0, rows, cut, dim - cut)]
        else:
            shards = [(r, 0, rows, 0, dim) for r in range(W)]
        specs = tuple(shard(*s) for s in shards)
        tables.append(dataclasses.replace(tp, sharding_type=kind, shards=specs))
    return dataclasses.replace(plan, tables=tuple(tables))


def cache_plans(cache_dir: str) -> None:
    """Memoise the planner of ``plan_for_run`` (``recscale.runconfig.resolve.plan_sharding``)
    in this process, in ``cache_dir``: the key is a hash of its pickled arguments (tables with
    their sizes and measured distinct fractions, topology, batch, options), the value the pickled
    plan it returned; a process that finds the key reads the plan back. Only this process's
    planning goes through it (the job's workers, which replan when hosts come and go, do not)."""
    import hashlib
    import pickle

    import recscale.runconfig.resolve as resolve

    planner = resolve.plan_sharding

    def plan_sharding(*args, **kwargs):
        key = hashlib.sha256(pickle.dumps((args, sorted(kwargs.items())))).hexdigest()[:32]
        path = Path(cache_dir, f"plan-{key}.pkl")
        if path.exists():
            return pickle.loads(path.read_bytes())
        plan = planner(*args, **kwargs)
        os.makedirs(cache_dir, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(plan))
        os.replace(tmp, path)  # whole or absent, whoever reads it
        return plan

    resolve.plan_sharding = plan_sharding


def drive(spec_path: str, out_dir: str) -> None:
    import torch

    from recscale.config import parse
    from recscale.data.preprocess import load_manifest
    from recscale.runconfig import DLRMConfig, plan_for_run
    from recscale.train import train_dlrm

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("start_when") and not wait_for_file(spec["start_when"]):
        sys.exit(3)
    if spec.get("plan_cache"):
        cache_plans(spec["plan_cache"])
    manifest = load_manifest(spec["manifest_dir"])
    cfg = parse(DLRMConfig, spec["config"], "")
    plan = plan_for_run(manifest, cfg)
    if spec.get("plan") == "mixed":
        plan = mixed_plan(plan)
    elif spec.get("plan", "").startswith("kinds:"):  # e.g. kinds:row_wise,column_wise
        plan = mixed_plan(plan, spec["plan"].split(":", 1)[1].split(","))
    out = train_dlrm(manifest, cfg.model, cfg.train, plan, comms=cfg.comms,
                     sharding=cfg.sharding)
    os.makedirs(out_dir, exist_ok=True)
    torch.save(out.model.state_dict(), os.path.join(out_dir, "state.pt"))
    plan.save(os.path.join(out_dir, "plan.json"))
    r = out.result
    Path(out_dir, "result.json").write_text(json.dumps(
        {"steps": r.steps, "samples": r.samples, "final_loss": r.final_loss,
         "transitions": r.transitions, "extra": r.extra}))


def wait_for_file(trigger: str, timeout_s: float = 120.0) -> bool:
    """Print "waiting for <trigger>" (what a test waits to read: this process is ready), then
    wait until ``trigger`` exists, at most ``timeout_s`` s (False, said on stderr, if not)."""
    import time

    print(f"waiting for {trigger}", flush=True)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(trigger):
        if time.monotonic() > deadline:
            print(f"{trigger} did not appear within {timeout_s:g} s", file=sys.stderr)
            return False
        time.sleep(0.05)
    return True


def join_when(trigger: str, endpoint: str, timeout_s: float = 120.0) -> int:
    """`recscale join --endpoint endpoint` once ``trigger`` exists, with torch and recscale
    already imported (a host that comes back at a chosen moment, without the import's delay)."""
    import recscale.train.job_worker  # noqa: F401
    from recscale.join import join_main

    if not wait_for_file(trigger, timeout_s):
        return 3
    return join_main(["--endpoint", endpoint, "--timeout", "60"])


if __name__ == "__main__":
    if sys.argv[1] == "drive":
        drive(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "join-when":
        sys.exit(join_when(sys.argv[2], sys.argv[3]))
