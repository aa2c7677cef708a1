"""The data of one retrain: the new partitions preprocessed to fit the warm model, the last
``retrain.eval_fraction`` of the newest partition held out as the test split.

``preprocess.ids: hash``: the ids hash into the warm model's table sizes. ``ids: vocab``: the
warm model's vocabulary grows append-only (``vocab.path``), so existing ids keep their rows and
new frequent ids get rows after them; the warm start then grows its tables to the new sizes
(``recscale.model.load_state_into``). The vocabulary of every model the retrain trains is
kept under ``<retrain.model_dir>/vocabularies/``, named by its table sizes: an append-only
vocabulary is a prefix of its successors, so within one lineage the sizes name it (the next
retrain finds it from any warm-start source's table sizes and checks that they agree).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

from recscale.data.criteo import count_lines
from recscale.data.preprocess import preprocess_criteo
from recscale.data.schema import criteo_sparse_names
from recscale.data.vocab import VocabularyMismatch, load_vocabulary
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
    if pcfg.ids == "vocab":  # the warm model's vocabulary grows; its tables grow with it
        pcfg = dataclasses.replace(pcfg, vocab=dataclasses.replace(
            pcfg.vocab, path=warm_vocabulary(warm, cfg.retrain.model_dir)))
    elif warm.table_sizes is not None:  # ids must hash into the rows the warm model learned
        pcfg = dataclasses.replace(pcfg, table_sizes=tuple(warm.table_sizes))
    report = preprocess_criteo(files, pcfg.output_dir, pcfg, table_size_hint=_cardinalities(files))
    manifest = json.loads(Path(report.manifest_path).read_text())
    if pcfg.ids == "vocab":
        manifest["vocabulary_path"] = keep_vocabulary(manifest["vocabulary_path"],
                                                      manifest["table_sizes"],
                                                      cfg.retrain.model_dir)
    test_rows = manifest["splits"]["test"]["rows"]
    oracles = [f + ".oracle.npy" for f in files]
    return {**manifest, "partitions": [dataclasses.asdict(p) for p in parts],
            "newest": parts[-1].name, "eval_data": f"last {test_rows} rows of {parts[-1].name}",
            "oracle_paths": oracles if all(Path(o).exists() for o in oracles) else None}


def vocabulary_file(model_dir: str | os.PathLike, table_sizes) -> Path:
    """Where the retrain keeps the vocabulary of a model with these table sizes."""
    key = hashlib.sha256(json.dumps([int(s) for s in table_sizes]).encode()).hexdigest()[:16]
    return Path(model_dir) / "vocabularies" / f"vocabulary-{key}.parquet"


def keep_vocabulary(path: str, table_sizes, model_dir: str | os.PathLike) -> str:
    """Copy a run's vocabulary beside the retrain's models (atomically) -> the kept copy."""
    dst = vocabulary_file(model_dir, table_sizes)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(path, tmp)
    os.replace(tmp, dst)
    return str(dst)


def warm_vocabulary(warm: WarmStart, model_dir: str | os.PathLike) -> str | None:
    """The vocabulary a warm model was trained with (None for a cold start); raises
    VocabularyMismatch when there is none or its sizes are not the model's tables."""
    if warm.table_sizes is None:
        return None
    path = vocabulary_file(model_dir, warm.table_sizes)
    if not path.exists():
        raise VocabularyMismatch(
            f"preprocess.ids='vocab': the warm start from {warm.source} ({warm.detail}) has table "
            f"sizes {list(warm.table_sizes)} but {Path(model_dir) / 'vocabularies'} keeps no "
            "vocabulary of those sizes (was it trained with ids: hash, or in another model_dir?)")
    vocab = load_vocabulary(path, criteo_sparse_names())  # the retrain reads Criteo day files
    for name, have, want in zip(vocab.features, vocab.table_sizes, warm.table_sizes):
        if int(have) != int(want):
            raise VocabularyMismatch(
                f"vocabulary {path} sizes table {name} at {have} rows but the warm start from "
                f"{warm.source} has {want}")
    return str(path)


def _cardinalities(files: list[str]) -> list[int] | None:
    """Synthetic day files say their cardinalities beside them (``.meta.json``)."""
    cards = []
    for f in files:
        meta = Path(f + ".meta.json")
        if not meta.exists():
            return None
        cards.append(json.loads(meta.read_text()).get("cardinalities"))
    return cards[0] if cards and all(c == cards[0] for c in cards) else None
