"""The feature schema's cost on the default config, and a wide schema's preprocessing rate.

1. Default config (the Criteo preset, synthetic 2M rows): preprocessing rows/s (pyarrow engine,
   the default 2 workers) and training samples/s (one epoch, one process, the default model),
   this tree against another checkout (``--before``: its ``src``, e.g. a worktree of the commit
   before the schema), interleaved: before, after, before, after, ... ``--reps`` times each, every
   run in a fresh process. Prints each run, the medians and after / before.
   The config is each tree's own conf/base/parameters_dlrm.yml (2M rows, the default model),
   one epoch.
2. ``--wide``: a 40-feature schema (10 dense, 20 categorical of which half string ids, 10
   multi-hot lists of mean length 8) drawn by the schema generator, preprocessed by
   ``recscale.data.table_preprocess``: rows/s over ``--reps`` runs (median).

    python benchmarks/bench_schema.py --before ../before/src --reps 3 --wide
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time, logging
from pathlib import Path
from recscale.config import parse
from recscale.runconfig import DLRMConfig
from recscale.data.synthetic import generate_criteo_tsv
from recscale.data.preprocess import preprocess_criteo
from recscale.train.entry import train_dlrm

import yaml
work, conf = Path(sys.argv[1]), Path(sys.argv[2])
params = yaml.safe_load((conf / "base" / "parameters_dlrm.yml").read_text())
params = {k: v for k, v in params.items() if k in {f for f in DLRMConfig.__dataclass_fields__}}
params["train"].update(progress="off", epochs=1)
params["preprocess"]["output_dir"] = str(work / "pq")
cfg = parse(DLRMConfig, params, "")  # the tree's own default config
raw = generate_criteo_tsv(cfg.data.synthetic, work / "raw" / "day_00.tsv")
t0 = time.perf_counter()
rep = preprocess_criteo([raw.path], work / "pq", cfg.preprocess,
                        table_size_hint=raw.cardinalities)
pre_s = time.perf_counter() - t0
manifest = json.loads(Path(rep.manifest_path).read_text())
out = train_dlrm(manifest, cfg.model, cfg.train)
print(json.dumps({"preprocess_rows_per_s": rep.lines_read / pre_s,
                  "train_samples_per_s": out.result.samples / out.result.step_seconds
                  if out.result.step_seconds else 0.0,
                  "train_wall_samples_per_s": out.result.samples / out.result.wall_seconds}))
"""

WIDE = r"""
import json, sys, time
from pathlib import Path
from recscale.config import parse
from recscale.data.processed import PreprocessConfig
from recscale.data.schema import parse_features
from recscale.data.synthetic_table import TableSynthConfig, generate_table
from recscale.data.preprocess import preprocess_table

work, rows = Path(sys.argv[1]), int(sys.argv[2])
dense = [{"name": f"d{i}", "transforms": ["log1p", "standardize"] if i % 2 else
          ["log1p", {"clip": [0, 10]}]} for i in range(10)]
cat = [{"name": f"c{i}", "id_type": "string" if i % 2 else "int",
        "ids": "vocab" if i % 4 == 0 else "hash"} for i in range(20)]
bags = [{"name": f"m{i}", "kind": "multi_hot", "max_len": 16, "truncate": "keep_last"}
        for i in range(10)]
schema = parse_features({"dense": dense, "sparse": cat + bags})
gen = parse(TableSynthConfig, {"num_rows": rows, "features": {
    **{f"c{i}": {"cardinality": 5000} for i in range(20)},
    **{f"m{i}": {"cardinality": 2000, "pooling": 8.0} for i in range(10)}}}, "data.generator")
raw = generate_table(schema, gen, work / "wide.parquet")
t0 = time.perf_counter()
rep = preprocess_table([raw.path], work / "out", PreprocessConfig(output_dir=str(work / "out"),
                       max_table_size=100000), schema)
print(json.dumps({"rows_per_s": rep.lines_read / (time.perf_counter() - t0)}))
"""


def run_child(code: str, src: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=src)
    res = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                         text=True, timeout=1800)
    if res.returncode:
        raise RuntimeError(f"child on {src} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", help="src folder of the checkout to compare with")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--wide", action="store_true")
    ap.add_argument("--wide-rows", type=int, default=500_000)
    a = ap.parse_args()
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    keys = ("preprocess_rows_per_s", "train_samples_per_s", "train_wall_samples_per_s")
    if a.before:
        got: dict[str, list[dict]] = {"before": [], "after": []}
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(a.reps):
                for name, src in (("before", a.before), ("after", here)):
                    r = run_child(CHILD, src, os.path.join(tmp, name),
                                  os.path.join(os.path.dirname(src), "conf"))
                    got[name].append(r)
                    print(f"run {rep + 1} {name:6s} " + "  ".join(
                        f"{k} {r[k]:,.0f}" for k in keys), flush=True)
        print("\nmedians (interleaved runs, each in a fresh process)")
        for k in keys:
            b = statistics.median(r[k] for r in got["before"])
            f = statistics.median(r[k] for r in got["after"])
            lo_b, hi_b = min(r[k] for r in got["before"]), max(r[k] for r in got["before"])
            lo_f, hi_f = min(r[k] for r in got["after"]), max(r[k] for r in got["after"])
            print(f"{k:26s} before {b:10,.0f} [{lo_b:,.0f}-{hi_b:,.0f}]  after {f:10,.0f} "
                  f"[{lo_f:,.0f}-{hi_f:,.0f}]  after/before {f / b:.3f}")
    if a.wide:
        with tempfile.TemporaryDirectory() as tmp:
            rates = [run_child(WIDE, here, tmp, str(a.wide_rows))["rows_per_s"]
                     for _ in range(a.reps)]
        print(f"\n40-feature schema (10 dense, 20 categorical, 10 multi-hot of mean length 8), "
              f"{a.wide_rows:,} rows: preprocessing {statistics.median(rates):,.0f} rows/s "
              f"(median of {a.reps}; {', '.join(f'{r:,.0f}' for r in rates)})")


if __name__ == "__main__":
    main()
