"""Synthetic click data for any feature schema, with a planted model, so the best achievable AUC
is known (the Criteo preset has its own generator, ``recscale.data.synthetic``).

Each row holds the schema's source columns. A categorical feature's ids are drawn from a Zipf law
over its ``cardinality`` distinct values (``data.synthetic_features``); a multi-hot feature's list
holds ``Poisson(pooling)`` of them (empty is missing); ids are written as the feature's
``id_type`` says: integers (spread over a wide range), strings (``"<name>-<k>"``) or hex. A dense
feature's raw value is log-normal. Missing values: ``missing`` of the rows (null).

The planted model: every id has an effect, a bag's effect is the sum of its ids' (each times
its weight, drawn in [0.2, 2) for a feature with ``weights``) over ``sqrt(pooling)``, or over
the bag's length for ``pooling: mean``; the first pairs of sparse features have low-rank crosses of their (summed)
vectors, every dense feature has a linear effect on ``log1p`` of its value. The label is
Bernoulli(sigmoid(logit + bias)), the bias set so the mean click rate is ``base_ctr``. The
probability of every row is written beside the file (``<file>.oracle.npy``) and the AUC of those
probabilities on the generated labels reported: what no model can expect to beat.

Rows are generated in blocks, each from its own seeded stream: the same config and schema give
the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recscale.config import Validated, check, to_dict
from recscale.data.schema import FeatureSchema
from recscale.evaluate.metrics import auc_score

log = logging.getLogger(__name__)

BLOCK_ROWS = 1 << 15


@dataclass(frozen=True)
class FeatureDraw(Validated):
    """How one feature's values are drawn (``data.synthetic_features.<name>``)."""

    cardinality: int = 1000  # sparse: distinct ids
    pooling: float = 4.0  # multi-hot: mean list length (Poisson)
    missing: float = 0.02  # fraction of rows without a value
    effect: float = 1.0  # scales the feature's planted effect

    def validate(self, prefix: str = "data.synthetic_features") -> None:
        check(self.cardinality >= 1, f"{prefix}.cardinality", self.cardinality, ">= 1")
        check(self.pooling > 0, f"{prefix}.pooling", self.pooling, "> 0")
        check(0 <= self.missing < 1, f"{prefix}.missing", self.missing, "in [0, 1)")
        check(self.effect >= 0, f"{prefix}.effect", self.effect, ">= 0")


@dataclass(frozen=True)
class TableSynthConfig(Validated):
    num_rows: int = 100_000
    seed: int = 0
    zipf_exponent: float = 1.1
    base_ctr: float = 0.25
    signal_strength: float = 1.0
    crosses: int = 2  # low-rank crosses between the first pairs of sparse features
    features: Mapping[str, FeatureDraw] = field(default_factory=dict)

    def validate(self, prefix: str = "data.synthetic") -> None:
        check(self.num_rows >= 1, f"{prefix}.num_rows", self.num_rows, ">= 1")
        check(self.zipf_exponent > 0, f"{prefix}.zipf_exponent", self.zipf_exponent, "> 0")
        check(0 < self.base_ctr < 1, f"{prefix}.base_ctr", self.base_ctr, "in (0, 1)")
        check(self.crosses >= 0, f"{prefix}.crosses", self.crosses, ">= 0")

    def draw(self, name: str) -> FeatureDraw:
        return self.features.get(name) or FeatureDraw()


