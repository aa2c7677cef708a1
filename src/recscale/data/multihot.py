"""Multi-hot click data: bags of ids per feature, as in MLPerf's DLRM-DCNv2 (multi-hot Criteo).

Raw format (what the synthetic generator writes and what preprocessing reads): a parquet file with
``label`` (0/1), ``I1..I13`` (nullable integer counts) and ``C1..C26`` as ``list<int64>`` columns,
one bag of raw non-negative ids per feature (an empty or null list is a missing feature).

The synthetic bags: feature j of a sample is missing with Criteo's rate, else holds
``1 + Poisson(p_j - 1)`` ids (``p_j`` its pooling factor, capped at ``3 p_j``), each drawn from the
feature's Zipf law. The planted model of ``recscale.data.synthetic`` reads bags by sum: a main
effect is the sum of the ids' effects, a low-rank cross the dot of two bags' summed vectors, each
bag scaled by ``1 / sqrt(p_j)``; what a DLRM with sum pooling can express. The true probability of
every row is written beside the file (``.oracle.npy``), so the oracle AUC stays exact.

Preprocessing (``preprocess_multihot``) is the table path of ``recscale.data.table_preprocess``
with this format's schema (``multihot_schema``): every bag checked (at most ``max_bag_size`` ids,
no negative id, no null inside a list), each rejected row's number and reason in
``rejects.tsv``, ids hashed modulo the table sizes (``preprocess.ids: hash``) or looked up in a
vocabulary of the train split's ids (``vocab``, with ``preprocess.vocab``'s threshold and cap:
each table as many rows as its vocabulary), the splits written with list columns; the
manifest's pooling factors are the mean bag sizes measured in the data.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recscale.config import ConfigError
from recscale.data.criteo import (
    DENSE_NAMES,
    NUM_SPARSE,
    SPARSE_NAMES,
)
from recscale.data.processed import PreprocessConfig, PreprocessReport
from recscale.data.schema import EmbeddingTable, FeatureSchema, criteo_schema
from recscale.data.synthetic import (
    BLOCK_ROWS,
    SPARSE_MISSING,
    PlantedModel,
    SyntheticConfig,
    SyntheticReport,
    _sigmoid,
    raw_ids,
)
from recscale.data.table_preprocess import preprocess_table_pyarrow
from recscale.data.table_source import check_columns, source_files
from recscale.data.vocab import VocabConfig

log = logging.getLogger(__name__)

BAG = pa.list_(pa.int64())


def raw_schema() -> pa.Schema:
    fields = [pa.field("label", pa.int8())]
    fields += [pa.field(n, pa.int64()) for n in DENSE_NAMES]
    fields += [pa.field(n, BAG) for n in SPARSE_NAMES]
    return pa.schema(fields)


def _bag_sum(rows: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """Per-row sums of ``weights`` ([m] or [m, k]) whose row indices are ``rows``."""
    if weights.ndim == 1:
        return np.bincount(rows, weights, minlength=n)
    return np.stack([np.bincount(rows, weights[:, c], minlength=n)
                     for c in range(weights.shape[1])], axis=1)


class MultiHotPlantedModel(PlantedModel):
    """The planted click model read through bags (see the module docstring)."""

    def __init__(self, cfg: SyntheticConfig):
        self.pooling = np.asarray(cfg.pooling_factors, dtype=np.float64)
        self.scale = 1.0 / np.sqrt(self.pooling)
        super().__init__(cfg)  # calibrates the bias on multi-hot samples (self.sample)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[dict, np.ndarray]:
        counts, dense_present, logc, logit = self.sample_dense(rng, n)
        present = rng.random((n, NUM_SPARSE)) >= np.asarray(SPARSE_MISSING)
        extra = rng.poisson(self.pooling - 1.0, (n, NUM_SPARSE))
        lengths = np.where(present, np.minimum(1 + extra, np.ceil(3 * self.pooling)), 0)
        lengths = lengths.astype(np.int64)
        ranks, rows = [], []
        for j in range(NUM_SPARSE):
            m = int(lengths[:, j].sum())
            u = rng.random(m)
            ranks.append(np.minimum(np.searchsorted(self.cdfs[j], u), self.cards[j] - 1))
            rows.append(np.repeat(np.arange(n), lengths[:, j]))
        for j in self.main_features:
            logit += self.scale[j] * _bag_sum(rows[j], self.main_effects[j][ranks[j]], n)
        for f, g in self.crosses:
            uf = self.scale[f] * _bag_sum(rows[f], self.cross_u[(f, g)][ranks[f]], n)
            vg = self.scale[g] * _bag_sum(rows[g], self.cross_v[(f, g)][ranks[g]], n)
            logit += (uf * vg).sum(1)
        c = self.dc_feature
        slope = self.scale[c] * _bag_sum(rows[c], self.dc_slope[ranks[c]], n)
        logit += slope * (logc[:, self.dc_dense] - self.dense_center[self.dc_dense])
        cols = {"dense": counts, "dense_present": dense_present, "lengths": lengths,
                "ranks": ranks}
        return cols, logit

    def table(self, index: int, n: int) -> tuple[pa.Table, np.ndarray]:
        """Rows of generation block ``index`` as a raw-format table -> (table, true probs)."""
        rng = np.random.default_rng([self.cfg.seed, 2, index])
        cols, logit = self.sample(rng, n)
        prob = _sigmoid(logit + self.bias)
        label = (rng.random(n) < prob).astype(np.int8)
        arrays = [pa.array(label)]
        arrays += [pa.array(cols["dense"][:, j], mask=~cols["dense_present"][:, j])
                   for j in range(cols["dense"].shape[1])]
        for j in range(NUM_SPARSE):
            offsets = np.concatenate([[0], np.cumsum(cols["lengths"][:, j])]).astype(np.int32)
            ids = raw_ids(j, cols["ranks"][j]).astype(np.int64)
            arrays.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)))
        return pa.Table.from_arrays(arrays, schema=raw_schema()), prob


def generate_multihot_parquet(cfg: SyntheticConfig, path: str | os.PathLike,
                              progress: Callable[[int], None] | None = None,
                              reuse: bool = True) -> SyntheticReport:
    """Write ``cfg.num_rows`` multi-hot rows (raw format) to ``path`` and the true probabilities
    beside it. Same config, same bytes; a file made from the same config is reused."""
    path = Path(path)
    meta_path = path.with_name(path.name + ".meta.json")
    oracle_path = path.with_name(path.name + ".oracle.npy")
    labels_path = path.with_name(path.name + ".labels.npy")
    fp = cfg.fingerprint()
    if reuse and meta_path.exists() and path.exists() and oracle_path.exists() \
            and labels_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("fingerprint") == fp and meta.get("labels_path") == str(labels_path):
            log.info("multi-hot data %s already generated from this config; reusing it", path)
            return SyntheticReport(**{**meta, "cardinalities": tuple(meta["cardinalities"])})
    path.parent.mkdir(parents=True, exist_ok=True)
    model = MultiHotPlantedModel(cfg)
    tmp = path.with_name(path.name + ".tmp")
    oracle = np.empty(cfg.num_rows, dtype=np.float32)
    labels = np.empty(cfg.num_rows, dtype=np.int8)
    with pq.ParquetWriter(tmp, raw_schema(), compression="zstd") as writer:
        for b in range((cfg.num_rows + BLOCK_ROWS - 1) // BLOCK_ROWS):
            start = b * BLOCK_ROWS
            n = min(BLOCK_ROWS, cfg.num_rows - start)
            table, prob = model.table(b, n)
            writer.write_table(table)
            oracle[start:start + n] = prob
            labels[start:start + n] = table.column("label").to_numpy()
            if progress:
                progress(start + n)
    np.save(oracle_path, oracle)
    np.save(labels_path, labels)
    os.replace(tmp, path)
    report = SyntheticReport(
        path=str(path), oracle_path=str(oracle_path), labels_path=str(labels_path),
        num_rows=cfg.num_rows, ctr=float(labels.mean()), cardinalities=model.cards.tolist(),
        fingerprint=fp)
    meta_path.write_text(json.dumps(report.to_dict(), indent=2))
    log.info("wrote %d multi-hot rows to %s (CTR %.4f)", cfg.num_rows, path, report.ctr)
    return report


def multihot_schema(table_sizes: Sequence[int], max_bag_size: int, ids: str = "hash",
                    vocab: VocabConfig | None = None) -> FeatureSchema:
    """The multi-hot Criteo preset read from the raw format: counts clipped at 0 then log1p,
    each C feature's list (at most ``max_bag_size`` ids, none negative) hashed into its table
    (``table_sizes``), or with ``ids="vocab"`` looked up in a vocabulary of the train split
    (``vocab``'s threshold and cap; the tables sized by it, ``table_sizes`` unread)."""
    preset = criteo_schema(kind="multi_hot", id_type="int", ids=ids)
    vocab = vocab or VocabConfig()
    per_id = {"min_count": vocab.min_count, "max_size": vocab.max_size} if ids == "vocab" else {}
    return dataclasses.replace(
        preset, sparse=tuple(dataclasses.replace(f, max_len=max_bag_size, **per_id)
                             for f in preset.sparse),
        tables=tuple(EmbeddingTable(f.name, rows=None if ids == "vocab" else int(r))
                     for f, r in zip(preset.sparse, table_sizes, strict=True)))


def preprocess_multihot(
    files: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    cfg: PreprocessConfig,
    table_size_hint: Sequence[int] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PreprocessReport:
    """Raw multi-hot parquet ``files`` (in time order) -> the parquet splits under ``out_dir``
    with list columns, the manifest and ``rejects.tsv`` (file, 1-based row in its file, reason):
    the table path (``recscale.data.table_preprocess``) with the multi-hot Criteo preset. Rows
    written + rows rejected = rows read; more than ``cfg.max_reject_fraction`` rejected raises
    RejectedRowsError."""
    if cfg.engine != "pyarrow":
        raise ConfigError(f"multi-hot input is preprocessed with preprocess.engine='pyarrow' only "
                          f"(got {cfg.engine!r})")
    schema = multihot_schema(cfg.resolve_table_sizes(table_size_hint), cfg.max_bag_size,
                             cfg.ids, cfg.vocab)
    files = source_files(files)
    check_columns(files, schema, ",")
    return preprocess_table_pyarrow(files, out_dir, cfg, schema, progress=progress)
