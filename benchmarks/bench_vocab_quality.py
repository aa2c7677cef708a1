"""Hashing vs a vocabulary, by test AUC: the default synthetic config (conf/base) preprocessed with
``ids: hash`` at table sizes 1x and 4x the cardinality and with ``ids: vocab``, each trained with
the default model and training config, beside the generator's oracle AUC on the same rows, in one
run (pyarrow engine: the Spark engine writes the same rows).

    nice -n 5 python benchmarks/bench_vocab_quality.py                 # default size (2M rows)
    nice -n 5 python benchmarks/bench_vocab_quality.py --rows 300000   # quicker
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from recscale.config import parse
from recscale.data.preprocess import PreprocessConfig, load_manifest, preprocess_criteo
from recscale.data.source import DataConfig, prepare_raw
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.scoring import evaluate_dlrm
from recscale.train import train_dlrm

ROOT = Path(__file__).resolve().parents[1]

VARIANTS = {
    "hash 1x": {"ids": "hash", "hash_size_multiplier": 1.0},
    "hash 4x": {"ids": "hash", "hash_size_multiplier": 4.0},
    "vocab (min_count 1)": {"ids": "vocab", "vocab": {"min_count": 1}},
    "vocab (min_count 5)": {"ids": "vocab", "vocab": {"min_count": 5}},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="synthetic rows (default: conf/base's)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    params = yaml.safe_load((ROOT / "conf/base/parameters_dlrm.yml").read_text())
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_vocab_"))
    if not args.out:  # a directory of its own: removed at the end
        atexit.register(shutil.rmtree, out, True)
    data = dict(params["data"], raw_dir=str(out / "raw"))
    if args.rows:
        data["synthetic"] = {**data["synthetic"], "num_rows": args.rows}
    raw = prepare_raw(parse(DataConfig, data, "data"))
    oracle = np.load(raw["oracle_path"], mmap_mode="r")
    base = dict(params["preprocess"])
    base.pop("output_dir")
    train = parse(TrainConfig, {**params["train"], "progress": "off"}, "train")
    model = parse(ModelConfig, params["model"], "model")
    rows = []
    for name, over in VARIANTS.items():
        cfg = parse(PreprocessConfig, {**base, **over}, "preprocess")
        pq_dir = out / name.replace(" ", "_").replace("(", "").replace(")", "")
        preprocess_criteo(raw["files"], pq_dir, cfg, raw["cardinalities"])
        man = load_manifest(pq_dir)
        t = time.perf_counter()
        res = train_dlrm(man, model, train)
        m = evaluate_dlrm(res.model, man, "test", 16384, oracle)
        rows.append((name, sum(man["table_sizes"]), m["auc"], m["oracle_auc"],
                     time.perf_counter() - t))
        print(f"{name}: test AUC {m['auc']:.4f} (oracle {m['oracle_auc']:.4f})", flush=True)
    print(f"\nrows: {raw['rows']:,}; sum of cardinalities: {sum(raw['cardinalities']):,}")
    print("| ids | embedding rows | test AUC | oracle AUC | gap | train+eval s |")
    print("|---|---|---|---|---|---|")
    for name, size, auc, oracle_auc, sec in rows:
        print(f"| {name} | {size:,} | {auc:.4f} | {oracle_auc:.4f} | {oracle_auc - auc:.4f} | "
              f"{sec:.0f} |")


if __name__ == "__main__":
    main()
