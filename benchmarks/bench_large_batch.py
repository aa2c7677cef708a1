"""Large global batches on the DLRM: Hessian-free dense steps against Adam (the large-batch recipe:
learning rate scaled with the batch, linear warm-up) and SOAP / Shampoo (pytorch-optimizer, the
optional extra `second_order`; skipped, and said so, when it is not installed), all in one run.

Default synthetic data (planted signal, oracle AUC known), one pass over the train split, global
batches 2K, 16K and 64K (64K as 2 ranks x 32K on the sharded runtime). For each optimizer and batch
size a small grid (learning rate, or HF's initial damping) is trained, the setting with the best
validation AUC is kept, and its test AUC, oracle gap (oracle AUC - test AUC), wall time of the
training and passes are printed; the embeddings keep the same fused row-wise Adagrad everywhere
(its learning rate scaled with sqrt(batch / 2K) for every dense optimizer alike). The exact-Hessian
HF variant reports the directions of negative curvature it met and took.

    python benchmarks/bench_large_batch.py                       # the README's table (~12 min on 2 shared cores)
    python benchmarks/bench_large_batch.py --rows 200000 --batches 2048 16384 --quick
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from recscale.config import parse
from recscale.data.preprocess import PreprocessConfig, load_manifest, preprocess_criteo
from recscale.data.synthetic import SyntheticConfig, generate_criteo_tsv
from recscale.evaluate import oracle_auc
from recscale.runconfig import DLRMConfig, plan_for_run
from recscale.scoring import evaluate_dlrm
from recscale.train import train_dlrm

MODEL = {"embedding_dim": 16, "bottom_mlp": [64, 16], "top_mlp": [64, 1]}
BASE_BATCH = 2048
EMB_LR = 0.1  # row-wise Adagrad at 2K; x sqrt(batch / 2K) above


def second_order_available() -> bool:
    try:
        import pytorch_optimizer  # noqa: F401
    except ImportError:
        return False
    return True


def grids(batch: int, steps: int, quick: bool, hf_cg: int = 20,
          hf_curvature: int = 8192, hf_dampings=None,
          hessian_damping: float = 1.0) -> dict[str, list[dict]]:
    """Each optimizer's settings at this global batch (two grid points each, one with --quick;
    HF at 2K and its exact-Hessian variant, the slowest runs, get one)."""
    scale = math.sqrt(batch / BASE_BATCH)  # Adam's square-root rule
    warm = max(1, steps // 10)
    mults = (1,) if quick else (1, 3)
    out = {"adam": [{"name": "adam", "learning_rate": 1e-3 * scale * m, "warmup_steps": warm}
                    for m in mults]}
    hf_base = {"name": "hessian_free", "curvature_batch_size": min(batch, hf_curvature),
               "hf": {"cg_max_iters": hf_cg}}
    dampings = (1.0,) if quick or batch <= BASE_BATCH else (0.1, 1.0)
    dampings = hf_dampings or dampings
    out["hf_gn"] = [{**hf_base, "hf": {**hf_base["hf"], "damping": d}} for d in dampings]
    if batch > BASE_BATCH:
        out["hf_hessian"] = [{**hf_base, "hf": {**hf_base["hf"], "curvature": "hessian",
                                                "solver": "bicgstab",
                                                "damping": hessian_damping}}]
    if second_order_available():
        out["soap"] = [{"name": "soap", "learning_rate": 3e-3 * scale * m, "warmup_steps": warm}
                       for m in ((1,) if quick else (0.3, 1))]
    return out


def train_one(man: dict, oracle, batch: int, dense_opt: dict, threads: int) -> dict:
    world = 2 if batch >= 65536 else 1
    emb_lr = EMB_LR * math.sqrt(batch / BASE_BATCH)
    train = {"batch_size_per_rank": batch // world, "epochs": 1, "seed": 0, "progress": "off",
             "log_every": 10**6, "num_threads": threads,
             "embedding_optimizer": {"name": "exact_rowwise_adagrad", "learning_rate": emb_lr},
             "dense_optimizer": dense_opt,
             "launch": {"world_size": world, "collective_timeout_s": 600}}
    cfg = parse(DLRMConfig, {"model": MODEL, "train": train}, "")
    plan = plan_for_run(man, cfg) if world > 1 else None
    t0 = time.perf_counter()
    out = train_dlrm(man, cfg.model, cfg.train, plan, comms=cfg.comms)
    wall = time.perf_counter() - t0
    val = evaluate_dlrm(out.model, man, "validation", 16384, oracle)
    test = evaluate_dlrm(out.model, man, "test", 16384, oracle)
    ex = out.result.extra or {}
    return {"val_auc": val["auc"], "test_auc": test["auc"], "oracle_auc": test["oracle_auc"],
            "wall_s": wall, "steps": out.result.steps, "passes": 1.0, "world_size": world,
            **{k: v for k, v in ex.items() if k.startswith("hf.")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=500_000, help="synthetic rows (80%% train)")
    ap.add_argument("--batches", type=int, nargs="+", default=[2048, 16384, 65536])
    ap.add_argument("--only", nargs="*", default=None, help="optimizers to run (default: all)")
    ap.add_argument("--quick", action="store_true", help="one or two grid points each")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads per process (more than 1 on a loaded machine is "
                         "far slower: OpenMP waits)")
    ap.add_argument("--hf-cg-max-iters", type=int, default=20)
    ap.add_argument("--hf-curvature-batch", type=int, default=8192, help="min(batch, this)")
    ap.add_argument("--hf-dampings", type=float, nargs="*", default=None,
                    help="HF's initial dampings (default: 1 at 2K, 0.1 and 1 above)")
    ap.add_argument("--hf-hessian-damping", type=float, default=1.0)
    ap.add_argument("--out", default="/tmp/recscale_bench_large_batch")
    ap.add_argument("--json", default=None, help="write every run's numbers here")
    args = ap.parse_args(argv)

    t_all = time.perf_counter()
    rep = generate_criteo_tsv(SyntheticConfig(num_rows=args.rows),
                              f"{args.out}/synthetic_{args.rows}/day_00.tsv")
    pq = f"{args.out}/parquet_{args.rows}"
    try:
        man = load_manifest(pq)
    except FileNotFoundError:
        preprocess_criteo([rep.path], pq, PreprocessConfig(), rep.cardinalities)
        man = load_manifest(pq)
    oracle = np.load(rep.oracle_path, mmap_mode="r")
    train_rows = man["splits"]["train"]["rows"]
    print(f"data: {args.rows} synthetic rows ({train_rows} train), oracle AUC "
          f"{oracle_auc(rep):.4f}; model {MODEL}; one pass; {args.threads} threads", flush=True)
    if not second_order_available():
        print("soap: skipped (pytorch-optimizer is not installed: pip install "
              "'recscale[second_order]')", flush=True)
    runs, best = [], {}
    for batch in args.batches:
        steps = math.ceil(train_rows / batch)
        for name, grid in grids(batch, steps, args.quick, args.hf_cg_max_iters,
                                 args.hf_curvature_batch, args.hf_dampings,
                                 args.hf_hessian_damping).items():
            if args.only and name not in args.only:
                continue
            for dense_opt in grid:
                r = train_one(man, oracle, batch, dense_opt, args.threads)
                r.update(optimizer=name, batch=batch, setting=dense_opt)
                runs.append(r)
                knob = dense_opt.get("hf", {}).get("damping", dense_opt.get("learning_rate"))
                print(f"  {name:10s} batch {batch:6d} {'damping' if 'hf' in name else 'lr':7s} "
                      f"{knob:<9.3g} val AUC {r['val_auc']:.4f} test AUC {r['test_auc']:.4f} "
                      f"{r['steps']:4d} steps {r['wall_s']:6.1f} s", flush=True)
                key = (name, batch)
                if key not in best or r["val_auc"] > best[key]["val_auc"]:
                    best[key] = r
    print("\nbest setting per optimizer and batch (chosen on validation AUC):")
    print("| optimizer | global batch | ranks | setting | test AUC | oracle gap | train s | steps "
          "| passes | neg. curvature met / taken |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (name, batch), r in best.items():
        s = r["setting"]
        knob = (f"damping {s['hf']['damping']:g}" if "hf" in name
                else f"lr {s['learning_rate']:.3g}, warm-up {s['warmup_steps']}")
        nc = (f"{int(r.get('hf.negative_curvature_met', 0))} / "
              f"{int(r.get('hf.negative_curvature_taken', 0))}" if name == "hf_hessian" else "")
        print(f"| {name} | {batch} | {r['world_size']} | {knob} | {r['test_auc']:.4f} | "
              f"{r['oracle_auc'] - r['test_auc']:.4f} | {r['wall_s']:.1f} | {r['steps']} | "
              f"{r['passes']:g} | {nc} |")
    small = min(args.batches)
    large = max(args.batches)
    at_small = max((r["test_auc"] for (n, b), r in best.items() if b == small), default=None)
    for name in ("hf_gn", "hf_hessian"):
        hf = best.get((name, large))
        adam = best.get(("adam", large))
        if hf and adam and at_small is not None:
            print(f"{name} at {large}: test AUC {hf['test_auc']:.4f}; best at {small}: "
                  f"{at_small:.4f} (gap {at_small - hf['test_auc']:+.4f}, goal <= 0.002); "
                  f"Adam at {large}: {adam['test_auc']:.4f} (HF - Adam "
                  f"{hf['test_auc'] - adam['test_auc']:+.4f}, goal > 0)")
    print(f"total {time.perf_counter() - t_all:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
