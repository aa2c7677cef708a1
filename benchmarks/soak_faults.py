"""Fault soak: K sharded training runs (2 gloo ranks), each with a random rank SIGKILLed at a random
step; the elastic agent restarts the group, which resumes from the last checkpoint. Prints how
many runs recovered and whether every final model is bitwise equal to the clean run's.

    python benchmarks/soak_faults.py                 # 5 runs, 24 steps, checkpoint every 4
    python benchmarks/soak_faults.py --runs 10 --seed 7
"""

from __future__ import annotations

import argparse
import atexit
import logging
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from recscale.config import parse
from recscale.data.preprocess import PreprocessConfig, load_manifest, preprocess_criteo
from recscale.data.synthetic import SyntheticConfig, generate_criteo_tsv
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.sharding import Topology, plan_sharding
from recscale.sharding.from_data import table_specs_from_manifest
from recscale.train import train_dlrm

MODEL = {"embedding_dim": 16, "bottom_mlp": [64, 16], "top_mlp": [64, 1]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--every", type=int, default=4, help="checkpoint every N steps")
    ap.add_argument("--rows", type=int, default=120_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    rnd = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="recscale-soak-"))
    atexit.register(shutil.rmtree, work, True)  # every run's checkpoints
    syn = SyntheticConfig(num_rows=args.rows, seed=5, cardinality_scale=0.001,
                          keep_cardinality_below=500)
    rep = generate_criteo_tsv(syn, work / "day_00.tsv")
    preprocess_criteo([rep.path], work / "parquet", PreprocessConfig(row_group_size=5000),
                      rep.cardinalities)
    manifest = load_manifest(work / "parquet")
    model_cfg = parse(ModelConfig, MODEL, "model")
    plan = plan_sharding(table_specs_from_manifest(manifest, 16),
                         Topology.preset("cpu-local", world_size=2), 1024)

    def run(name, **extra):
        launch = {"world_size": 2, "collective_timeout_s": 60, **extra.pop("launch", {})}
        tcfg = parse(TrainConfig, {"batch_size_per_rank": 1024, "max_steps": args.steps,
                                   "progress": "off", "launch": launch,
                                   "checkpoint": {"dir": str(work / name), "every_steps": args.every},
                                   **extra}, "train")
        return train_dlrm(manifest, model_cfg, tcfg, plan, str(work / name / "out"))

    t0 = time.perf_counter()
    clean = run("clean").model.state_dict()
    print(f"clean run: {args.steps} steps in {time.perf_counter() - t0:.1f} s")
    recovered = equal = 0
    for k in range(args.runs):
        rank, step = rnd.randrange(2), rnd.randint(2, args.steps)
        t0 = time.perf_counter()
        try:
            out = run(f"fault{k}", launch={"max_restarts": 1},
                      fault_injection={"rank": rank, "step": step, "kind": "kill"})
        except Exception as exc:  # a run that did not come back
            print(f"run {k}: rank {rank} killed at step {step}: NOT recovered ({type(exc).__name__})")
            continue
        recovered += 1
        sd = out.model.state_dict()
        same = all(torch.equal(sd[n], clean[n]) for n in clean)
        equal += same
        print(f"run {k}: rank {rank} killed at step {step}: recovered (resumed={int(out.result.extra['resumed'])}, "
              f"{out.result.steps} steps, {time.perf_counter() - t0:.1f} s), final model "
              f"{'bitwise equal to' if same else 'DIFFERENT from'} the clean run")
    print(f"recovered {recovered}/{args.runs}; final model equal to the clean run in {equal}/{args.runs}")
    return 0 if recovered == equal == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
