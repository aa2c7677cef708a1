"""Training-step throughput: recscale's DLRM (fbgemm fused table-batched embeddings, optimizer fused
into backward) against a plain-PyTorch DLRM (one nn.EmbeddingBag per table with sparse gradients,
torch.optim.SGD), same MLPs, same interaction, same pre-generated batches, in one run.

Prints samples/s of each (median over repetitions), their ratio, and the fraction of the machine's
limit: the MLP FLOPs of a step over the matrix-multiply rate measured in the same run.

    python benchmarks/bench_train.py                  # kaggle-small and criteo-26, fp32 and bf16
    python benchmarks/bench_train.py --configs kaggle-small --reps 7 --steps 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch
from torch import nn

from loop_timing import loop_config, time_loop  # this folder
from recscale.data.batch import Batch, SparseFeatures
from recscale.data.synthetic import scaled_cardinalities
from recscale.embedding import EmbeddingOptimizerConfig
from recscale.model import MLP, ModelConfig, build_dlrm, interaction_dim
from recscale.train.config import DenseOptimizerConfig
from recscale.train.runtime import LocalRuntime

CONFIGS = {
    # 8 tables x 100,000 rows, dim 16, one id per table per sample
    "kaggle-small": dict(tables=[100_000] * 8, dim=16, bottom=(512, 256, 64, 16), top=(512, 256, 1),
                         batch=2048, pooling=1),
    # the 26 Criteo tables at the default synthetic scale (x4 hash size), one id per table
    "criteo-26": dict(tables=[4 * c for c in scaled_cardinalities(0.01, 1000)], dim=16,
                      bottom=(512, 256, 64, 16), top=(512, 256, 1), batch=2048, pooling=1),
}
LR = 0.05


class PlainDLRM(nn.Module):
    """The baseline: what a PyTorch user writes without fbgemm."""

    def __init__(self, tables, dim, bottom, top):
        super().__init__()
        self.bottom = MLP(13, bottom)
        self.embs = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum", sparse=True) for n in tables)
        cfg = ModelConfig(embedding_dim=dim, bottom_mlp=bottom, top_mlp=top)
        self.top = MLP(interaction_dim(cfg, len(tables)), top, last_activation=False)
        f = len(tables) + 1
        self.li, self.lj = torch.tril_indices(f, f, offset=-1)

    def forward(self, dense, sparse: SparseFeatures):
        x = self.bottom(dense)
        T, B = sparse.lengths.shape
        off = sparse.offsets()
        embs = [e(sparse.values[off[t * B]: off[(t + 1) * B]], off[t * B: (t + 1) * B] - off[t * B])
                for t, e in enumerate(self.embs)]
        feats = torch.stack([x] + embs, dim=1)
        z = torch.bmm(feats, feats.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([x, z], dim=1)).squeeze(1)


def make_batches(cfg, n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = cfg["batch"]
        ids = []
        for rows in cfg["tables"]:  # Zipf-like ids: a few hot rows, a long tail
            ids.append(np.minimum(rng.zipf(1.2, size=b * cfg["pooling"]) - 1, rows - 1))
        lengths = np.full((len(cfg["tables"]), b), cfg["pooling"], dtype=np.int64)
        sp = SparseFeatures(tuple(f"t{i}" for i in range(len(ids))),
                            torch.from_numpy(np.concatenate(ids).astype(np.int64)),
                            torch.from_numpy(lengths))
        out.append(Batch(torch.from_numpy(rng.normal(size=(b, 13)).astype(np.float32)), sp,
                         torch.from_numpy(rng.integers(0, 2, b).astype(np.float32)),
                         torch.arange(b)).to(DEVICE))
    return out


DEVICE = "cpu"


def ours(cfg, precision):
    """recscale's runtime for one process; timed through the training loop itself."""
    mcfg = ModelConfig(embedding_dim=cfg["dim"], bottom_mlp=cfg["bottom"], top_mlp=cfg["top"],
                       dense_precision=precision)
    model = build_dlrm(mcfg, cfg["tables"], 13, EmbeddingOptimizerConfig("exact_sgd", LR),
                       device=DEVICE)
    tcfg = loop_config(dense_optimizer={"name": "sgd", "learning_rate": LR}, device=DEVICE)
    return LocalRuntime(model, tcfg, torch.device(DEVICE)), tcfg