@dataclass(frozen=True)
class TableSynthReport:
    path: str
    oracle_path: str
    num_rows: int
    oracle_auc: float
    ctr: float
    fingerprint: str


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class SchemaPlantedModel:
    """The planted click model of a schema (module docstring)."""

    def __init__(self, schema: FeatureSchema, cfg: TableSynthConfig):
        self.schema, self.cfg = schema, cfg
        rng = np.random.default_rng([cfg.seed, 7])
        s = cfg.signal_strength
        self.sparse = list(schema.sparse)
        self.draws = {f.name: cfg.draw(f.name) for f in [*schema.dense, *schema.sparse]}
        self.cdf, self.effects, self.codes = {}, {}, {}
        for f in self.sparse:
            d = self.draws[f.name]
            w = 1.0 / np.arange(1, d.cardinality + 1) ** cfg.zipf_exponent
            self.cdf[f.name] = np.cumsum(w) / w.sum()
            self.effects[f.name] = rng.normal(0, 0.6 * s * d.effect, d.cardinality)
            # raw integer ids: spread over a wide range, distinct; a feature sharing an earlier
            # one's table (a history of items) draws from that one's ids, as many as it has
            first = next(g for g in self.sparse if g.table_name == f.table_name)
            self.codes[f.name] = rng.choice(1 << 40, d.cardinality, replace=False) \
                if first is f else self.codes[first.name][
                    np.arange(d.cardinality) % len(self.codes[first.name])]
            if first is not f:  # the same items have the same effect (scaled by its own)
                base = self.effects[first.name] / max(self.draws[first.name].effect, 1e-12)
                self.effects[f.name] = d.effect * base[np.arange(d.cardinality) % len(base)]
        pairs = [(a, b) for i, a in enumerate(self.sparse) for b in self.sparse[i + 1:]]
        self.crosses = []
        for a, b in pairs[: cfg.crosses]:
            u = rng.normal(0, 0.5 * s, (self.draws[a.name].cardinality, 2))
            v = rng.normal(0, 0.5 * s, (self.draws[b.name].cardinality, 2))
            self.crosses.append((a.name, b.name, u, v))
        self.dense_w = {f.name: rng.normal(0, 0.4 * s * self.draws[f.name].effect)
                        for f in schema.dense}
        self.dense_mu = {f.name: rng.uniform(0.5, 3.0) for f in schema.dense}
        self.bias = 0.0
        logits = self._sample(np.random.default_rng([cfg.seed, 8]), 50_000)[1]
        lo, hi = -20.0, 20.0
        for _ in range(60):  # the bias that gives base_ctr on average
            mid = (lo + hi) / 2
            if _sigmoid(logits + mid).mean() < cfg.base_ctr:
                lo = mid
            else:
                hi = mid
        self.bias = (lo + hi) / 2

    def _sample(self, rng: np.random.Generator, n: int) -> tuple[dict, np.ndarray]:
        logit = np.zeros(n)
        cols: dict[str, pa.Array] = {}
        summed: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for f in self.schema.dense:
            d = self.draws[f.name]
            x = rng.lognormal(self.dense_mu[f.name], 1.0, n)
            present = rng.random(n) >= d.missing
            z = (np.log1p(x) - self.dense_mu[f.name]) / 1.0
            logit += np.where(present, self.dense_w[f.name] * z, 0.0)
            if f.source not in cols:
                cols[f.source] = pa.array(np.round(x, 4), mask=~present)
        for f in self.sparse:
            d = self.draws[f.name]
            present = rng.random(n) >= d.missing
            if f.kind == "multi_hot":
                lengths = np.where(present, rng.poisson(d.pooling, n), 0).astype(np.int64)
                scale = np.full(n, 1.0 / np.sqrt(d.pooling))
            else:
                lengths = present.astype(np.int64)
                scale = np.ones(n)
            if f.pooling == "mean":
                scale = 1.0 / np.maximum(lengths, 1)
            ranks = np.minimum(np.searchsorted(self.cdf[f.name], rng.random(int(lengths.sum()))),
                               d.cardinality - 1)
            rows = np.repeat(np.arange(n), lengths)
            wt = np.ones(len(ranks))
            if f.weights:
                wt = np.round(rng.uniform(0.2, 2.0, len(ranks)), 3)
                offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
                cols[f.weights] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(wt))
            logit += scale * np.bincount(rows, self.effects[f.name][ranks] * wt, minlength=n)
            summed[f.name] = (rows, ranks, scale, wt)
            if f.source not in cols:
                cols[f.source] = self._ids(f, ranks, lengths, present)
        for a, b, u, v in self.crosses:
            ra, ka, sa, wa = summed[a]
            rb, kb, sb, wb = summed[b]
            ua = np.stack([np.bincount(ra, u[ka, c] * wa, minlength=n) for c in range(2)], 1)
            vb = np.stack([np.bincount(rb, v[kb, c] * wb, minlength=n) for c in range(2)], 1)
            ua, vb = ua * sa[:, None], vb * sb[:, None]
            logit += (ua * vb).sum(1)
        return cols, logit

    def _ids(self, f, ranks: np.ndarray, lengths: np.ndarray, present: np.ndarray) -> pa.Array:
        """The ids of ``ranks`` written as ``f.id_type`` says: a list per row (multi-hot), or
        one value per row (null where not ``present``)."""
        if f.id_type == "int":
            values = self.codes[f.name][ranks].astype(np.int64)
        elif f.id_type == "string":
            values = np.array([f"{f.name}-{k}" for k in ranks.tolist()], dtype=object)
        else:
            values = np.array([f"{c:08x}" for c in (self.codes[f.name][ranks] & 0xFFFFFFFF)
                               .tolist()], dtype=object)
        kind = pa.int64() if f.id_type == "int" else pa.string()
        if f.kind == "multi_hot":
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, kind))
        full = np.zeros(len(present), np.int64) if f.id_type == "int" else \
            np.full(len(present), None, dtype=object)
        full[present] = values
        return pa.array(full, kind, mask=~present)

    def block(self, index: int, n: int) -> tuple[pa.Table, np.ndarray]:
        rng = np.random.default_rng([self.cfg.seed, 9, index])
        cols, logit = self._sample(rng, n)
        prob = _sigmoid(logit + self.bias)
        label = (rng.random(n) < prob).astype(np.int8)
        return pa.table({self.schema.label: label, **cols}), prob


