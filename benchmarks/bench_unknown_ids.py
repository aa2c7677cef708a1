"""Ids unseen in training: test AUC and log loss with ``train.unknown_ids`` on (routing +
filling) against off, on one click log split by time whose late users are new (never in the
train split), in one run. Prints both and the difference.

    .venv/bin/python benchmarks/bench_unknown_ids.py [--rows 60000] [--epochs 2]

The log: users (string ids, ``ids: vocab, min_count: 1``), items (hashed, table sized from the
data), a three-valued gender; the label is a planted logistic model of a per-user effect, a
per-item effect and gender. The users of the last 25% of the rows are new, so the test split's
users are all unseen and the best a model can do for them is the population's average user.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recscale.config import parse
from recscale.data.preprocess import preprocess_table
from recscale.data.processed import PreprocessConfig, load_manifest
from recscale.data.schema import FittedSchema, parse_features
from recscale.embedding.unknown import fill_untrained_rows
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.scoring import evaluate_dlrm
from recscale.train import train_dlrm

SCHEMA = {"label": "y", "dense": [],
          "sparse": [{"name": "user", "id_type": "string", "ids": "vocab"},
                     {"name": "item", "ids": "hash"},
                     {"name": "gender", "id_type": "string", "ids": "hash"}]}


def make_log(path: Path, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    old = t < int(0.75 * n)
    user = np.where(old, rng.zipf(1.4, n) % 20000, 100000 + rng.integers(0, 20000, n))
    user_effect = np.random.default_rng(seed + 1).normal(0, 0.8, 200000)
    item = rng.zipf(1.3, n) % 3000
    item_effect = np.random.default_rng(seed + 2).normal(0, 1.0, 3000)
    gender = rng.integers(0, 3, n)
    logit = -1.0 + user_effect[user] + item_effect[item] + 0.3 * (gender - 1)
    p = 1 / (1 + np.exp(-logit))
    y = (rng.random(n) < p).astype(np.int8)
    pq.write_table(pa.table({"y": y, "user": [f"u{u}" for u in user], "item": item,
                             "gender": np.array(["f", "m", "x"])[gender]}), path)
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=60000)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        make_log(d / "log.parquet", args.rows)
        out = d / "out"
        man = load_manifest(preprocess_table(
            [d / "log.parquet"], out, PreprocessConfig(output_dir=str(out)),
            parse_features(SCHEMA)).manifest_path)
        print("tables", dict(zip(FittedSchema.of(man).table_names, man["table_sizes"])))
        model_cfg = parse(ModelConfig, {"embedding_dim": 16, "bottom_mlp": [16],
                                        "top_mlp": [64, 1], "interaction": "cat"}, "model")
        got = {}
        for routing in ("off", "frequency"):
            train_cfg = parse(TrainConfig, {
                "batch_size_per_rank": 512, "epochs": args.epochs, "progress": "off",
                "checkpoint": {"dir": None}, "validation": {"enabled": False},
                "early_stopping": {"enabled": False},
                "unknown_ids": {"routing": routing, "fill": routing != "off"}}, "train")
            trained = train_dlrm(man, model_cfg, train_cfg)
            fill_untrained_rows(trained.model.embeddings, FittedSchema.of(man), train_cfg.seed,
                                train_cfg.unknown_ids)
            got[routing] = evaluate_dlrm(trained.model, man, "test", 8192)
            print(f"unknown_ids {routing:9s}: test AUC {got[routing]['auc']:.4f}, "
                  f"log loss {got[routing]['log_loss']:.4f}")
        print(f"on - off: AUC {got['frequency']['auc'] - got['off']['auc']:+.4f}, "
              f"log loss {got['frequency']['log_loss'] - got['off']['log_loss']:+.4f}")


if __name__ == "__main__":
    main()
