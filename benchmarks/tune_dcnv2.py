"""One conf/mlperf_dcnv2 training setting scored on the VALIDATION split beside the generator's
oracle AUC on the same rows: the data is generated and preprocessed once per data setting (kept
under --out by a hash of the data and preprocess blocks), then each call only trains and scores,
so learning rates and schedules are compared without rerunning the pipeline. Settings are
overrides of the env's parameters, deep-merged, as JSON; one line of JSON per run on stdout.

    nice -n 10 python benchmarks/tune_dcnv2.py '{}'
    nice -n 10 python benchmarks/tune_dcnv2.py '{"train": {"embedding_optimizer": {"learning_rate": 0.1}}}'
    nice -n 10 python benchmarks/tune_dcnv2.py '{"data": {"synthetic": {"cardinality_scale": 0.00075}}}'

Pick settings here (validation); report the test split once, for the chosen config, with
``kedro run --pipeline=dlrm --env=mlperf_dcnv2``.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from recscale.config import parse
from recscale.data.multihot import preprocess_multihot
from recscale.data.preprocess import PreprocessConfig, load_manifest
from recscale.data.source import DataConfig, prepare_raw
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.scoring import evaluate_dlrm
from recscale.train import train_dlrm

ROOT = Path(__file__).resolve().parents[1]


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def env_params(env: str, overrides: dict) -> dict:
    """conf/base's dlrm parameters with conf/<env>'s merged in (as Kedro merges an env), then no
    progress bars or checkpoints, then ``overrides``: one training setting of that env."""
    params = yaml.safe_load((ROOT / "conf/base/parameters_dlrm.yml").read_text())
    if env != "base":
        env_file = ROOT / f"conf/{env}/parameters_dlrm.yml"
        params = merge(params, yaml.safe_load(env_file.read_text()))
    params = merge(params, {"train": {"progress": "off", "checkpoint": {"dir": None}}})
    return merge(params, overrides)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="?", default="{}", help="JSON, merged into the params")
    ap.add_argument("--split", default="validation", help="validation (tune here) or test")
    ap.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "tune_dcnv2"))
    args = ap.parse_args()
    over = json.loads(args.overrides)
    params = yaml.safe_load((ROOT / "conf/mlperf_dcnv2/parameters_dlrm.yml").read_text())
    params = merge(params, over)
    pre = dict(params["preprocess"])
    pre.pop("output_dir")
    key = hashlib.sha1(json.dumps([params["data"]["synthetic"], pre], sort_keys=True)
                       .encode()).hexdigest()[:10]
    base = Path(args.out) / key
    t0 = time.monotonic()
    raw = prepare_raw(parse(DataConfig, dict(params["data"], raw_dir=str(base / "raw")), "data"))
    if not (base / "pq" / "manifest.json").exists():
        preprocess_multihot(raw["files"], base / "pq", parse(PreprocessConfig, pre, "preprocess"),
                            raw["cardinalities"])
    manifest = load_manifest(base / "pq")
    oracle = np.load(raw["oracle_path"], mmap_mode="r")
    t1 = time.monotonic()
    res = train_dlrm(manifest, parse(ModelConfig, params["model"], "model"),
                     parse(TrainConfig, {**params["train"], "progress": "off"}, "train"))
    t2 = time.monotonic()
    m = evaluate_dlrm(res.model, manifest, args.split, 16384, oracle)
    print(json.dumps({"overrides": over, "split": args.split, "auc": round(m["auc"], 4),
                      "oracle_auc": round(m["oracle_auc"], 4),
                      "gap": round(m["oracle_auc"] - m["auc"], 4), "data_s": round(t1 - t0),
                      "train_s": round(t2 - t1),
                      "load": [round(x, 1) for x in os.getloadavg()]}), flush=True)


if __name__ == "__main__":
    main()
