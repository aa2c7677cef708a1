"""The data of one retrain: the new partitions preprocessed to fit the warm model, the last
``retrain.eval_fraction`` of the newest partition held out as the test split (as many rows,
the latest by time, when ``preprocess.splits`` is by a time column).

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
from recscale.data.preprocess import preprocess_criteo, preprocess_table
from recscale.data.schema import EmbeddingTable, FeatureSchema, criteo_sparse_names
from recscale.data.splits import TimeSplit
from recscale.data.table_source import count_rows, source_files
from recscale.data.vocab import VocabularyMismatch, load_vocabulary
from recscale.retrain.config import DLRMRetrainConfig
from recscale.retrain.partitions import Partition
from recscale.retrain.warm import WarmStart


def prepare_partitions(parts: list[Partition], warm: WarmStart, cfg: DLRMRetrainConfig) -> dict:
    """-> the dataset manifest (parquet splits under ``retrain.work_dir``) plus what the retrain
    reports: the partitions, the newest one, which rows are evaluated, the oracle files.

    Criteo day files (``features: criteo``) go through the Criteo TSV engines; with a schema of
    your own each partition (a parquet or delimited text file, or a directory of them, e.g.
    ``day=2026-12-01/``) goes through the table path (``preprocess_table``), on
    ``preprocess.engine``'s engine either way."""
    custom = not isinstance(cfg.features, str)
    files = [p.path for p in parts]
    if custom:
        counts = [sum(count_rows(f, cfg.data.delimiter) for f in source_files([p]))
                  for p in files]
    else:
        counts = [count_lines(f) for f in files]
    held_out = cfg.retrain.eval_fraction * counts[-1] / sum(counts)
    splits = (1.0 - held_out, 0.0, held_out)
    if isinstance(cfg.preprocess.splits, TimeSplit):  # the night's latest rows by their time
        splits = TimeSplit(cfg.preprocess.splits.by, fractions=splits)
    pcfg = dataclasses.replace(cfg.preprocess, output_dir=cfg.retrain.work_dir, splits=splits)
    vocab = bool(cfg.schema.vocab_tables) if custom else pcfg.ids == "vocab"
    if vocab:  # the warm model's vocabulary grows; its tables grow with it
        pcfg = dataclasses.replace(pcfg, vocab=dataclasses.replace(
            pcfg.vocab, path=warm_vocabulary(warm, cfg.retrain.model_dir, cfg)))
    elif warm.table_sizes is not None and not custom:  # ids hash into the warm model's rows
        pcfg = dataclasses.replace(pcfg, table_sizes=tuple(warm.table_sizes))
    if custom:
        schema = cfg.schema
        if warm.table_sizes is not None:  # hashed tables keep the warm model's rows
            schema = hashed_tables_at(schema, warm.table_sizes)
        report = preprocess_table(files, pcfg.output_dir, pcfg, schema, cfg.data.delimiter)
    else:
        report = preprocess_criteo(files, pcfg.output_dir, pcfg,
                                   table_size_hint=_cardinalities(files))
    manifest = json.loads(Path(report.manifest_path).read_text())
    if vocab:
        manifest["vocabulary_path"] = keep_vocabulary(manifest["vocabulary_path"],
                                                      manifest["table_sizes"],
                                                      cfg.retrain.model_dir)
    test_rows = manifest["splits"]["test"]["rows"]
    oracles = [str(Path(f).with_suffix(".oracle.npy")) if custom else f + ".oracle.npy"
               for f in files]
    return {**manifest, "partitions": [dataclasses.asdict(p) for p in parts],
            "newest": parts[-1].name, "eval_data": f"last {test_rows} rows of {parts[-1].name}",
            "oracle_paths": oracles if all(Path(o).exists() for o in oracles) else None}


def hashed_tables_at(schema: FeatureSchema, table_sizes) -> FeatureSchema:
    """``schema`` with each hashed table that gives no ``rows`` of its own pinned to the warm
    model's (``table_sizes``: one per table, in order of first use): preprocessing would size
    it from the new partitions' distinct ids, and ids must hash into the rows the warm model
    trained."""
    order = list(dict.fromkeys(f.table_name for f in schema.sparse_inputs))
    hashed = {f.table_name for f in schema.sparse if f.ids == "hash"}
    given = {t.name: t for t in schema.tables}
    tables = list(schema.tables)
    for name in order:
        t = given.get(name)
        if name in hashed and (t is None or t.rows is None):
            pinned = EmbeddingTable(name, int(table_sizes[order.index(name)]),
                                    t.dim if t is not None else None)
            tables = [pinned if x.name == name else x for x in tables] if t else tables + [pinned]
    return dataclasses.replace(schema, tables=tuple(tables))


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


def warm_vocabulary(warm: WarmStart, model_dir: str | os.PathLike,
                    cfg: DLRMRetrainConfig | None = None) -> str | None:
    """The vocabulary a warm model was trained with (None for a cold start); raises
    VocabularyMismatch when there is none or its sizes are not the model's tables (of the
    ``ids: vocab`` tables of ``cfg``'s schema; the Criteo preset's 26 without one)."""
    if warm.table_sizes is None:
        return None
    path = vocabulary_file(model_dir, warm.table_sizes)
    if not path.exists():
        raise VocabularyMismatch(
            f"preprocess.ids='vocab': the warm start from {warm.source} ({warm.detail}) has table "
            f"sizes {list(warm.table_sizes)} but {Path(model_dir) / 'vocabularies'} keeps no "
            "vocabulary of those sizes (was it trained with ids: hash, or in another model_dir?)")
    if cfg is not None and not isinstance(cfg.features, str):
        schema = cfg.schema
        tables = list(dict.fromkeys(f.table_name for f in schema.sparse_inputs))
        names, sizes = schema.vocab_tables, [warm.table_sizes[tables.index(t)]
                                             for t in schema.vocab_tables]
    else:
        names, sizes = criteo_sparse_names(), warm.table_sizes
    vocab = load_vocabulary(path, names)
    for name, have, want in zip(vocab.features, vocab.table_sizes, sizes):
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
