"""Tiered embeddings vs all in memory: DLRM training samples/s and cache hit rate with the tables
on the DDR or SSD tier behind a cache of 5%, 20% and 50% of their rows, Zipf-distributed ids.
Every configuration trains on the same batches in the same run, interleaved repetition by
repetition; samples/s is the median over repetitions, the ratio is against the in-memory median.

    python benchmarks/bench_tiers.py                      # the table in docs/results.md
    python benchmarks/bench_tiers.py --rows 50000 --reps 1 --steps 5   # a quick look

The SSD tier is a memory-mapped file under --scratch (default: the system temp directory) with
its write-back journal; on a machine with free RAM the file sits in the OS page cache, so this
measures the software path (cache bookkeeping, batched reads and write-backs, journal), not the
drive's random-read latency.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from loop_timing import loop_config, run_steps  # this folder
from recscale.data.batch import Batch, SparseFeatures
from recscale.embedding import (
    EmbeddingOptimizerConfig,
    FusedEmbeddingBags,
    TierConfig,
    TieredEmbeddingBags,
)
from recscale.model import DLRM, ModelConfig
from recscale.train.runtime import LocalRuntime

NUM_DENSE = 13


def zipf_batches(n, tables, rows, batch, a, seed=0):
    """Batches of one id per sample and table (Criteo-like): the id of popularity rank k has
    probability proportional to k**-a (k = 1..rows), ranks scattered over the table by a random
    permutation; plus random dense features and labels."""
    rng = np.random.default_rng(seed)
    perms = [rng.permutation(rows) for _ in range(tables)]
    cdf = np.cumsum(np.arange(1, rows + 1, dtype=np.float64) ** -a)
    cdf /= cdf[-1]
    out = []
    for _ in range(n):
        ids = np.concatenate([perms[t][np.minimum(np.searchsorted(cdf, rng.random(batch)), rows - 1)]
                              for t in range(tables)])
        sparse = SparseFeatures(tuple(f"t{t}" for t in range(tables)), torch.from_numpy(ids),
                                torch.ones(tables, batch, dtype=torch.int64))
        out.append(Batch(torch.from_numpy(rng.normal(size=(batch, NUM_DENSE)).astype(np.float32)),
                         sparse, torch.from_numpy(rng.integers(0, 2, batch).astype(np.float32)),
                         torch.arange(batch)))
    return out


class Runner:
    """One model and its position in the shared batch sequence. ``dlrm``: the whole training
    step (MLPs, interaction, dense optimizer) through recscale's training loop, which prefetches
    the next batch's rows; else the embeddings alone (forward, and backward with the fused update,
    from a fixed random output gradient, the next batch prefetched by hand), which isolates the
    tiers' cost."""

    def __init__(self, name, emb, args, cfg, dlrm=True):
        self.name, self.emb, self.dlrm = name, emb, dlrm
        if dlrm:
            self.model = DLRM(NUM_DENSE, args.tables, cfg, emb, seed=0)
            self.cfg = loop_config(dense_optimizer={"name": "adagrad", "learning_rate": 0.01},
                                   device="cpu")
            self.rt = LocalRuntime(self.model, self.cfg, torch.device("cpu"))
        else:
            grad = torch.randn(args.batch, args.tables * args.dim,
                               generator=torch.Generator().manual_seed(0))

            def step(b):
                out = emb(b.sparse)
                (out * grad).sum().backward()
                return out.detach()[0, 0]

            self.step = step
        self.samples_per_s: list[float] = []
        self.hits = self.lookups = 0
        self.i = 0

    def run(self, batches, steps, timed=True):
        s0 = self.emb.tier_stats()  # {} in memory
        t0 = time.perf_counter()
        if self.dlrm:
            run_steps(self.rt, batches, steps, self.cfg, start=self.i)
            self.i += steps
        else:
            for _ in range(steps):
                b = batches[self.i % len(batches)]
                self.emb.prefetch(batches[(self.i + 1) % len(batches)].sparse)
                float(self.step(b))
                self.i += 1
        dt = time.perf_counter() - t0
        if timed:
            self.samples_per_s.append(steps * batches[0].batch_size / dt)
            if s0:
                s1 = self.emb.tier_stats()
                self.hits += s1["hits"] - s0["hits"]
                self.lookups += s1["lookups"] - s0["lookups"]


