"""The nightly retrain's sharded training against a ``dlrm`` run's, on the same data and plan.

One synthetic day (the default synthetic settings, ``--rows`` lines) preprocessed once, one
sharding plan for ``--world`` ranks on this host (``plan_for_run``, as both pipelines plan).
Then, interleaved, ``--reps`` times each, every run in a fresh process:

- ``dlrm``: ``train_dlrm`` on the plan, from scratch (what ``kedro run --pipelines=dlrm`` trains);
- ``retrain``: ``train_warm`` on the plan, warm-started from the first dlrm run's checkpoint
  (what ``dlrm_retrain`` trains: its tables and both optimizers' state read by offset).

Prints each run's samples/s in the step (the training loop's own measure, warm-up excluded) and
of the wall, the medians and retrain / dlrm.

    python benchmarks/bench_retrain.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

COMMON = r"""
import json, sys, dataclasses
from pathlib import Path
import yaml
from recscale.config import parse
from recscale.retrain import DLRMRetrainConfig

work, conf, world = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
params = yaml.safe_load((conf / "base" / "parameters_dlrm.yml").read_text())
params = {k: v for k, v in params.items() if k in DLRMRetrainConfig.__dataclass_fields__}
params["preprocess"].update(output_dir=str(work / "pq"))
params["train"].update(progress="off", epochs=1, launch={"world_size": world},
                       checkpoint={"dir": str(work / "ck_first")})
params["retrain"] = {"model_dir": str(work / "models"), "work_dir": str(work / "pq")}
cfg = parse(DLRMRetrainConfig, params, "")
"""

SETUP = COMMON + r"""
from recscale.data.synthetic import generate_criteo_tsv
from recscale.data.preprocess import preprocess_criteo
from recscale.runconfig import plan_for_run
from recscale.train import train_dlrm
rows = int(sys.argv[4])
raw = generate_criteo_tsv(dataclasses.replace(cfg.data.synthetic, num_rows=rows),
                          work / "raw" / "day.tsv")
rep = preprocess_criteo([raw.path], work / "pq", cfg.preprocess, table_size_hint=raw.cardinalities)
manifest = json.loads(Path(rep.manifest_path).read_text())
plan = plan_for_run(manifest, cfg)
(work / "plan.json").write_text(json.dumps(plan.to_dict()))
train_dlrm(manifest, cfg.model, cfg.train, plan=plan, comms=cfg.comms)  # the warm checkpoint
print(json.dumps({"manifest": rep.manifest_path}))
"""

CHILD = COMMON + r"""
from recscale.retrain import checkpoint_source, train_warm
from recscale.sharding import ShardingPlan
from recscale.train import train_dlrm
mode = sys.argv[4]
manifest = json.loads((work / "pq" / "_manifest.json").read_text())
plan = ShardingPlan.from_dict(json.loads((work / "plan.json").read_text()))
train = dataclasses.replace(cfg.train, checkpoint=dataclasses.replace(
    cfg.train.checkpoint, dir=str(work / f"ck_{mode}_{sys.argv[5]}")))
cfg = dataclasses.replace(cfg, train=train)
if mode == "dlrm":
    out = train_dlrm(manifest, cfg.model, cfg.train, plan=plan, comms=cfg.comms)
else:
    warm = checkpoint_source(work / "ck_first")()
    out = train_warm(manifest, cfg, warm, checkpoint_dir=cfg.train.checkpoint.dir, plan=plan)
r = out.result
print(json.dumps({"samples_per_s": r.samples_per_s, "wall": r.samples / r.wall_seconds,
                  "steps": r.steps}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--conf", default=str(Path(__file__).resolve().parents[1] / "conf"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-c", SETUP, str(work), args.conf, str(args.world),
                        str(args.rows)], check=True, capture_output=True, text=True, timeout=1800)
        runs: dict[str, list[dict]] = {"dlrm": [], "retrain": []}
        for rep in range(args.reps):
            for mode in runs:
                res = subprocess.run([sys.executable, "-c", CHILD, str(work), args.conf,
                                      str(args.world), mode, str(rep)], capture_output=True,
                                     text=True, timeout=1800)
                if res.returncode:
                    sys.exit(f"{mode} failed:\n{res.stderr[-3000:]}")
                got = json.loads(res.stdout.strip().splitlines()[-1])
                runs[mode].append(got)
                print(f"rep {rep} {mode:8s} {got['steps']:5d} steps "
                      f"{got['samples_per_s']:>10,.0f} samples/s in the step "
                      f"{got['wall']:>10,.0f} of the wall", flush=True)
    med = {m: statistics.median(r["samples_per_s"] for r in rs) for m, rs in runs.items()}
    print(f"\nmedians over {args.reps} interleaved reps ({args.world} ranks, {args.rows:,} rows): "
          f"dlrm {med['dlrm']:,.0f}, retrain {med['retrain']:,.0f} samples/s; "
          f"retrain / dlrm {med['retrain'] / med['dlrm']:.3f}")


if __name__ == "__main__":
    main()
