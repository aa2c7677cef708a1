"""Synthetic Criteo-shaped click data with a planted model, so the best achievable AUC is known.

Each row has a label, 13 heavy-tailed integer counts (some missing, some negative like Criteo's I2)
and 26 categorical ids drawn from Zipf distributions over per-feature cardinalities (the Criteo
Kaggle cardinalities scaled down by default). The label is Bernoulli(sigmoid(logit)) where the
logit is a planted model: dense effects on log1p(counts), per-category effects on a few features,
low-rank crosses between categorical features (what a DLRM's dot interaction can express) and one
dense x categorical cross. The true click probability of every row is written beside the TSV
(``<file>.oracle.npy``), and the AUC of those probabilities on the generated labels, the oracle
AUC, is reported: no model can expect to beat it on this data.

Rows are generated in fixed blocks, each from its own seeded stream, so the same config gives the
same bytes whatever the write chunking, and memory is bounded by one block.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recscale.config import ConfigError, Validated, check, to_dict
from recscale.data.criteo import NUM_DENSE, NUM_SPARSE, CriteoBlock, encode_tsv

log = logging.getLogger(__name__)

# Criteo Display Advertising Challenge (Kaggle) cardinalities of C1..C26.
CRITEO_KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)
# Approximate fraction of missing values per column in the Kaggle training file.
DENSE_MISSING = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0005, 0.04, 0.45, 0.04, 0.77, 0.22)
SPARSE_MISSING = (
    0.0, 0.0, 0.034, 0.034, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.034, 0.0,
    0.0, 0.0, 0.034, 0.0, 0.0, 0.44, 0.44, 0.034, 0.76, 0.0, 0.034, 0.44, 0.44,
)
# log-normal parameters of the counts (location, scale of log(1 + count)), Criteo-like spreads.
DENSE_MU = (0.8, 2.0, 2.4, 1.6, 7.5, 3.5, 1.6, 2.5, 3.7, 0.4, 1.0, 0.3, 1.6)
DENSE_SIGMA = (1.0, 1.6, 1.5, 1.0, 2.0, 1.9, 1.3, 0.9, 1.3, 0.6, 0.9, 0.9, 1.0)

# MLPerf Training DLRM-DCNv2: ids per sample of C1..C26 in its multi-hot Criteo 1TB
MLPERF_MULTI_HOT_SIZES = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10,
                          3, 1, 1)

BLOCK_ROWS = 1 << 16
_FEATURE_SALT = 0x9E3779B9


def scaled_cardinalities(scale: float, keep_below: int) -> tuple[int, ...]:
    """Kaggle cardinalities with the large ones scaled by ``scale`` (never below ``keep_below``)."""
    return tuple(
        c if c <= keep_below else max(keep_below, int(round(c * scale)))
        for c in CRITEO_KAGGLE_CARDINALITIES
    )


@dataclass(frozen=True)
class SyntheticConfig(Validated):
    num_rows: int = 1_000_000
    seed: int = 0
    # explicit per-feature cardinalities (26 ints); null -> Kaggle's scaled by cardinality_scale
    cardinalities: tuple[int, ...] | None = None
    cardinality_scale: float = 0.01
    keep_cardinality_below: int = 1000
    zipf_exponent: float = 1.2
    base_ctr: float = 0.25
    # scales every planted effect: 0 gives labels that carry no signal (oracle AUC 0.5)
    signal_strength: float = 1.0
    # multi-hot: bags of ids per feature (mean bag size per feature: pooling_factors), written
    # as parquet list columns (recscale.data.multihot); false: one id per feature, Criteo TSV
    multi_hot: bool = False
    pooling_factors: tuple[float, ...] = MLPERF_MULTI_HOT_SIZES

    def validate(self, prefix: str = "data.synthetic") -> None:
        check(self.num_rows > 0, f"{prefix}.num_rows", self.num_rows, "a positive integer")
        check(0 < self.cardinality_scale <= 1, f"{prefix}.cardinality_scale",
              self.cardinality_scale, "a number in (0, 1]")
        check(self.zipf_exponent > 0, f"{prefix}.zipf_exponent", self.zipf_exponent, "> 0")
        check(0 < self.base_ctr < 1, f"{prefix}.base_ctr", self.base_ctr, "a number in (0, 1)")
        check(self.signal_strength >= 0, f"{prefix}.signal_strength", self.signal_strength, ">= 0")
        check(len(self.pooling_factors) == NUM_SPARSE and all(p >= 1 for p in self.pooling_factors),
              f"{prefix}.pooling_factors", self.pooling_factors, f"{NUM_SPARSE} numbers >= 1")
        if self.cardinalities is not None:
            check(len(self.cardinalities) == NUM_SPARSE and all(c >= 1 for c in self.cardinalities),
                  f"{prefix}.cardinalities", self.cardinalities, f"{NUM_SPARSE} positive integers")

    @property
    def feature_cardinalities(self) -> tuple[int, ...]:
        if self.cardinalities is not None:
            return tuple(self.cardinalities)
        return scaled_cardinalities(self.cardinality_scale, self.keep_cardinality_below)

    def fingerprint(self) -> str:
        d = to_dict(self)
        if not self.multi_hot:  # one-hot data keeps the fingerprint it had before bags existed
            d.pop("multi_hot"), d.pop("pooling_factors")
        blob = json.dumps(d, sort_keys=True).encode() + b"v1"
        return hashlib.sha256(blob).hexdigest()[:16]


def raw_ids(feature: int, ranks: np.ndarray) -> np.ndarray:
    """Bijective map (feature, category rank) -> 32-bit id, as an 8-hex-digit Criteo id."""
    salt = np.uint64(((feature + 1) * _FEATURE_SALT) & 0xFFFFFFFF)
    x = (ranks.astype(np.uint64) + salt) & np.uint64(0xFFFFFFFF)
    # murmur3 finaliser: a bijection on 32-bit integers
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x85EBCA6B)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(13)
    x = (x * np.uint64(0xC2B2AE35)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(16)
    return x.astype(np.uint32)


class PlantedModel:
    """The true click model behind the synthetic labels (drawn once from the seed)."""

    def __init__(self, cfg: SyntheticConfig):
        self.cfg = cfg
        cards = np.asarray(cfg.feature_cardinalities, dtype=np.int64)
        self.cards = cards
        rng = np.random.default_rng([cfg.seed, 0xC0FFEE])
        s = cfg.signal_strength
        # Zipf CDF per feature over ranks 0..C-1
        self.cdfs = []
        for c in cards:
            p = 1.0 / np.arange(1, c + 1, dtype=np.float64) ** cfg.zipf_exponent
            cdf = np.cumsum(p)
            self.cdfs.append(cdf / cdf[-1])
        self.dense_w = s * rng.normal(0.0, 0.25, NUM_DENSE)
        self.dense_center = np.asarray(DENSE_MU)
        # main effects on the 8 features with the most mass in few categories (>= 3 categories)
        order = [j for j in np.argsort(-cards) if cards[j] >= 3]
        self.main_features = sorted(order[::3][:8])
        self.main_effects = {
            j: s * rng.normal(0.0, 0.6, cards[j]) for j in self.main_features
        }
        # low-rank crosses u_f[k] . v_g[k'] between categorical features
        self.cross_dim = 4
        cand = [j for j in range(NUM_SPARSE) if cards[j] >= 10]
        picks = rng.choice(cand, size=6, replace=False)
        self.crosses = [(int(picks[2 * i]), int(picks[2 * i + 1])) for i in range(3)]
        self.cross_u = {
            (f, g): s * rng.normal(0.0, 0.5, (cards[f], self.cross_dim)) for f, g in self.crosses
        }
        self.cross_v = {
            (f, g): rng.normal(0.0, 0.5, (cards[g], self.cross_dim)) for f, g in self.crosses
        }
        # one dense x categorical cross: slope of log-count I_d varies by category of C_c
        self.dc_dense = 1
        self.dc_feature = int(picks[0])
        self.dc_slope = s * rng.normal(0.0, 0.3, cards[self.dc_feature])
        self.bias = 0.0
        self.bias = self._calibrate_bias(rng)

    def _calibrate_bias(self, rng: np.random.Generator) -> float:
        pilot = self.sample(np.random.default_rng([self.cfg.seed, 0xB1A5]), 1 << 17)[1]
        target = self.cfg.base_ctr
        lo, hi = -20.0, 20.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if np.mean(_sigmoid(pilot + mid)) < target:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)

    def sample_dense(self, rng: np.random.Generator, n: int):
        """Draw n rows' counts -> (counts, present mask, log1p counts, their logit term)."""
        # dense: log-normal counts, I2 also takes small negative values like Criteo's
        t = rng.normal(self.dense_center, DENSE_SIGMA, (n, NUM_DENSE))
        counts = np.floor(np.expm1(np.clip(t, 0.0, 20.0))).astype(np.int64)
        neg = rng.random(n) < 0.05
        counts[neg, 1] = -rng.integers(1, 4, int(neg.sum()))
        dense_present = rng.random((n, NUM_DENSE)) >= np.asarray(DENSE_MISSING)
        counts[~dense_present] = 0
        # what the preprocessing computes, so the dense effects are learnable exactly
        logc = np.log1p(np.maximum(counts, 0))
        return counts, dense_present, logc, ((logc - self.dense_center) * self.dense_w).sum(axis=1)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[dict, np.ndarray]:
        """Draw n rows -> (columns, logit without bias)."""
        counts, dense_present, logc, logit = self.sample_dense(rng, n)
        ranks = np.empty((n, NUM_SPARSE), dtype=np.int64)
        u = rng.random((n, NUM_SPARSE))
        for j in range(NUM_SPARSE):
            ranks[:, j] = np.minimum(np.searchsorted(self.cdfs[j], u[:, j]), self.cards[j] - 1)
        sparse_present = rng.random((n, NUM_SPARSE)) >= np.asarray(SPARSE_MISSING)
        for j in self.main_features:
            logit += np.where(sparse_present[:, j], self.main_effects[j][ranks[:, j]], 0.0)
        for f, g in self.crosses:
            both = sparse_present[:, f] & sparse_present[:, g]
            dot = (self.cross_u[(f, g)][ranks[:, f]] * self.cross_v[(f, g)][ranks[:, g]]).sum(1)
            logit += np.where(both, dot, 0.0)
        c = self.dc_feature
        logit += np.where(
            sparse_present[:, c],
            self.dc_slope[ranks[:, c]] * (logc[:, self.dc_dense] - self.dense_center[self.dc_dense]),
            0.0,
        )
        cols = {"dense": counts, "dense_present": dense_present, "ranks": ranks,
                "sparse_present": sparse_present}
        return cols, logit

    def block(self, index: int, n: int, day: int = 0) -> tuple[CriteoBlock, np.ndarray]:
        """Rows of generation block ``index`` of ``day`` -> (rows, true click probabilities).
        Every day draws fresh rows from the same planted model (day 0 = the original stream)."""
        rng = np.random.default_rng([self.cfg.seed, 1, index] if day == 0
                                    else [self.cfg.seed, 1, index, day])
        cols, logit = self.sample(rng, n)
        prob = _sigmoid(logit + self.bias)
        label = (rng.random(n) < prob).astype(np.int8)
        sparse = np.empty((n, NUM_SPARSE), dtype=np.uint32)
        for j in range(NUM_SPARSE):
            sparse[:, j] = raw_ids(j, cols["ranks"][:, j])
        sparse[~cols["sparse_present"]] = 0
        start = index * BLOCK_ROWS
        blk = CriteoBlock(
            line=np.arange(start + 1, start + n + 1, dtype=np.int64),
            label=label,
            dense=cols["dense"],
            dense_present=cols["dense_present"],
            sparse=sparse,
            sparse_present=cols["sparse_present"],
        )
        return blk, prob


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class SyntheticReport:
    path: str
    oracle_path: str  # the rows' true click probabilities (float32 .npy)
    labels_path: str  # the clicks drawn from them (int8 .npy): the oracle's AUC is in evaluate
    num_rows: int
    ctr: float
    cardinalities: tuple[int, ...]
    fingerprint: str

    def to_dict(self) -> dict:
        return to_dict(self)


