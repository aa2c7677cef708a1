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

Preprocessing (``preprocess_multihot``) checks every bag (at most ``max_bag_size`` ids, no
negative id, no null inside a list), writes each rejected row's number and reason to
``rejects.tsv`` like the TSV path, hashes ids modulo the table sizes and writes the splits with
list columns; the manifest's pooling factors are the mean bag sizes measured in the data.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recscale.config import ConfigError, to_dict
from recscale.data.criteo import (
    DENSE_NAMES,
    NUM_SPARSE,
    SPARSE_NAMES,
    RejectLog,
)
from recscale.data.processed import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    SPLITS,
    PreprocessConfig,
    PreprocessReport,
    SplitWriter,
)
from recscale.data.schema import FittedSchema, criteo_schema
from recscale.data.synthetic import (
    BLOCK_ROWS,
    SPARSE_MISSING,
    PlantedModel,
    SyntheticConfig,
    SyntheticReport,
    _sigmoid,
    raw_ids,
)
from recscale.evaluate.metrics import auc_score

log = logging.getLogger(__name__)

BAG = pa.list_(pa.int64())


def raw_schema() -> pa.Schema:
    fields = [pa.field("label", pa.int8())]
    fields += [pa.field(n, pa.int64()) for n in DENSE_NAMES]
    fields += [pa.field(n, BAG) for n in SPARSE_NAMES]
    return pa.schema(fields)


def model_input_schema() -> pa.Schema:
    fields = [pa.field("row", pa.int64(), nullable=False), pa.field("label", pa.int8(), nullable=False)]
    fields += [pa.field(n, pa.float32(), nullable=False) for n in DENSE_NAMES]
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
    fp = cfg.fingerprint()
    if reuse and meta_path.exists() and path.exists() and oracle_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("fingerprint") == fp:
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
    os.replace(tmp, path)
    report = SyntheticReport(
        path=str(path), oracle_path=str(oracle_path), num_rows=cfg.num_rows,
        oracle_auc=float(auc_score(labels, oracle)), ctr=float(labels.mean()),
        cardinalities=model.cards.tolist(), fingerprint=fp)
    meta_path.write_text(json.dumps(report.to_dict(), indent=2))
    log.info("wrote %d multi-hot rows to %s (CTR %.4f, oracle AUC %.4f)",
             cfg.num_rows, path, report.ctr, report.oracle_auc)
    return report


def check_bags(table: pa.Table, max_bag_size: int) -> tuple[np.ndarray, list[str]]:
    """Rows of a raw table that cannot be trained on -> (bad mask, reason per row ('' if good)):
    a label that is not 0 or 1 (or missing), a bag longer than ``max_bag_size``, a negative id,
    a null id inside a list; the first that applies names the row's reason."""
    n = table.num_rows
    reasons = [""] * n

    def flag(mask: np.ndarray, reason: str) -> None:
        for i in np.flatnonzero(mask):
            if not reasons[i]:
                reasons[i] = reason

    label = table.column("label")
    flag(~(pc.fill_null(pc.is_in(label, pa.array([0, 1], label.type)), False)).to_numpy(
        zero_copy_only=False), "bad label: not 0 or 1")
    for name in SPARSE_NAMES:
        col = pa.concat_arrays(table.column(name).chunks) if table.column(name).num_chunks \
            else pa.array([], BAG)
        lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
        rows = np.repeat(np.arange(n), lengths)
        flat = pc.list_flatten(col)
        null_in = np.bincount(rows[~flat.is_valid().to_numpy(zero_copy_only=False)], minlength=n)
        neg = np.bincount(rows[pc.fill_null(pc.less(flat, 0), False).to_numpy(
            zero_copy_only=False)], minlength=n)
        flag(lengths > max_bag_size,
             f"bag too long: {name} holds more than max_bag_size={max_bag_size} ids")
        flag(neg > 0, f"negative id: {name} holds an id < 0")
        flag(null_in > 0, f"null id: {name} holds a null inside its list")
    return np.asarray([bool(r) for r in reasons], dtype=bool), reasons


def transform_bags(table: pa.Table, rows: np.ndarray, table_sizes: np.ndarray) -> pa.Table:
    """Good raw rows -> model-input columns: log1p counts, ids modulo the table sizes, empty bags
    for missing features."""
    arrays = [pa.array(rows, pa.int64()), pa.array(table.column("label").to_numpy(), pa.int8())]
    for name in DENSE_NAMES:
        c = pc.fill_null(table.column(name), 0).to_numpy(zero_copy_only=False)
        arrays.append(pa.array(np.log1p(np.maximum(c, 0).astype(np.float64)).astype(np.float32)))
    for j, name in enumerate(SPARSE_NAMES):
        col = pa.concat_arrays(table.column(name).chunks) if table.column(name).num_chunks \
            else pa.array([], BAG)
        lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
        ids = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.int64) % table_sizes[j]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        arrays.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids, pa.int64())))
    return pa.Table.from_arrays(arrays, schema=model_input_schema())


