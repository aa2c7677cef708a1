"""Reduced-precision communication at 2 ranks: step time, bytes per step and model quality for each
wire precision beside fp32, in one run, on the default synthetic data (2M rows, 1 epoch).

    python benchmarks/bench_comms.py
    python benchmarks/bench_comms.py --rows 500000 --precisions fp32 bf16 int8
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np

from recscale.comm import CommsConfig
from recscale.config import parse
from recscale.data.preprocess import PreprocessConfig, load_manifest, preprocess_criteo
from recscale.data.synthetic import SyntheticConfig, generate_criteo_tsv
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.scoring import evaluate_dlrm
from recscale.sharding import Topology, plan_sharding
from recscale.sharding.from_data import table_specs_from_manifest as table_specs
from recscale.train import train_dlrm

PRECISIONS = ["fp32", "fp16", "bf16", "fp8", "int8"]


def dataset(rows: int, out_dir: str):
    rep = generate_criteo_tsv(SyntheticConfig(num_rows=rows), f"{out_dir}/synthetic_{rows}/day_00.tsv")
    pq = f"{out_dir}/parquet_{rows}"
    try:
        return load_manifest(pq), np.load(rep.oracle_path, mmap_mode="r")
    except FileNotFoundError:
        preprocess_criteo([rep.path], pq, PreprocessConfig(), rep.cardinalities)
        return load_manifest(pq), np.load(rep.oracle_path, mmap_mode="r")


def _bytes(extra: dict, names) -> float:
    """Bytes per step of the named collectives, summed over ranks."""
    return sum(v for k, v in extra.items()
               if ".bytes_per_step." in k and k.rsplit(".", 1)[1] in names)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--precisions", nargs="+", default=PRECISIONS, choices=PRECISIONS)
    ap.add_argument("--batch-size", type=int, default=1024, help="per rank (global = 2x)")
    ap.add_argument("--out-dir", default="benchmarks/out")
    args = ap.parse_args(argv)
    man, oracle = dataset(args.rows, args.out_dir)
    model_cfg = ModelConfig()
    base = parse(TrainConfig, {
        "batch_size_per_rank": args.batch_size, "launch": {"world_size": 2}, "progress": "off",
        "log_every": 50,
        "embedding_optimizer": {"name": "exact_rowwise_adagrad", "learning_rate": 0.1},
        "dense_optimizer": {"name": "adam", "learning_rate": 0.001}}, "train")
    rows = []
    for p in args.precisions:
        comms = CommsConfig(forward=p, backward=p,
                            dense_allreduce=p if p in ("fp32", "fp16", "bf16") else "bf16")
        tcfg = dataclasses.replace(base, comms=comms)
        plan = plan_sharding(table_specs(man, model_cfg.embedding_dim),
                             Topology.preset("cpu-local", world_size=2), tcfg.batch_size,
                             {"optimizer": "exact_rowwise_adagrad", "comms": comms})
        t0 = time.perf_counter()
        out = train_dlrm(man, model_cfg, tcfg, plan)
        wall = time.perf_counter() - t0
        m = evaluate_dlrm(out.model, man, "test", 16384, oracle)
        ex = out.result.extra
        pooled = _bytes(ex, ("output", "output_grad", "dp_output_grad"))
        ids = _bytes(ex, ("input", "dp_input", "input_counts"))
        dense = _bytes(ex, ("dense_allreduce",))
        rows.append({"precision": p, "dense": comms.dense_allreduce,
                     "step_ms": 1e3 * ex["step_seconds"] / ex["steps"],
                     "pooled_bytes": pooled, "ids_bytes": ids, "dense_bytes": dense, "auc": m["auc"],
                     "ne": m["normalized_entropy"], "oracle": m["oracle_auc"], "wall": wall})
        print(f"{p}: done in {wall:.0f}s, AUC {m['auc']:.4f}", flush=True)
    f = rows[0]
    print(f"\n2 ranks, global batch {2 * args.batch_size}, {man['splits']['train']['rows']:,} train rows, 1 epoch; "
          f"oracle AUC {f['oracle']:.4f}\n")
    print("| forward/backward | dense all-reduce | step ms | pooled vectors + grads, bytes/step | vs fp32 "
          "| dense all-reduce bytes/step | vs fp32 | ids bytes/step (never encoded) | test AUC | AUC - fp32 | NE |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['precision']} | {r['dense']} | {r['step_ms']:.1f} | {r['pooled_bytes'] / 1e6:.3f} MB | "
              f"{r['pooled_bytes'] / f['pooled_bytes']:.3f} | {r['dense_bytes'] / 1e6:.2f} MB | "
              f"{r['dense_bytes'] / f['dense_bytes']:.2f} | {r['ids_bytes'] / 1e6:.2f} MB | {r['auc']:.4f} | "
              f"{r['auc'] - f['auc']:+.4f} | {r['ne']:.4f} |")
    print(f"\ncommand: python benchmarks/bench_comms.py {' '.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
