"""Training-step throughput: recscale's DLRM (fbgemm fused table-batched embeddings, optimizer fused
into backward) against a plain-PyTorch DLRM (one nn.EmbeddingBag per table with sparse gradients,
torch.optim.SGD), same MLPs, same interaction, same pre-generated batches, in one run.

Prints samples/s of each (median over repetitions), their ratio, and the fraction of the machine's
limit: the MLP FLOPs of a step over the matrix-multiply rate measured in the same run.

The DLRM-DCNv2 config (``mlperf-dcnv2``: conf/mlperf_dcnv2's model and tables, MLPerf's bag sizes,
fixed-size bags) is measured against the plain-PyTorch DCN below and, where torchrec imports
(``make torchrec``; not a dependency), against TorchRec's DLRM_DCN (torchrec_baseline.py).
``--dcn-quality-rows`` trains that config in fp32 and bf16 on multi-hot synthetic data (test AUC).

On a CPU without bf16 units (AVX512_BF16 or AMX; e.g. an AMD EPYC with AVX2 only) torch emulates
bf16 products far below its fp32 rate: there the bf16 columns would time the emulation, not
recscale, so they are not measured and the run says why (``recscale.model.precision``).

    python benchmarks/bench_train.py                  # every config, fp32 and bf16
    python benchmarks/bench_train.py --configs kaggle-small --reps 7 --steps 20
    python benchmarks/bench_train.py --configs kaggle-small --ids uniform   # as TorchRec's runs
    python benchmarks/bench_train.py --configs mlperf-dcnv2 --quality-rows 0 --dcn-quality-rows 300000
    python benchmarks/bench_train.py --configs mlperf-dcnv2 --quality-rows 0 --threads 1 --clock cpu
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

import torchrec_baseline  # this folder
from loop_timing import loop_config, time_loop  # this folder
from recscale.data.batch import Batch, SparseFeatures
from recscale.data.synthetic import MLPERF_MULTI_HOT_SIZES, scaled_cardinalities
from recscale.embedding import EmbeddingOptimizerConfig
from recscale.model import MLP, ModelConfig, build_dlrm, interaction_dim
from recscale.model.dcn import DCNConfig
from recscale.model.precision import bf16_warning
from recscale.runconfig import DenseOptimizerConfig
from recscale.train.runtime import LocalRuntime

CONFIGS = {
    # 8 tables x 100,000 rows, dim 16, one id per table per sample
    "kaggle-small": dict(tables=[100_000] * 8, dim=16, bottom=(512, 256, 64, 16), top=(512, 256, 1),
                         batch=2048, pooling=1),
    # the 26 Criteo tables at the default synthetic scale (x4 hash size), one id per table
    "criteo-26": dict(tables=[4 * c for c in scaled_cardinalities(0.01, 1000)], dim=16,
                      bottom=(512, 256, 64, 16), top=(512, 256, 1), batch=2048, pooling=1),
    # conf/mlperf_dcnv2 (DLRM-DCNv2 scaled): its 26 tables (x4 hash size), MLPerf's bag sizes
    "mlperf-dcnv2": dict(tables=[4 * c for c in scaled_cardinalities(0.0005, 1000)], dim=32,
                         bottom=(128, 64, 32), top=(256, 256, 128, 64, 1), batch=1024,
                         pooling=list(MLPERF_MULTI_HOT_SIZES), interaction="dcn",
                         dcn=dict(num_layers=3, low_rank=64)),
}
LR = 0.05


def model_config(cfg, precision="fp32") -> ModelConfig:
    return ModelConfig(embedding_dim=cfg["dim"], bottom_mlp=cfg["bottom"], top_mlp=cfg["top"],
                       interaction=cfg.get("interaction", "dot"), dense_precision=precision,
                       dcn=DCNConfig(**cfg.get("dcn", {})))


class PlainDLRM(nn.Module):
    """The baseline: what a PyTorch user writes without fbgemm (with ``dcn``: the DCN-v2
    low-rank cross layers written out in plain PyTorch, as TorchRec's LowRankCrossNet)."""

    def __init__(self, tables, dim, bottom, top, interaction="dot", dcn=None, sparse=True):
        super().__init__()
        self.interaction = interaction
        self.bottom = MLP(13, bottom)
        self.embs = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum", sparse=sparse)
                                  for n in tables)
        cfg = ModelConfig(embedding_dim=dim, bottom_mlp=bottom, top_mlp=top, interaction=interaction)
        n_in = interaction_dim(cfg, len(tables))
        self.top = MLP(n_in, top, last_activation=False)
        f = len(tables) + 1
        self.li, self.lj = torch.tril_indices(f, f, offset=-1)
        if interaction == "dcn":
            self.V = nn.ParameterList(nn.Parameter(nn.init.xavier_normal_(
                torch.empty(dcn["low_rank"], n_in))) for _ in range(dcn["num_layers"]))
            self.W = nn.ParameterList(nn.Parameter(nn.init.xavier_normal_(
                torch.empty(n_in, dcn["low_rank"]))) for _ in range(dcn["num_layers"]))
            self.b = nn.ParameterList(nn.Parameter(torch.zeros(n_in))
                                      for _ in range(dcn["num_layers"]))

    def forward(self, dense, sparse: SparseFeatures):
        x = self.bottom(dense)
        T, B = sparse.lengths.shape
        off = sparse.offsets()
        embs = [e(sparse.values[off[t * B]: off[(t + 1) * B]], off[t * B: (t + 1) * B] - off[t * B])
                for t, e in enumerate(self.embs)]
        if self.interaction == "dcn":
            x0 = xl = torch.cat([x] + embs, dim=1)
            for v, w, b in zip(self.V, self.W, self.b):
                xl = x0 * ((xl @ v.t()) @ w.t() + b) + xl
            return self.top(xl).squeeze(1)
        feats = torch.stack([x] + embs, dim=1)
        z = torch.bmm(feats, feats.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([x, z], dim=1)).squeeze(1)