def preprocess_multihot(
    files: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    cfg: PreprocessConfig,
    table_size_hint: Sequence[int] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PreprocessReport:
    """Raw multi-hot parquet ``files`` (in time order) -> the parquet splits under ``out_dir``
    with list columns, the manifest and ``rejects.tsv`` (file, 1-based row in its file, reason).
    Rows written + rows rejected = rows read; more than ``cfg.max_reject_fraction`` rejected
    raises RejectedRowsError."""
    if cfg.engine != "pyarrow" or cfg.ids != "hash":
        raise ConfigError(f"multi-hot input is preprocessed with preprocess.engine='pyarrow' and "
                          f"preprocess.ids='hash' only (got engine={cfg.engine!r}, ids={cfg.ids!r})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*/part-*.parquet"):
        stale.unlink()
    table_sizes = np.asarray(cfg.resolve_table_sizes(table_size_hint), dtype=np.int64)
    need = raw_schema()
    for f in files:
        have = pq.read_schema(f)
        missing = [n for n in need.names if n not in have.names]
        wrong = [n for n in SPARSE_NAMES if n in have.names
                 and not pa.types.is_list(have.field(n).type)]
        if missing or wrong:
            raise ValueError(f"{f} is not a multi-hot parquet file: missing columns {missing}, "
                             f"not lists {wrong}; expected label, I1..I13 (integers) and "
                             "C1..C26 (lists of integer ids)")
    counts = [pq.ParquetFile(f).metadata.num_rows for f in files]
    total = int(sum(counts))
    bounds = np.floor(np.cumsum(cfg.splits) * total + 1e-9).astype(np.int64)
    bounds[-1] = total
    rejects_path = out / "rejects.tsv"
    rejects = RejectLog(path=rejects_path, total_lines=total, max_fraction=cfg.max_reject_fraction)
    writers = {s: SplitWriter(out / s / "part-00000.parquet", cfg.row_group_size,
                               cfg.compression, schema=model_input_schema()) for s in SPLITS}
    ids_per_feature = np.zeros(NUM_SPARSE, dtype=np.int64)
    written, offset = 0, 0
    try:
        for f in files:
            pos = 0
            for rb in pq.ParquetFile(f).iter_batches(batch_size=cfg.row_group_size):
                table = pa.Table.from_batches([rb]).select(raw_schema().names)
                n = table.num_rows
                bad, reasons = check_bags(table, cfg.max_bag_size)
                for i in np.flatnonzero(bad):
                    rejects.add(str(f), pos + i + 1, reasons[i],
                                json.dumps(table.slice(i, 1).to_pylist()[0]).encode())
                good = np.flatnonzero(~bad)
                rows = offset + pos + good
                kept = transform_bags(table.take(pa.array(good)), rows, table_sizes)
                ids_per_feature += [pc.sum(pc.list_value_length(kept.column(c))).as_py() or 0
                                    for c in SPARSE_NAMES]
                written += kept.num_rows
                cut = np.searchsorted(rows, bounds, side="left")
                lo = 0
                for split, hi in zip(SPLITS, cut):
                    writers[split].write(kept.slice(lo, hi - lo))
                    lo = hi
                pos += n
                if progress:
                    progress(offset + pos, total)
            offset += pos
    finally:
        rejects.close()
        for w in writers.values():
            w.close()
    if not rejects_path.exists():
        rejects_path.write_text("file\tline\treason\ttext\n")
    if written + rejects.count != total:
        raise RuntimeError(f"row accounting failed: {written} written + {rejects.count} rejected "
                           f"!= {total} rows read")
    pooling = (ids_per_feature / max(written, 1)).round(6)
    splits = {s: {"files": [str(w.path)], "rows": w.rows, "row_groups": w.row_groups}
              for s, w in writers.items()}
    manifest = {
        "format": MANIFEST_FORMAT, "multi_hot": True, "max_bag_size": cfg.max_bag_size,
        "source_files": [str(f) for f in files], "lines_read": total, "rows_written": written,
        "rows_rejected": rejects.count, "rejects_path": str(rejects_path), "splits": splits,
        "dense_features": list(DENSE_NAMES), "sparse_features": list(SPARSE_NAMES),
        "table_sizes": table_sizes.tolist(), "pooling_factors": pooling.tolist(),
        "config": to_dict(cfg),
        "schema": FittedSchema.fit(criteo_schema(kind="multi_hot", id_type="int"),
                                   table_sizes.tolist()).to_dict(),
    }
    manifest_path = out / MANIFEST_NAME
    manifest_path.write_text(json.dumps(manifest, indent=2))
    log.info("preprocessed %d multi-hot rows: %d written, %d rejected -> %s",
             total, written, rejects.count, rejects_path)
    return PreprocessReport(
        out_dir=str(out), manifest_path=str(manifest_path), lines_read=total,
        rows_written=written, rows_rejected=rejects.count, rejects_path=str(rejects_path),
        rejects_by_reason=dict(rejects.by_reason),
        split_rows={s: splits[s]["rows"] for s in SPLITS},
        table_sizes=tuple(table_sizes.tolist()), pooling_factors=tuple(pooling.tolist()))
