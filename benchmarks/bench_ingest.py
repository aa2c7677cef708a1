"""Ingestion at scale: preprocessing rows/s and peak memory for 1M and 10M synthetic rows (peak
memory must stay flat as the input grows), and the torchdata loader's samples/s against the
trainer's consumption on kaggle-small, in one run.

    python benchmarks/bench_ingest.py                     # 1M and 10M rows (about 10 minutes)
    python benchmarks/bench_ingest.py --rows 1000000 3000000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

GEN = r"""
import sys
from recscale.data.synthetic import SyntheticConfig, generate_criteo_tsv
rows, out = int(sys.argv[1]), sys.argv[2]
generate_criteo_tsv(SyntheticConfig(num_rows=rows), f"{out}/tsv_{rows}/day_00.tsv")
"""

PRE = r"""
import json, resource, sys, time
from recscale.data.preprocess import PreprocessConfig, preprocess_criteo
from recscale.data.synthetic import SyntheticConfig, generate_criteo_tsv
rows, out = int(sys.argv[1]), sys.argv[2]
rep = generate_criteo_tsv(SyntheticConfig(num_rows=rows), f"{out}/tsv_{rows}/day_00.tsv")  # reused
t = time.perf_counter()
pre = preprocess_criteo([rep.path], f"{out}/pq_{rows}", PreprocessConfig(), rep.cardinalities)
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"rows": rows, "seconds": dt, "rows_per_s": pre.lines_read / dt,
                  "tsv_bytes": __import__("os").path.getsize(rep.path), "peak_rss": peak}))
"""


def preprocess_run(rows: int, out: str) -> dict:
    """Generate in one process, preprocess in a fresh one, so its peak RSS is preprocessing's
    own (the generator's file is found by its config fingerprint and reused)."""
    subprocess.run([sys.executable, "-c", GEN, str(rows), out], check=True, capture_output=True)
    res = subprocess.run([sys.executable, "-c", PRE, str(rows), out], capture_output=True,
                         text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def loader_rate(files, batch_size=2048, workers=2, max_batches=None) -> float:
    from recscale.data.loader import LoaderConfig, make_loader

    loader = make_loader(files, LoaderConfig(batch_size=batch_size, reader_workers=workers))
    n, t = 0, time.perf_counter()
    for i, b in enumerate(loader):
        n += b.batch_size
        if max_batches and i + 1 >= max_batches:
            break
    return n / (time.perf_counter() - t)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", type=int, default=[1_000_000, 10_000_000])
    ap.add_argument("--out-dir", default="benchmarks/out/ingest")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    runs = [preprocess_run(r, args.out_dir) for r in args.rows]
    print("| rows | TSV size | preprocessing rows/s | seconds | peak RSS |")
    print("|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['rows']:,} | {r['tsv_bytes'] / 1e9:.2f} GB | {r['rows_per_s']:,.0f} | "
              f"{r['seconds']:.1f} | {r['peak_rss'] / 2**20:,.0f} MiB |")
    sys.path.insert(0, os.path.dirname(__file__))
    import bench_train as bt
    from recscale.data.preprocess import load_manifest

    files = load_manifest(f"{args.out_dir}/pq_{args.rows[0]}")["splits"]["train"]["files"]
    ingest = loader_rate(files, max_batches=200)
    cfg = bt.CONFIGS["kaggle-small"]
    train_rate, _ = bt.time_steps(bt.ours(cfg, "fp32"), bt.make_batches(cfg, 8), 15, 3)
    print(f"\nloader (parquet row groups -> 2 reader threads -> batches of 2048, 26 sparse "
          f"features): {ingest:,.0f} samples/s")
    print(f"trainer consumption (kaggle-small, fp32, 2 threads): {train_rate:,.0f} samples/s")
    print(f"ingestion / training = {ingest / train_rate:.1f}x (goal >= 3x)")
    print(f"\ncommand: python benchmarks/bench_ingest.py {' '.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