def make_batches(cfg, n, seed=0, ids="zipf"):
    """``n`` batches of ``cfg``'s shape; ids Zipf(1.2) (a few hot rows, a long tail) or uniform
    over each table (every lookup a likely cache miss: what TorchRec's and the reference DLRM's
    random-data benchmarks draw)."""
    rng = np.random.default_rng(seed)
    ids_kind = ids
    out = []
    for _ in range(n):
        b = cfg["batch"]
        ids = []
        pool = cfg["pooling"]  # ids per bag: one number, or one per table (fixed-size bags)
        pool = pool if isinstance(pool, list) else [pool] * len(cfg["tables"])
        for rows, p in zip(cfg["tables"], pool):
            ids.append(np.minimum(rng.zipf(1.2, size=b * p) - 1, rows - 1) if ids_kind == "zipf"
                       else rng.integers(0, rows, size=b * p))
        lengths = np.repeat(np.asarray(pool, dtype=np.int64)[:, None], b, axis=1)
        sp = SparseFeatures(tuple(f"t{i}" for i in range(len(ids))),
                            torch.from_numpy(np.concatenate(ids).astype(np.int64)),
                            torch.from_numpy(lengths))
        out.append(Batch(torch.from_numpy(rng.normal(size=(b, 13)).astype(np.float32)), sp,
                         torch.from_numpy(rng.integers(0, 2, b).astype(np.float32)),
                         torch.arange(b)).to(DEVICE))
    return out


# the dense precisions measured: bf16 only where the CPU has bf16 units (main decides)
PRECISIONS = ("fp32", "bf16")
DEVICE = "cpu"


def ours(cfg, precision):
    """recscale's runtime for one process; timed through the training loop itself."""
    mcfg = model_config(cfg, precision)
    model = build_dlrm(mcfg, cfg["tables"], 13, EmbeddingOptimizerConfig("exact_sgd", LR),
                       device=DEVICE)
    tcfg = loop_config(dense_optimizer={"name": "sgd", "learning_rate": LR}, device=DEVICE)
    return LocalRuntime(model, tcfg, torch.device(DEVICE)), tcfg