def generate_table(schema: FeatureSchema, cfg: TableSynthConfig, path: str | os.PathLike,
                   progress: Callable[[int], None] | None = None) -> TableSynthReport:
    """Write ``cfg.num_rows`` rows of ``schema``'s source columns to the parquet file ``path``,
    and their true probabilities beside it. A file made from the same config and schema is
    reused."""
    path = Path(path)
    fingerprint = hashlib.sha256(json.dumps(
        {"cfg": to_dict(cfg), "schema": to_dict(schema), "v": 1}, sort_keys=True,
        default=str).encode()).hexdigest()[:16]
    meta = path.with_suffix(".json")
    oracle_path = str(path) + ".oracle.npy"
    if meta.exists() and path.exists() and Path(oracle_path).exists():
        known = json.loads(meta.read_text())
        if known.get("fingerprint") == fingerprint:
            log.info("reusing %s (same config and schema)", path)
            return TableSynthReport(**known)
    model = SchemaPlantedModel(schema, cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    probs, labels = [], []
    writer = None
    done = 0
    try:
        for i, start in enumerate(range(0, cfg.num_rows, BLOCK_ROWS)):
            n = min(BLOCK_ROWS, cfg.num_rows - start)
            table, prob = model.block(i, n)
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, compression="zstd")
            writer.write_table(table)
            probs.append(prob)
            labels.append(table.column(schema.label).to_numpy())
            done += n
            if progress:
                progress(n)
    finally:
        if writer is not None:
            writer.close()
    p, y = np.concatenate(probs), np.concatenate(labels)
    np.save(oracle_path, p)
    rep = TableSynthReport(str(path), oracle_path, done, float(auc_score(y, p)),
                           float(y.mean()), fingerprint)
    meta.write_text(json.dumps(to_dict(rep)))
    log.info("generated %d rows for the schema (%d dense, %d sparse): CTR %.3f, oracle AUC %.4f",
             done, len(schema.dense), len(schema.sparse), rep.ctr, rep.oracle_auc)
    return rep
