"""The data of one retrain: the new partitions preprocessed with the warm model's table sizes,
the last ``retrain.eval_fraction`` of the newest partition held out as the test split."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from recscale.data.criteo import count_lines
from recscale.data.preprocess import preprocess_criteo
from recscale.retrain.config import DLRMRetrainConfig
from recscale.retrain.partitions import Partition
from recscale.retrain.warm import WarmStart


def prepare_partitions(parts: list[Partition], warm: WarmStart, cfg: DLRMRetrainConfig) -> dict:
    """-> the dataset manifest (parquet splits under ``retrain.work_dir``) plus what the retrain
    reports: the partitions, the newest one, which rows are evaluated, the oracle files."""
    files = [p.path for p in parts]
    lines = [count_lines(f) for f in files]
    held_out = cfg.retrain.eval_fraction * lines[-1] / sum(lines)
    pcfg = dataclasses.replace(cfg.preprocess, output_dir=cfg.retrain.work_dir,
                               splits=(1.0 - held_out, 0.0, held_out))
    if warm.table_sizes is not None:  # ids must hash into the rows the warm model learned
        pcfg = dataclasses.replace(pcfg, table_sizes=tuple(warm.table_sizes))
    report = preprocess_criteo(files, pcfg.output_dir, pcfg, table_size_hint=_cardinalities(files))
    manifest = json.loads(Path(report.manifest_path).read_text())
    test_rows = manifest["splits"]["test"]["rows"]
    oracles = [f + ".oracle.npy" for f in files]
    return {**manifest, "partitions": [dataclasses.asdict(p) for p in parts],
            "newest": parts[-1].name, "eval_data": f"last {test_rows} rows of {parts[-1].name}",
            "oracle_paths": oracles if all(Path(o).exists() for o in oracles) else None}


def _cardinalities(files: list[str]) -> list[int] | None:
    """Synthetic day files say their cardinalities beside them (``.meta.json``)."""
    cards = []
    for f in files:
        meta = Path(f + ".meta.json")
        if not meta.exists():
            return None
        cards.append(json.loads(meta.read_text()).get("cardinalities"))
    return cards[0] if cards and all(c == cards[0] for c in cards) else None