def baseline(cfg, sparse=True):
    """``sparse=False``: dense table gradients (cheaper than sparse ones when the tables are
    small and the bags long, as in mlperf-dcnv2; the faster of the two is its baseline)."""
    torch.manual_seed(0)
    model = PlainDLRM(cfg["tables"], cfg["dim"], cfg["bottom"], cfg["top"],
                      cfg.get("interaction", "dot"), cfg.get("dcn"), sparse).to(DEVICE)
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


def time_steps(step, batches, steps, reps, warmup=3, clock=time.perf_counter, batch_size=None):
    batch_size = batch_size or batches[0].batch_size
    for b in batches[:warmup]:
        float(step(b))
    rates = []
    for _ in range(reps):
        t0 = clock()
        for i in range(steps):
            float(step(batches[i % len(batches)]))
        rates.append(steps * batch_size / (clock() - t0))
    return statistics.median(rates), rates


def mlp_flops_per_sample(cfg):
    mcfg = model_config(cfg)
    dims = [13, *cfg["bottom"]]
    macs = sum(a * b for a, b in zip(dims[:-1], dims[1:]))
    n_in = interaction_dim(mcfg, len(cfg["tables"]))
    if mcfg.interaction == "dcn":
        macs += mcfg.dcn.num_layers * 2 * n_in * mcfg.dcn.low_rank
    tdims = [n_in, *cfg["top"]]
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
    from recscale.runconfig import TrainConfig
    from recscale.scoring import evaluate_dlrm
    from recscale.train import train_dlrm

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
    for precision in PRECISIONS:
        res = train_dlrm(man, ModelConfig(dense_precision=precision), tcfg)
        m = evaluate_dlrm(res.model, man, "test", 16384, oracle)
        out[precision] = {"auc": m["auc"], "oracle_auc": m["oracle_auc"],
                          "normalized_entropy": m["normalized_entropy"],
                          "train_samples_per_s": res.result.samples_per_s}
    return out


def interleaved(name, cfg, batches, flops, args, rate32, rate16) -> dict:
    """The contenders (plain PyTorch with sparse and with dense table gradients, recscale fp32 and
    bf16, and TorchRec's DLRM_DCN in fp32 and bf16 where torchrec imports) timed in turn within
    each repetition, so a change of load on a shared machine hits all of them alike; ratios are
    medians of the per-repetition ratios. The faster plain variant is the plain baseline (dense
    gradients can win when the tables are small, bags long)."""
    sparse_step, dense_step = baseline(cfg), baseline(cfg, sparse=False)
    mine = {p: ours(cfg, p) for p in PRECISIONS}
    plain = {"sparse": sparse_step, "dense": dense_step}
    why_not = torchrec_baseline.available()
    if why_not is None:
        for p in PRECISIONS:
            step, convert = torchrec_baseline.torchrec_step(cfg, LR, p)
            plain[f"torchrec_{p}"] = (step, [convert(b) for b in batches])
    else:
        print(f"TorchRec's DLRM_DCN not measured ({why_not}); `make torchrec` installs it")
    for st in plain.values():
        st, bs = st if isinstance(st, tuple) else (st, batches)
        time_steps(st, bs, 1, 1, batch_size=cfg["batch"])
    for rt, tcfg in mine.values():
        time_loop(rt, batches, 1, 1, tcfg)
    rates = {k: [] for k in (*plain, *PRECISIONS)}
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    for _ in range(args.reps):
        for k, st in plain.items():
            st, bs = st if isinstance(st, tuple) else (st, batches)
            rates[k].append(time_steps(st, bs, args.steps, 1, 0, clock, cfg["batch"])[0])
        for p, (rt, tcfg) in mine.items():
            rates[p].append(time_loop(rt, batches, args.steps, 1, tcfg, 0, clock)[0])
    base_rates = [max(a, b) for a, b in zip(rates["sparse"], rates["dense"])]
    print(f"{name}: plain PyTorch with sparse table gradients "
          f"{statistics.median(rates['sparse']):,.0f} samples/s, with dense ones "
          f"{statistics.median(rates['dense']):,.0f}; the faster (per repetition) is the baseline")
    row = {"config": name, "baseline_samples_per_s": statistics.median(base_rates),
           "baseline_reps": base_rates, "baseline_sparse_grad_reps": rates["sparse"],
           "baseline_dense_grad_reps": rates["dense"]}
    for p, rate in (("fp32", rate32), ("bf16", rate16))[:len(PRECISIONS)]:
        limit = rate / flops
        med = statistics.median(rates[p])
        row[p] = {"samples_per_s": med, "reps": rates[p],
                  "ratio": statistics.median([o / b for o, b in zip(rates[p], base_rates)]),
                  "limit_samples_per_s": limit, "fraction_of_limit": med / limit}
    if why_not is None:
        tr = {}
        for p in PRECISIONS:
            trp = rates[f"torchrec_{p}"]
            # recscale at p over TorchRec at p, and recscale at p over TorchRec in fp32
            tr[p] = {"samples_per_s": statistics.median(trp), "reps": trp,
                     "ours_over_torchrec_same_precision": statistics.median(
                         [o / b for o, b in zip(rates[p], trp)]),
                     "ours_over_torchrec_fp32": statistics.median(
                         [o / b for o, b in zip(rates[p], rates["torchrec_fp32"])])}
        row["torchrec"] = tr
    return row


