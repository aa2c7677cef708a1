"""Preprocessing engines side by side: rows/s and peak memory of the pyarrow engine (2 worker
processes, one per day file) and the Spark engine (local[2]) on the same synthetic days, in
``hash`` and ``vocab`` modes, in one run. Each measurement runs in a fresh process; starting
the Spark session (a JVM, seconds) is outside the timed part, the pyarrow engine's worker start
inside it. Memory: the driver's peak RSS (the Python process that calls preprocess_criteo), and
the executors' (pyarrow: the largest worker process; Spark local mode: the JVM, which is driver
and executor at once, plus its Python workers, summed).

    nice -n 5 python benchmarks/bench_preprocess.py                     # 2M and 20M rows
    nice -n 5 python benchmarks/bench_preprocess.py --rows 2000000 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

GEN = r"""
import sys
from recscale.data.synthetic import SyntheticConfig, generate_criteo_tsv
rows, out = int(sys.argv[1]), sys.argv[2]
for day in (0, 1):  # two days of rows/2, so the pyarrow engine's two workers both have a file
    generate_criteo_tsv(SyntheticConfig(num_rows=rows // 2, seed=day), f"{out}/day_{day:02d}.tsv")
"""

RUN = r"""
import json, os, resource, sys, time
from recscale.data.preprocess import PreprocessConfig, preprocess_criteo
from recscale.data.vocab import VocabConfig
engine, ids, src, out = sys.argv[1:5]
files = [f"{src}/day_00.tsv", f"{src}/day_01.tsv"]
spark = None
if engine == "spark":
    from recscale.data.spark_session import SparkConfig, make_spark_session
    spark = make_spark_session(SparkConfig(master="local[2]", conf={
        "spark.ui.enabled": "false", "spark.driver.memory": "2g",
        "spark.sql.shuffle.partitions": "4"}))
cfg = PreprocessConfig(engine=engine, ids=ids, workers=2, vocab=VocabConfig(min_count=2),
                       table_sizes=None if ids == "vocab" else (1_000_000,) * 26)
t = time.perf_counter()
rep = preprocess_criteo(files, out, cfg, spark=spark)
dt = time.perf_counter() - t

def tree(root):
    kids = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(p))
    todo, seen = [root], []
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            seen.append(c)
            todo.append(c)
    return seen

def hwm(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0

driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if engine == "spark":
    executors = sum(hwm(p) for p in tree(os.getpid()))
else:
    executors = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"seconds": dt, "rows_per_s": rep.lines_read / dt, "lines": rep.lines_read,
                  "driver_peak": driver, "executor_peak": executors}))
if spark is not None:
    spark.stop()
"""


def _run(engine: str, ids: str, src: str, out: str) -> dict:
    res = subprocess.run([sys.executable, "-c", RUN, engine, ids, src, out], capture_output=True,
                         text=True, timeout=7200)
    if res.returncode:
        raise RuntimeError(f"{engine}/{ids} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[2_000_000, 20_000_000])
    ap.add_argument("--reps", type=int, default=3, help="repetitions (median reported)")
    ap.add_argument("--reps-large", type=int, default=1, help="repetitions above 5M rows")
    ap.add_argument("--modes", nargs="+", default=["hash", "vocab"], choices=["hash", "vocab"])
    ap.add_argument("--out", default="data/08_reporting/bench_preprocess")
    args = ap.parse_args()
    mb = 1 << 20
    table = []
    for rows in args.rows:
        src = os.path.join(args.out, f"tsv_{rows}")
        subprocess.run([sys.executable, "-c", GEN, str(rows), src], check=True)
        reps = args.reps if rows <= 5_000_000 else args.reps_large
        for ids in args.modes:
            med = {}
            for engine in ("pyarrow", "spark"):
                runs = [_run(engine, ids, src, os.path.join(args.out, f"pq_{engine}_{ids}"))
                        for _ in range(reps)]
                for r in runs:
                    print(json.dumps({"rows": rows, "ids": ids, "engine": engine, **r}), flush=True)
                med[engine] = {k: statistics.median(r[k] for r in runs)
                               for k in ("rows_per_s", "driver_peak", "executor_peak")}
            ratio = med["spark"]["rows_per_s"] / med["pyarrow"]["rows_per_s"]
            table.append((rows, ids, med, ratio, reps))
    print("\n| rows | ids | pyarrow rows/s | Spark local[2] rows/s | Spark / pyarrow | "
          "driver peak MiB (pyarrow / Spark) | executor peak MiB (pyarrow / Spark) | reps |")
    print("|---|---|---|---|---|---|---|---|")
    for rows, ids, med, ratio, reps in table:
        p, s = med["pyarrow"], med["spark"]
        print(f"| {rows:,} | {ids} | {p['rows_per_s']:,.0f} | {s['rows_per_s']:,.0f} | "
              f"{ratio:.2f}x | {p['driver_peak'] / mb:,.0f} / {s['driver_peak'] / mb:,.0f} | "
              f"{p['executor_peak'] / mb:,.0f} / {s['executor_peak'] / mb:,.0f} | {reps} |")


if __name__ == "__main__":
    main()