def generate_criteo_tsv(
    cfg: SyntheticConfig,
    path: str | os.PathLike,
    progress: Callable[[int], None] | None = None,
    reuse: bool = True,
    day: int = 0,
) -> SyntheticReport:
    """Write ``cfg.num_rows`` rows of Criteo TSV to ``path`` and the true probabilities beside it.

    With ``reuse``, a file already generated from the same config (same fingerprint in its
    ``.meta.json``) is kept as it is. ``progress`` is called with the rows written so far.
    ``day`` > 0 draws that day's rows from the same planted model (one file per day, as Criteo
    ships them; the oracle AUC stays the ceiling of every day).
    """
    if not isinstance(cfg, SyntheticConfig):
        raise ConfigError(f"expected a SyntheticConfig, got {type(cfg).__name__}")
    check(isinstance(day, int) and day >= 0, "day", day, "an integer >= 0")
    path = Path(path)
    meta_path = path.with_name(path.name + ".meta.json")
    oracle_path = path.with_name(path.name + ".oracle.npy")
    labels_path = path.with_name(path.name + ".labels.npy")
    fp = cfg.fingerprint() + (f"-day{day}" if day else "")
    if reuse and meta_path.exists() and path.exists() and oracle_path.exists() \
            and labels_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("fingerprint") == fp and meta.get("labels_path") == str(labels_path):
            log.info("synthetic data %s already generated from this config; reusing it", path)
            if progress:
                progress(cfg.num_rows)
            return SyntheticReport(**{**meta, "cardinalities": tuple(meta["cardinalities"])})
    path.parent.mkdir(parents=True, exist_ok=True)
    model = PlantedModel(cfg)
    tmp = path.with_name(path.name + ".tmp")
    oracle = np.lib.format.open_memmap(
        oracle_path.with_name(oracle_path.name + ".tmp.npy"), mode="w+", dtype=np.float32,
        shape=(cfg.num_rows,),
    )
    labels = np.empty(cfg.num_rows, dtype=np.int8)
    n_blocks = (cfg.num_rows + BLOCK_ROWS - 1) // BLOCK_ROWS
    with open(tmp, "wb") as fh:
        for b in range(n_blocks):
            start = b * BLOCK_ROWS
            n = min(BLOCK_ROWS, cfg.num_rows - start)
            blk, prob = model.block(b, n, day)
            fh.write(encode_tsv(blk))
            oracle[start : start + n] = prob
            labels[start : start + n] = blk.label
            if progress:
                progress(start + n)
    oracle.flush()
    ctr = float(labels.mean())
    del oracle
    np.save(labels_path, labels)
    os.replace(tmp, path)
    os.replace(oracle_path.with_name(oracle_path.name + ".tmp.npy"), oracle_path)
    report = SyntheticReport(
        path=str(path), oracle_path=str(oracle_path), labels_path=str(labels_path),
        num_rows=cfg.num_rows, ctr=ctr, cardinalities=model.cards.tolist(), fingerprint=fp,
    )
    meta_path.write_text(json.dumps(report.to_dict(), indent=2))
    log.info("wrote %d synthetic rows to %s (CTR %.4f)", cfg.num_rows, path, ctr)
    return report