def quality_dcn(rows: int, out_dir: str) -> dict[str, dict]:
    """Test AUC of fp32 vs bf16 for the mlperf-dcnv2 config on conf/mlperf_dcnv2's multi-hot
    synthetic data (same seed, same data, the same optimizers as that config)."""
    from recscale.data.multihot import generate_multihot_parquet, preprocess_multihot
    from recscale.data.preprocess import PreprocessConfig, load_manifest
    from recscale.data.synthetic import SyntheticConfig
    from recscale.runconfig import TrainConfig
    from recscale.scoring import evaluate_dlrm
    from recscale.train import train_dlrm

    scfg = SyntheticConfig(num_rows=rows, multi_hot=True, cardinality_scale=0.0005)
    rep = generate_multihot_parquet(scfg, f"{out_dir}/multihot_{rows}/day_00.parquet")
    pq_dir = f"{out_dir}/multihot_parquet_{rows}"
    try:
        man = load_manifest(pq_dir)
    except FileNotFoundError:
        preprocess_multihot([rep.path], pq_dir, PreprocessConfig(row_group_size=16384),
                            rep.cardinalities)
        man = load_manifest(pq_dir)
    oracle = np.load(rep.oracle_path, mmap_mode="r")
    tcfg = TrainConfig(progress="off", batch_size_per_rank=1024,
                       dense_optimizer=DenseOptimizerConfig("adam", 0.001),
                       embedding_optimizer=EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.05))
    out = {}
    for precision in PRECISIONS:
        res = train_dlrm(man, model_config(CONFIGS["mlperf-dcnv2"], precision), tcfg)
        m = evaluate_dlrm(res.model, man, "test", 8192, oracle)
        out[precision] = {"auc": m["auc"], "oracle_auc": m["oracle_auc"],
                          "normalized_entropy": m["normalized_entropy"],
                          "train_samples_per_s": res.result.samples_per_s}
    return out


