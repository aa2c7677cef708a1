"""Hessian-free (Gauss-Newton + CG, and the exact Hessian + Bi-CG-STAB with negative-curvature
steps) vs SGD (momentum) vs Adam vs SOAP (pytorch-optimizer, the optional extra `second_order`;
skipped, and said so, without it) on MNIST at a small batch and at 10x that batch, and
data-parallel HF on 1 vs 2 ranks.

Target: the best validation error SGD reaches at the small batch (its best learning rate of a
small grid). For every optimizer and batch: passes over the training data and training wall time
to first reach that target, best validation error, test error of the final model, seconds per
step. SGD, Adam and SOAP get the best learning rate of their grid at each batch size; HF gets the
best (on the validation split) of its grid of initial damping x CG cap x CG progress epsilon x
curvature batch (min(batch, each)) x preconditioner at each batch size. Passes count gradient
batches only: an HF step over the whole 8,000-image split is one pass, whatever its CG iterations
and loss evaluations cost (they are reported as curvature products and wall time).
``--optimizers`` and ``--batches`` restrict what runs; SGD at the small batch always runs, since
it sets the target.

Scaling: wall time per HF iteration at the large batch with 1 rank (1 thread) vs 2 ranks
(1 thread each), same global batch, identical iterates; efficiency = t1 / (2 t2).

    python benchmarks/bench_hf.py                    # 800 vs 8,000 (the whole training split)
    python benchmarks/bench_hf.py --epochs 10 --sgd-lrs 0.1 --adam-lrs 1e-3 --soap-lrs 3e-3 \
        --scaling-steps 0   # quick look
    python benchmarks/bench_hf.py --optimizers sgd hf --batches large --hf-damping 0.1 1 \
        --hf-cg-max-iters 50 100 --scaling-steps 0   # the HF-at-10x goal only
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from recscale.config import parse
from recscale.data.idx import MnistConfig, prepare_mnist, read_idx
from recscale.hf.config import BaselinesConfig, FitConfig, NetConfig
from recscale.hf.fit import fit_baseline, fit_hessian_free, load_model
from recscale.hf.loop import evaluate_classifier
from recscale.optim.config import HessianFreeConfig

ROOT = Path(__file__).resolve().parents[1]
OPTIMIZERS = ("sgd", "adam", "soap", "hf", "hf_hessian")


def _fmt(v, spec: str) -> str:
    return "not reached" if v is None else format(v, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", default=str(ROOT / "data/01_raw/mnist/t10k-images-idx3-ubyte.gz"))
    ap.add_argument("--labels", default=str(ROOT / "data/01_raw/mnist/t10k-labels-idx1-ubyte.gz"))
    ap.add_argument("--small-batch", type=int, default=800)
    ap.add_argument("--factor", type=int, default=10)
    ap.add_argument("--epochs", type=float, default=30.0, help="passes over the training split, every run")
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 128, 64])
    ap.add_argument("--sgd-lrs", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.5, 1.0])
    ap.add_argument("--adam-lrs", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3, 1e-2])
    ap.add_argument("--soap-lrs", type=float, nargs="*", default=[1e-3, 3e-3])
    ap.add_argument("--hf-curvatures", nargs="+", default=["gn", "hessian"],
                    help="gn: Gauss-Newton + CG; hessian: exact Hessian + Bi-CG-STAB")
    ap.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=OPTIMIZERS,
                    help="which optimizers run (SGD at the small batch always runs: the target)")
    ap.add_argument("--batches", nargs="+", default=["small", "large"], choices=["small", "large"],
                    help="batch sizes the runs other than the target's use")
    ap.add_argument("--hf-damping", type=float, nargs="+", default=[0.1],
                    help="HF initial damping grid")
    ap.add_argument("--hf-cg-max-iters", type=int, nargs="+", default=[100], help="HF CG cap grid")
    ap.add_argument("--hf-cg-tol", type=float, nargs="+", default=[5e-4],
                    help="HF grid of Martens' CG progress epsilon (smaller: longer solves)")
    ap.add_argument("--hf-preconditioner", nargs="+", default=["none"], choices=["none", "fisher"],
                    help="HF preconditioner grid")
    ap.add_argument("--curvature-batch", type=int, nargs="+", default=[2000],
                    help="HF curvature batch grid: min(batch, each)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    ap.add_argument("--scaling-steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/out/hf"))
    args = ap.parse_args()

    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]
    data = prepare_mnist(read_idx(args.images), read_idx(args.labels), MnistConfig(seed=args.seed))
    n_train = len(data["y_train"])
    small, large = args.small_batch, min(args.small_batch * args.factor, n_train)
    net = NetConfig(hidden=tuple(args.hidden))
    wanted = set(args.optimizers)
    curvatures = [c for c in args.hf_curvatures if ("hf" if c == "gn" else "hf_hessian") in wanted]
    grid = [(lam, cg, cb, tol, pre) for lam in args.hf_damping for cg in args.hf_cg_max_iters
            for cb in args.curvature_batch for tol in args.hf_cg_tol
            for pre in args.hf_preconditioner]

    def hf_config(c, lam, cg, tol, pre):
        return HessianFreeConfig(damping=lam, cg_max_iters=cg, curvature=c, cg_tol=tol,
                                 preconditioner=pre, solver="cg" if c == "gn" else "bicgstab")

    # the scaling part times the first grid point
    lam0, cg0, scaling_cb, tol0, pre0 = grid[0]
    hf = hf_config(curvatures[0] if curvatures else "gn", lam0, cg0, tol0, pre0)
    try:
        import pytorch_optimizer  # noqa: F401
    except ImportError:
        print("soap: skipped (pytorch-optimizer is not installed: pip install "
              "'recscale[second_order]')")
        args.soap_lrs = []
    print(f"MNIST {data['info']['examples']} images: train {n_train}, validation "
          f"{len(data['y_validation'])}, test {len(data['y_test'])}; batches {small} and {large} "
          f"({large / small:.0f}x); {args.epochs:g} passes per run; net 784-"
          f"{'-'.join(map(str, args.hidden))}-10; {args.threads} thread(s); load {load0:.2f}")

    def fit_cfg(batch, **kw):
        return parse(FitConfig, {"global_batch_size": batch, "epochs": args.epochs, "seed": args.seed,
                                 "num_threads": args.threads, "progress": "off",
                                 "eval_every": 0.5, **kw}, "train")

    rows, results = [], {}

    def baseline(name, batch, lrs):
        best = None
        for lr in lrs:
            bl = parse(BaselinesConfig, {name: {"learning_rate": lr}}, "baselines")
            r = fit_baseline(data, net, name, bl, fit_cfg(batch))
            print(f"  {name} batch {batch} lr {lr:g}: best val error {r.summary['best_val_error']:.4f} "
                  f"({r.summary['total_wall_s']:.1f} s)", flush=True)
            if best is None or r.summary["best_val_error"] < best[0].summary["best_val_error"]:
                best = (r, lr)
        return best

    def hf_best(c, name, batch):
        best = None
        for lam, cg, cb, tol, pre in grid:
            t0 = time.perf_counter()
            r = fit_hessian_free(data, net, hf_config(c, lam, cg, tol, pre), fit_cfg(
                batch, curvature_batch_size=min(batch, cb)))
            setting = (f"damping {lam:g}, CG <= {cg}, cg_tol {tol:g}, curv. batch "
                       f"{min(batch, cb)}" + (", Fisher precond." if pre == "fisher" else ""))
            print(f"  {name} batch {batch} {setting}: best val error "
                  f"{r.summary['best_val_error']:.4f} ({time.perf_counter() - t0:.1f} s, "
                  f"{r.summary['cg_iters_mean']:.1f} CG it/step, "
                  f"{r.summary['products_total']:.0f} products, "
                  f"{r.summary['total_rejected_steps']:.0f} rejected, "
                  f"{r.summary['total_negative_curvature_events']:.0f} NC events met)", flush=True)
            if best is None or r.summary["best_val_error"] < best[0].summary["best_val_error"]:
                best = (r, setting)
        return best

    # the target: SGD at the small batch
    sgd_small, sgd_lr = baseline("sgd", small, args.sgd_lrs)
    target = sgd_small.summary["best_val_error"]
    print(f"target: SGD's best validation error at batch {small} = {target:.4f}\n", flush=True)
    runs = [("sgd", small, sgd_small, f"lr {sgd_lr:g}")]
    for batch in [b for b, key in ((small, "small"), (large, "large")) if key in args.batches]:
        if batch != small and "sgd" in wanted:
            r, lr = baseline("sgd", batch, args.sgd_lrs)
            runs.append(("sgd", batch, r, f"lr {lr:g}"))
        if "adam" in wanted:
            r, lr = baseline("adam", batch, args.adam_lrs)
            runs.append(("adam", batch, r, f"lr {lr:g}"))
        if args.soap_lrs and "soap" in wanted:
            r, lr = baseline("soap", batch, args.soap_lrs)
            runs.append(("soap", batch, r, f"lr {lr:g}"))
        for c in curvatures:
            hf_name = "hf" if c == "gn" else "hf_hessian"
            r, setting = hf_best(c, hf_name, batch)
            runs.append((hf_name, batch, r, setting))

    print()
    header = ("| optimizer | batch | setting | passes to target | wall s to target | best val err "
              "| final test err | s / step |")
    print(header)
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for name, batch, r, setting in sorted(runs, key=lambda x: (x[1], x[0])):
        reach = r.reach(target)
        test = evaluate_classifier(load_model(r, data, net), data["x_test"], data["y_test"])
        row = {"optimizer": name, "batch": batch, "setting": setting,
               "passes_to_target": reach["passes"] if reach else None,
               "wall_s_to_target": reach["wall_s"] if reach else None,
               "best_val_error": r.summary["best_val_error"], "test_error": test["error"],
               "step_s": r.summary["step_s_mean"], "summary": r.summary}
        rows.append(row)
        results[f"{name}@{batch}"] = r
        print(f"| {name} | {batch:,} | {setting} | {_fmt(row['passes_to_target'], '.1f')} | "
              f"{_fmt(row['wall_s_to_target'], '.1f')} | {100 * row['best_val_error']:.1f}% | "
              f"{100 * row['test_error']:.1f}% | {row['step_s']:.3f} |")

    if "small" in args.batches and "large" in args.batches:
        print(f"\nrobustness: best validation error at batch {small} -> {large}")
    for name in sorted({r["optimizer"] for r in rows}):
        a = next((r for r in rows if r["optimizer"] == name and r["batch"] == small), None)
        b = next((r for r in rows if r["optimizer"] == name and r["batch"] == large), None)
        if a is None or b is None:
            continue
        print(f"  {name}: {100 * a['best_val_error']:.1f}% -> {100 * b['best_val_error']:.1f}% "
              f"({100 * (b['best_val_error'] - a['best_val_error']):+.1f} points)")

    # data-parallel scaling at the large batch
    if args.scaling_steps:
        print(f"\nHF wall time per iteration at batch {large} (curvature batch "
              f"{min(large, scaling_cb)}), {args.scaling_steps} iterations, first one excluded:")
    scaling = {}
    for label, world, threads in () if not args.scaling_steps else (("1 rank x 1 thread", 1, 1), ("1 rank x 2 threads", 1, 2),
                                  ("2 ranks x 1 thread", 2, 1)):
        cfg = fit_cfg(large, curvature_batch_size=min(large, scaling_cb),
                      launch={"world_size": world},
                      num_threads=threads, max_steps=args.scaling_steps, epochs=args.scaling_steps)
        r = fit_hessian_free(data, net, hf, cfg)
        per = [s["step_s"] for s in r.steps[1:]] or [s["step_s"] for s in r.steps]
        scaling[label] = {"world_size": world, "threads": threads, "step_s": float(np.mean(per)),
                          "cg_iters": [s["cg_iters"] for s in r.steps]}
        print(f"  {label}: {np.mean(per):.3f} s / iteration (CG iterations "
              f"{scaling[label]['cg_iters']})", flush=True)
    eff = None
    if scaling:
        t1 = scaling["1 rank x 1 thread"]["step_s"]
        t2 = scaling["2 ranks x 1 thread"]["step_s"]
        eff = t1 / (2 * t2)
        print(f"  speed-up 2 ranks vs 1 rank (1 thread each): {t1 / t2:.2f}x, scaling efficiency "
              f"{100 * eff:.0f}%")

    hf_large = next((r for r in rows if r["optimizer"] == "hf" and r["batch"] == large), None)
    sgd_large = next((r for r in rows if r["optimizer"] == "sgd" and r["batch"] == large), None)
    held = None
    if hf_large is not None:
        held = hf_large["passes_to_target"] is not None and (
            sgd_large is None or sgd_large["passes_to_target"] is None
            or hf_large["passes_to_target"] < sgd_large["passes_to_target"])
        sgd_said = "was not run" if sgd_large is None else (
            "reached it" if sgd_large["passes_to_target"] is not None else "did not reach it")
        print(f"\nclaim 'robust at {large // small}x batch': HF at batch {large} "
              f"{'reached' if hf_large['passes_to_target'] is not None else 'did not reach'} the "
              f"target within {args.epochs:g} passes; SGD at batch {large} {sgd_said} -> "
              f"{'HELD' if held else 'NOT SHOWN'} here")
    load1 = os.getloadavg()[0]
    print(f"total {time.perf_counter() - t_start:.0f} s; load average {load0:.2f} at start, "
          f"{load1:.2f} at end (2 cores, shared)")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_hf.json").write_text(json.dumps(
        {"args": vars(args), "target_val_error": target, "rows": rows, "scaling": scaling,
         "scaling_efficiency": eff, "claim_held": held}, indent=1, default=float))
    from recscale.hf.plots import comparison_image

    comparison_image(list(results.values()), f"MNIST: batch {small} vs {large}", target).save(
        out / "bench_hf.png")
    print(f"wrote {out / 'bench_hf.json'} and {out / 'bench_hf.png'}")


if __name__ == "__main__":
    main()
