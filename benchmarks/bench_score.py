"""Batch scoring of raw rows: rows/s and peak memory, against preprocessing then scoring.

The input is the default config's test split as raw Criteo TSV lines (the default synthetic
data's settings, 10% of its 2M rows: 200,000 lines), and the same drawn twice as long (2x).
The model is the default config's (its default tables from the default preprocessing's sizes,
weights at random: the speed does not depend on them). Each run is a fresh process, timed from
the raw file to the scores on disk, its peak RSS from the kernel (ru_maxrss):

- ``raw``: ``recscale.scoring.files.score_files`` on the raw lines (what
  ``kedro run --pipeline=score`` runs: the Criteo reader, the encoder, the model, a parquet of
  row, score, label, error), on the 1x and on the 2x input;
- ``baseline``: what a user without raw scoring does with the same lines: preprocess them
  (``preprocess_criteo``, one worker) and score the parquet with the evaluation path
  (``score_split``).

Interleaved: raw 1x, raw 2x, baseline, then again, ``--reps`` times; prints every run, the
medians, raw / baseline rows/s, and the 2x peak over the 1x peak (flat: within 1.10).

    python benchmarks/bench_score.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
import torch, yaml
from recscale.config import parse, to_dict
from recscale.runconfig import DLRMConfig
from recscale.data.processed import criteo_fitted
from recscale.model.convert import recipe_from_resolved

mode, raw, work, conf = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
sizes = json.loads(Path(sys.argv[5]).read_text())
params = yaml.safe_load((conf / "base" / "parameters_dlrm.yml").read_text())
params = {k: v for k, v in params.items() if k in DLRMConfig.__dataclass_fields__}
params["preprocess"].update(output_dir=str(work / "pq"), workers=1)
cfg = parse(DLRMConfig, params, "")
resolved = {"model": to_dict(cfg.model), "schema": criteo_fitted(sizes).to_dict(),
            "train": to_dict(cfg.train), "preprocess": to_dict(cfg.preprocess),
            "evaluate": to_dict(cfg.evaluate)}
torch.manual_seed(0)
model = recipe_from_resolved(resolved).build("cpu")
t0 = time.perf_counter()
if mode == "raw":
    from recscale.scoring.files import score_files
    from recscale.scoring.raw import RawScorer

    scorer = RawScorer.load(resolved, model.state_dict())
    rep = score_files(scorer, [raw], work / "scores.parquet", "criteo_tsv")
    rows = rep.rows_scored
else:
    from recscale.data.preprocess import preprocess_criteo
    from recscale.scoring import score_split

    man = json.loads(Path(preprocess_criteo([raw], work / "pq", cfg.preprocess,
                                            table_size_hint=None).manifest_path).read_text())
    man["splits"]["all"] = {
        "files": [f for s in ("train", "validation", "test") for f in man["splits"][s]["files"]],
        "rows": man["rows_written"]}
    rows = len(score_split(model, man, "all", cfg.evaluate.batch_size).probs)
seconds = time.perf_counter() - t0
print(json.dumps({"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

SETUP = r"""
import json, sys
from pathlib import Path
import yaml
from recscale.config import parse
from recscale.runconfig import DLRMConfig
from recscale.data.synthetic import generate_criteo_tsv
import dataclasses

work, conf, rows = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
params = yaml.safe_load((conf / "base" / "parameters_dlrm.yml").read_text())
params = {k: v for k, v in params.items() if k in DLRMConfig.__dataclass_fields__}
cfg = parse(DLRMConfig, params, "")
out = {}
for name, n in (("1x", rows), ("2x", 2 * rows)):
    syn = dataclasses.replace(cfg.data.synthetic, num_rows=n)
    rep = generate_criteo_tsv(syn, work / f"raw_{name}" / "day.tsv")
    out[name] = rep.path
    sizes = cfg.preprocess.resolve_table_sizes(rep.cardinalities)
(work / "sizes.json").write_text(json.dumps(list(sizes)))
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=200_000,
                    help="the 1x input's lines (default: the default config's test split)")
    ap.add_argument("--conf", default=str(Path(__file__).resolve().parents[1] / "conf"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        raws = json.loads(subprocess.run([sys.executable, "-c", SETUP, str(work), args.conf,
                                          str(args.rows)], check=True, capture_output=True,
                                         text=True, timeout=1800).stdout.strip().splitlines()[-1])
        runs: dict[str, list[dict]] = {"raw 1x": [], "raw 2x": [], "baseline 1x": []}
        for rep in range(args.reps):
            for name in runs:
                mode, size = name.split()
                w = work / f"{name.replace(' ', '_')}_{rep}"
                w.mkdir()
                res = subprocess.run([sys.executable, "-c", CHILD, mode, raws[size], str(w),
                                      args.conf, str(work / "sizes.json")], capture_output=True,
                                     text=True, timeout=1800)
                if res.returncode:
                    sys.exit(f"{name} failed:\n{res.stderr[-3000:]}")
                got = json.loads(res.stdout.strip().splitlines()[-1])
                runs[name].append(got)
                print(f"rep {rep} {name:12s} {got['rows']:>9,} rows {got['seconds']:7.2f} s "
                      f"{got['rows_per_s']:>10,.0f} rows/s  peak {got['peak_rss_mb']:7.0f} MB",
                      flush=True)
    med = {n: {k: statistics.median(r[k] for r in rs) for k in ("rows_per_s", "peak_rss_mb")}
           for n, rs in runs.items()}
    print(f"\nmedians over {args.reps} interleaved reps:")
    for n, m in med.items():
        print(f"  {n:12s} {m['rows_per_s']:>10,.0f} rows/s  peak {m['peak_rss_mb']:7.0f} MB")
    print(f"raw / baseline rows/s (1x): {med['raw 1x']['rows_per_s'] / med['baseline 1x']['rows_per_s']:.2f}")
    print(f"peak RSS 2x / 1x (raw): {med['raw 2x']['peak_rss_mb'] / med['raw 1x']['peak_rss_mb']:.3f}"
          f" (range {min(r['peak_rss_mb'] for r in runs['raw 2x']) / max(r['peak_rss_mb'] for r in runs['raw 1x']):.3f}"
          f"-{max(r['peak_rss_mb'] for r in runs['raw 2x']) / min(r['peak_rss_mb'] for r in runs['raw 1x']):.3f})")


if __name__ == "__main__":
    main()