def baseline(cfg):
    torch.manual_seed(0)
    model = PlainDLRM(cfg["tables"], cfg["dim"], cfg["bottom"], cfg["top"]).to(DEVICE)
    model.li, model.lj = model.li.to(DEVICE), model.lj.to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.BCEWithLogitsLoss()

    def step(batch):
        loss = loss_fn(model(batch.dense, batch.sparse), batch.labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def time_steps(step, batches, steps, reps, warmup=3):
    for b in batches[:warmup]:
        float(step(b))
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for i in range(steps):
            float(step(batches[i % len(batches)]))
        rates.append(steps * batches[0].batch_size / (time.perf_counter() - t0))
    return statistics.median(rates), rates


def mlp_flops_per_sample(cfg):
    mcfg = ModelConfig(embedding_dim=cfg["dim"], bottom_mlp=cfg["bottom"], top_mlp=cfg["top"])
    dims = [13, *cfg["bottom"]]
    macs = sum(a * b for a, b in zip(dims[:-1], dims[1:]))
    tdims = [interaction_dim(mcfg, len(cfg["tables"])), *cfg["top"]]
    macs += sum(a * b for a, b in zip(tdims[:-1], tdims[1:]))
    return 2 * macs * 3  # forward + backward (grad wrt inputs and weights) = 3x forward


def _sync():
    if DEVICE != "cpu":
        torch.cuda.synchronize()


def matmul_rate(dtype, reps=20):
    a = torch.randn(2048, 512).to(dtype).to(DEVICE)
    b = torch.randn(512, 512).to(dtype).to(DEVICE)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        a @ b
        _sync()
        times.append(time.perf_counter() - t0)
    return 2 * 2048 * 512 * 512 / statistics.median(times)


def quality(rows: int, out_dir: str) -> dict[str, dict]:
    """Test AUC of fp32 vs bf16 dense layers on the default synthetic data (same seed, same data)."""
    from recscale.data.preprocess import PreprocessConfig, load_manifest, preprocess_criteo
    from recscale.data.synthetic import SyntheticConfig, generate_criteo_tsv
    from recscale.train import TrainConfig, evaluate_dlrm, train_dlrm

    rep = generate_criteo_tsv(SyntheticConfig(num_rows=rows), f"{out_dir}/synthetic_{rows}/day_00.tsv")
    pq_dir = f"{out_dir}/parquet_{rows}"
    try:
        man = load_manifest(pq_dir)
    except FileNotFoundError:
        preprocess_criteo([rep.path], pq_dir, PreprocessConfig(), rep.cardinalities)
        man = load_manifest(pq_dir)
    oracle = np.load(rep.oracle_path, mmap_mode="r")
    tcfg = TrainConfig(progress="off", dense_optimizer=DenseOptimizerConfig("adam", 0.001),
                       embedding_optimizer=EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.1))
    out = {}
    for precision in ("fp32", "bf16"):
        res = train_dlrm(man, ModelConfig(dense_precision=precision), tcfg)
        m = evaluate_dlrm(res.model, man, "test", 16384, oracle)
        out[precision] = {"auc": m["auc"], "oracle_auc": m["oracle_auc"],
                          "normalized_entropy": m["normalized_entropy"],
                          "train_samples_per_s": res.result.samples_per_s}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--steps", type=int, default=15, help="timed steps per repetition")
    ap.add_argument("--reps", type=int, default=5, help="repetitions (the median is reported)")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: all cores)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--quality-rows", type=int, default=2_000_000,
                    help="rows of default synthetic data for the fp32-vs-bf16 AUC check (0: skip)")
    ap.add_argument("--out-dir", default="benchmarks/out", help="where the quality data goes")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if args.threads:
        torch.set_num_threads(args.threads)
    rate32, rate16 = matmul_rate(torch.float32), matmul_rate(torch.bfloat16)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; 2048x512x512 matmul: "
          f"fp32 {rate32 / 1e9:.0f} GFLOP/s, bf16 {rate16 / 1e9:.0f} GFLOP/s")
    results = []
    for name in args.configs:
        cfg = CONFIGS[name]
        batches = make_batches(cfg, 8)
        flops = mlp_flops_per_sample(cfg)
        base, base_all = time_steps(baseline(cfg), batches, args.steps, args.reps)
        row = {"config": name, "baseline_samples_per_s": base, "baseline_reps": base_all}
        for precision, rate in (("fp32", rate32), ("bf16", rate16)):
            rt, tcfg = ours(cfg, precision)
            ours_rate, ours_all = time_loop(rt, batches, args.steps, args.reps, tcfg)
            limit = rate / flops
            row[precision] = {"samples_per_s": ours_rate, "reps": ours_all, "ratio": ours_rate / base,
                              "limit_samples_per_s": limit, "fraction_of_limit": ours_rate / limit}
        row["baseline_fraction_of_fp32_limit"] = base / (rate32 / flops)
        results.append(row)
    print()
    print("| config | plain PyTorch (samples/s) | recscale fp32 | ratio | of fp32 limit "
          "| recscale bf16 | ratio | of bf16 limit |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        f, b = r["fp32"], r["bf16"]
        print(f"| {r['config']} | {r['baseline_samples_per_s']:,.0f} | {f['samples_per_s']:,.0f} | "
              f"{f['ratio']:.2f}x | {f['fraction_of_limit']:.0%} | {b['samples_per_s']:,.0f} | "
              f"{b['ratio']:.2f}x | {b['fraction_of_limit']:.0%} |")
    q = quality(args.quality_rows, args.out_dir) if args.quality_rows else None
    if q:
        print(f"\nquality on {args.quality_rows:,} synthetic rows (test split, 1 epoch):")
        print("| dense precision | test AUC | oracle AUC | NE | train samples/s |")
        print("|---|---|---|---|---|")
        for p, m in q.items():
            print(f"| {p} | {m['auc']:.4f} | {m['oracle_auc']:.4f} | {m['normalized_entropy']:.4f} | "
                  f"{m['train_samples_per_s']:,.0f} |")
        print(f"bf16 - fp32 AUC: {q['bf16']['auc'] - q['fp32']['auc']:+.4f}")
    print(f"\nmedian of {args.reps} repetitions x {args.steps} steps; command: "
          f"python benchmarks/bench_train.py {' '.join(sys.argv[1:])}".rstrip())
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"matmul_gflops": {"fp32": rate32 / 1e9, "bf16": rate16 / 1e9},
                       "results": results, "quality": q}, fh, indent=2)
    return results


if __name__ == "__main__":
    main()