def report(runners, args, what, seconds):
    base = statistics.median(runners[0].samples_per_s)
    print(f"\n{what}: median of {args.reps} x {args.steps} steps after {args.warmup} warm-up "
          f"steps ({seconds:.0f} s so far)\n")
    print("| embeddings | policy | cache rows / table rows | samples/s | vs in memory | hit rate |")
    print("|---|---|---|---|---|---|")
    for r in runners:
        med = statistics.median(r.samples_per_s)
        load = "-" if not hasattr(r.emb, "cache_rows") else f"{r.emb.cache_rows[0] / args.rows:.2f}"
        hit = f"{r.hits / r.lookups:.3f}" if r.lookups else "-"
        tier, _, policy = r.name.partition(" ")
        print(f"| {tier if r.lookups else r.name} | {policy if r.lookups else '-'} | {load} | "
              f"{med:,.0f} | {med / base:.2f}x | {hit} |")
    print("\nrange over repetitions (samples/s): "
          + "; ".join(f"{r.name} {getattr(r.emb, 'cache_rows', [args.rows])[0] / args.rows:.2f}: "
                      f"{min(r.samples_per_s):,.0f}-{max(r.samples_per_s):,.0f}" for r in runners))
    for r in runners:
        s = r.emb.tier_stats()
        if s:
            print(f"  {r.name} {r.emb.cache_rows[0] / args.rows:.2f}: background prefetch "
                  f"{s['prefetch_seconds']:.2f} s, forward waited for it "
                  f"{s['prefetch_wait_seconds']:.2f} s, loading in forward {s['load_seconds']:.2f} s; "
                  f"rows read {s['rows_read']:,}, written back {s['rows_written']:,}")
        r.emb.close()
    sys.stdout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", type=int, default=8)
    ap.add_argument("--rows", type=int, default=100_000, help="rows per table")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--zipf", type=float, default=1.05, help="Zipf exponent of the ids")
    ap.add_argument("--mode", choices=["both", "dlrm", "embeddings"], default="both")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per repetition")
    ap.add_argument("--warmup", type=int, default=100,
                    help="untimed steps first (until the caches are in steady state)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--loads", type=float, nargs="+", default=[0.05, 0.2, 0.5])
    ap.add_argument("--scratch", default="")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    scratch = args.scratch or tempfile.gettempdir()
    os.makedirs(scratch, exist_ok=True)
    rows, dims = [args.rows] * args.tables, [args.dim] * args.tables
    opt = EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.05)
    cfg = ModelConfig(embedding_dim=args.dim, bottom_mlp=(512, 256, args.dim),
                      top_mlp=(512, 256, 1))
    batches = zipf_batches(args.warmup + args.steps * args.reps + 1, args.tables, args.rows,
                           args.batch, args.zipf)

    def tiered(tier, load, policy="lru", prefetch=True):
        return TieredEmbeddingBags(rows, dims, opt, config=TierConfig(
            tier=tier, cache_fraction=load, policy=policy, prefetch=prefetch,
            scratch_dir=scratch, min_cache_rows=1))

    t0 = time.perf_counter()
    modes = {"both": [False, True], "dlrm": [True], "embeddings": [False]}[args.mode]
    print(f"{args.tables} tables x {args.rows:,} rows x dim {args.dim} (row-wise Adagrad; "
          f"{args.tables * args.rows * (args.dim + 1) * 4 / 1e9:.2f} GB with state), batch "
          f"{args.batch}, one id per table and sample, Zipf {args.zipf} over each table's rows; "
          f"torch threads {torch.get_num_threads()}", flush=True)
    for dlrm in modes:
        runners = [Runner("in memory (FusedEmbeddingBags)", FusedEmbeddingBags(rows, dims, opt),
                          args, cfg, dlrm)]
        for tier in ("ddr", "ssd"):
            for load in args.loads:
                runners.append(Runner(f"{tier} lru", tiered(tier, load), args, cfg, dlrm))
        if 0.2 in args.loads:
            runners.append(Runner("ssd lfu", tiered("ssd", 0.2, "lfu"), args, cfg, dlrm))
            runners.append(Runner("ssd lru, no prefetch", tiered("ssd", 0.2, prefetch=False),
                                  args, cfg, dlrm))
        for r in runners:
            r.run(batches, args.warmup, timed=False)
        for _ in range(args.reps):
            for r in runners:
                r.run(batches, args.steps)
        report(runners, args, "DLRM training step" if dlrm else "embeddings only "
               "(forward + fused backward/update)", time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