def print_quality(title: str, q: dict) -> None:
    print(f"\n{title}")
    print("| dense precision | test AUC | oracle AUC | NE | train samples/s |")
    print("|---|---|---|---|---|")
    for p, m in q.items():
        print(f"| {p} | {m['auc']:.4f} | {m['oracle_auc']:.4f} | {m['normalized_entropy']:.4f} | "
              f"{m['train_samples_per_s']:,.0f} |")
    if "bf16" in q:
        print(f"bf16 - fp32 AUC: {q['bf16']['auc'] - q['fp32']['auc']:+.4f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--steps", type=int, default=15, help="timed steps per repetition")
    ap.add_argument("--reps", type=int, default=5, help="repetitions (the median is reported)")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: all cores)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--ids", default="zipf", choices=["zipf", "uniform"],
                    help="the batches' ids: Zipf(1.2) or uniform over each table (as other "
                         "trainers' random-data benchmarks draw them)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--quality-rows", type=int, default=2_000_000,
                    help="rows of default synthetic data for the fp32-vs-bf16 AUC check (0: skip)")
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="mlperf-dcnv2: samples per wall second, or per CPU second of this "
                         "process (steadier on a shared machine; use with --threads 1)")
    ap.add_argument("--dcn-quality-rows", type=int, default=0,
                    help="rows of multi-hot synthetic data for the mlperf-dcnv2 fp32-vs-bf16 AUC "
                         "check (0: skip)")
    ap.add_argument("--out-dir", default="benchmarks/out", help="where the quality data goes")
    args = ap.parse_args(argv)
    global DEVICE, PRECISIONS
    DEVICE = args.device
    if args.threads:
        torch.set_num_threads(args.threads)
    why_no_bf16 = bf16_warning("bf16", DEVICE)
    if why_no_bf16:
        PRECISIONS = ("fp32",)
        print(f"bf16 not measured: {why_no_bf16}. A bf16 column here would time torch's "
              "emulation, not recscale.")
    rate32 = matmul_rate(torch.float32)
    rate16 = matmul_rate(torch.bfloat16) if "bf16" in PRECISIONS else float("nan")
    print(f"ids: {args.ids}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; 2048x512x512 matmul: "
          f"fp32 {rate32 / 1e9:.0f} GFLOP/s, bf16 {rate16 / 1e9:.0f} GFLOP/s")
    results = []
    for name in args.configs:
        cfg = CONFIGS[name]
        batches = make_batches(cfg, 8, ids=args.ids)
        flops = mlp_flops_per_sample(cfg)
        if cfg.get("interaction") == "dcn":
            results.append(interleaved(name, cfg, batches, flops, args, rate32, rate16))
            continue
        base, base_all = time_steps(baseline(cfg), batches, args.steps, args.reps)
        row = {"config": name, "baseline_samples_per_s": base, "baseline_reps": base_all}
        for precision, rate in (("fp32", rate32), ("bf16", rate16))[:len(PRECISIONS)]:
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
        f, b = r["fp32"], r.get("bf16")
        bf = (f"{b['samples_per_s']:,.0f} | {b['ratio']:.2f}x | {b['fraction_of_limit']:.0%}"
              if b else "not measured (no bf16 units) | | ")
        print(f"| {r['config']} | {r['baseline_samples_per_s']:,.0f} | {f['samples_per_s']:,.0f} | "
              f"{f['ratio']:.2f}x | {f['fraction_of_limit']:.0%} | {bf} |")
    trows = [r for r in results if "torchrec" in r and "bf16" in r["torchrec"]]
    if trows:
        print()
        print("| config | TorchRec DLRM_DCN fp32 | recscale fp32 | ratio | TorchRec bf16 "
              "| recscale bf16 | ratio (vs TorchRec bf16) | ratio (vs TorchRec fp32) |")
        print("|---|---|---|---|---|---|---|---|")
        for r in trows:
            t32, t16 = r["torchrec"]["fp32"], r["torchrec"]["bf16"]
            print(f"| {r['config']} | {t32['samples_per_s']:,.0f} | {r['fp32']['samples_per_s']:,.0f} "
                  f"| {t32['ours_over_torchrec_same_precision']:.2f}x | {t16['samples_per_s']:,.0f} "
                  f"| {r['bf16']['samples_per_s']:,.0f} "
                  f"| {t16['ours_over_torchrec_same_precision']:.2f}x "
                  f"| {t16['ours_over_torchrec_fp32']:.2f}x |")
    q = quality(args.quality_rows, args.out_dir) if args.quality_rows else None
    if q:
        print_quality(f"quality on {args.quality_rows:,} synthetic rows (test split, 1 epoch):", q)
    qd = quality_dcn(args.dcn_quality_rows, args.out_dir) if args.dcn_quality_rows else None
    if qd:
        print_quality(f"mlperf-dcnv2 quality on {args.dcn_quality_rows:,} multi-hot synthetic rows "
                      "(test split, 1 epoch):", qd)
    print(f"\nmedian of {args.reps} repetitions x {args.steps} steps; command: "
          f"python benchmarks/bench_train.py {' '.join(sys.argv[1:])}".rstrip())
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"matmul_gflops": {"fp32": rate32 / 1e9, "bf16": rate16 / 1e9},
                       "results": results, "quality": q, "dcn_quality": qd}, fh, indent=2)
    return results


if __name__ == "__main__":
    main()
