"""One training setting of a config env on data a `kedro run` of that env already preprocessed:
trains through the library (``train_dlrm``, the run's own code) and scores a split beside the
generator's oracle on the same rows, so settings are compared without rerunning the pipeline.
Settings are overrides of the env's parameters (conf/base merged with conf/<env>), deep-merged,
as JSON; one line of JSON per run on stdout (the split's AUC, log loss, gap to the oracle, the
validation curve, the best step and where early stopping ended training).

    kedro run --pipelines=dlrm                                   # once: the data
    nice -n 10 python benchmarks/tune_quality.py '{}'
    nice -n 10 python benchmarks/tune_quality.py '{"train": {"dense_optimizer": {"learning_rate": 0.003}}}'
    nice -n 10 python benchmarks/tune_quality.py --env clicklog --oracle \\
        data/01_raw/clicklog/table_00.oracle.npy '{"train": {"epochs": 4}}'

Choose settings on --split validation; report the test split once, for the chosen config.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from recscale.config import parse
from recscale.data.preprocess import load_manifest
from recscale.runconfig import DLRMConfig
from recscale.scoring import evaluate_dlrm
from recscale.train import train_dlrm
from tune_dcnv2 import ROOT, env_params  # an env's params with JSON overrides (a sibling script)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="?", default="{}", help="JSON, merged into the params")
    ap.add_argument("--env", default="base", help="the conf env whose kedro run made the data")
    ap.add_argument("--split", default="validation", help="validation (tune here) or test")
    ap.add_argument("--oracle", default="data/01_raw/synthetic/day_00.tsv.oracle.npy",
                    help="the generator's probabilities of the raw rows (.oracle.npy)")
    args = ap.parse_args()
    over = json.loads(args.overrides)
    cfg = parse(DLRMConfig, env_params(args.env, over), "")
    manifest = load_manifest(ROOT / cfg.preprocess.output_dir)
    oracle = np.load(ROOT / args.oracle, mmap_mode="r")
    t0 = time.monotonic()
    out = train_dlrm(manifest, cfg.model, cfg.train)
    t1 = time.monotonic()
    m = evaluate_dlrm(out.model, manifest, args.split, 16384, oracle)
    ex = out.result.extra or {}
    print(json.dumps({
        "env": args.env, "overrides": over, "split": args.split, "auc": round(m["auc"], 4),
        "log_loss": round(m["log_loss"], 4), "oracle_auc": round(m["oracle_auc"], 4),
        "gap": round(m["oracle_auc"] - m["auc"], 4), "steps": out.result.steps,
        "best_step": ex.get("best_step"), "stopped_early_at": ex.get("stopped_early_at"),
        "validation_auc": [round(p["value"], 4)
                           for p in (out.result.history or {}).get("validation.auc", [])],
        "train_s": round(t1 - t0), "load": [round(x, 1) for x in os.getloadavg()]}), flush=True)


if __name__ == "__main__":
    main()
