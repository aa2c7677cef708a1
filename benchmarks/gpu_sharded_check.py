"""CUDA paths of the training stack on one GPU, against the CPU run of the same config:

1. single process: DLRM with fbgemm's CUDA table-batched embeddings vs the CPU run (same data, same
   seed, EXACT_SGD), final weights close (float summation order differs), and samples/s of both;
2. the sharded runtime as a 1-rank NCCL group on the GPU (ShardedEmbeddingCollection with a mixed
   plan, DDP, NCCL collectives, checkpoints written from CUDA), weights close to the CPU run;
3. the checkpoint written on the GPU, resumed in a CPU process: bitwise equal to the GPU model.

    python benchmarks/gpu_sharded_check.py            # needs CUDA; prints PASS/FAIL lines
"""

from __future__ import annotations

import dataclasses
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

MODEL = {"embedding_dim": 16, "bottom_mlp": [256, 64, 16], "top_mlp": [256, 64, 1]}
STEPS = 40
failures: list[str] = []


def report(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        failures.append(name)


def max_rel_diff(a: dict, b: dict) -> float:
    worst = 0.0
    for k in a:
        x, y = a[k].double().cpu(), b[k].double().cpu()
        if not x.numel():
            continue
        worst = max(worst, float((x - y).abs().max() / (y.abs().max() + 1e-12)))
    return worst


def main() -> int:
    # --dry-run: the same checks with the CPU standing in for the GPU (gloo instead of NCCL)
    dev = "cpu" if "--dry-run" in sys.argv else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    work = Path(tempfile.mkdtemp(prefix="recscale-gpu-"))
    rep = generate_criteo_tsv(SyntheticConfig(num_rows=200_000, seed=9, cardinality_scale=0.002,
                                              keep_cardinality_below=1000), work / "day_00.tsv")
    preprocess_criteo([rep.path], work / "parquet", PreprocessConfig(row_group_size=8192),
                      rep.cardinalities)
    manifest = load_manifest(work / "parquet")
    model_cfg = parse(ModelConfig, MODEL, "model")

    def cfg(device, name, **extra):
        return parse(TrainConfig, {"batch_size_per_rank": 2048, "max_steps": STEPS, "progress": "off",
                                   "device": device, "log_every": 10,
                                   "embedding_optimizer": {"name": "exact_sgd", "learning_rate": 0.05},
                                   "dense_optimizer": {"name": "sgd", "learning_rate": 0.05},
                                   "checkpoint": {"dir": str(work / name), "every_steps": 20},
                                   **extra}, "train")

    t0 = time.perf_counter()
    cpu = train_dlrm(manifest, model_cfg, cfg("cpu", "cpu"))
    ref = cpu.model.state_dict()
    print(f"cpu single process: {cpu.result.samples_per_s:,.0f} samples/s "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    try:
        t0 = time.perf_counter()
        gpu = train_dlrm(manifest, model_cfg, cfg(dev, "gpu"))
        d = max_rel_diff(gpu.model.state_dict(), ref)
        report("1. single-process CUDA (fbgemm CUDA TBE) vs CPU", d < 1e-3,
               f"max rel diff {d:.2e}; {gpu.result.samples_per_s:,.0f} samples/s on the GPU vs "
               f"{cpu.result.samples_per_s:,.0f} on the CPU ({time.perf_counter() - t0:.1f} s)")
    except Exception as exc:  # keep going: each check reports on its own
        report("1. single-process CUDA", False, f"{type(exc).__name__}: {str(exc)[:800]}")
    try:
        plan = plan_sharding(table_specs_from_manifest(manifest, 16),
                             Topology.preset("cpu-local", world_size=1), 2048)
        # one rank holds every table; make the types vary so each code path runs
        kinds = ["table_wise", "row_wise", "column_wise", "data_parallel"]
        tables = []
        for i, tp in enumerate(plan.tables):
            kind = kinds[i % len(kinds)]
            if kind == "column_wise":
                s = tp.shards[0]
                half = tp.embedding_dim // 2
                shards = (dataclasses.replace(s, col_length=half),
                          dataclasses.replace(s, col_offset=half, col_length=tp.embedding_dim - half))
                tables.append(dataclasses.replace(tp, sharding_type=kind, shards=shards))
            else:
                tables.append(dataclasses.replace(tp, sharding_type=kind))
        plan = dataclasses.replace(plan, tables=tuple(tables))
        t0 = time.perf_counter()
        sh = train_dlrm(manifest, model_cfg, cfg(dev, "sharded"), plan, str(work / "sh_out"),
                        sharded=True)
        d = max_rel_diff(sh.model.state_dict(), ref)
        report("2. sharded runtime, 1 rank, NCCL on CUDA, mixed plan vs CPU", d < 1e-3,
               f"max rel diff {d:.2e}; {sh.result.samples_per_s:,.0f} samples/s; comm "
               f"{sh.result.extra.get('rank0.comm_ms', float('nan')):.2f} ms/step "
               f"({time.perf_counter() - t0:.1f} s incl. launch)")
        ckpt = sh.result.checkpoints[-1]
        back = train_dlrm(manifest, model_cfg, cfg("cpu", "resume", checkpoint={
            "dir": str(work / "resume"), "resume": ckpt}))
        same = all(torch.equal(back.model.state_dict()[k], sh.model.state_dict()[k])
                   for k in ref)
        report("3. checkpoint written on the GPU (1 rank) resumed in a CPU process", same,
               f"from {Path(ckpt).name}")
    except Exception as exc:
        report("2./3. sharded runtime on CUDA", False, f"{type(exc).__name__}: {str(exc)[:1500]}")
    print("ALL OK" if not failures else f"FAILED: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
