"""One file (over 500 lines): the planted model draws every column and its effect on the logit
in one pass over a block (attributes follow their owner's ids, crosses read the drawn bags), so
the drawing and the model are one object; its config and writer are what is around it.

Synthetic click data for any feature schema, with a planted model, so the best achievable AUC
is known (the Criteo preset has its own generator, ``recscale.data.synthetic``).

Each row holds the schema's source columns. A categorical feature's ids are drawn from a Zipf law
over its ``cardinality`` distinct values (``data.generator.features``); a multi-hot feature's list
holds ``Poisson(pooling)`` of them (empty is missing); ids are written as the feature's
``id_type`` says: integers (spread over a wide range), strings (``"<name>-<k>"``) or hex. A dense
feature's raw value is log-normal. Missing values: ``missing`` of the rows (null).

Ids that arrive over time (a feature's ``lifetime`` > 0): rows are in time order, row ``i`` of
``num_rows`` at time ``t = i / num_rows``. Each id has an arrival time, uniform in
``[-3 lifetime, 1)``, and an activity weight, log-normal with sigma ``zipf_exponent``; a row at
time ``t`` draws among the ids arrived by then, each with its weight times
``exp(-(t - arrival) / lifetime)``. New users keep arriving and old ones fade, so under a time
split most test rows hold a user the train rows never saw, and the popular items drift. The
weights are computed once per thousandth of the log, over the ids arrived by the start of that
slice. A feature on another's table (a history of items) shares that feature's arrival times and
weights, and its lifetime unless it sets its own.

Attributes (``of``): a feature may be a property of another categorical feature's id (a user's
age, an item's genres or price): each id of that feature has its value(s), drawn once by the
attribute's own law, and a row carries the values of its id (missing where the id is).

The planted model: every id has an effect, drawn from one law for all of a feature's ids (those
that arrive late included); a bag's effect is the sum of its ids' (each times its weight, drawn
in [0.2, 2) for a feature with ``weights``) over ``sqrt(pooling)``, or over the bag's length for
``pooling: mean``; pairs of sparse features (``cross_pairs``, else the first ``crosses`` pairs in
schema order) have low-rank crosses of their (summed) vectors; every dense feature has a linear
effect on ``log1p`` of its column's value (two dense features of one column see the same value).
``effect: 0`` makes a feature pure noise. The label is Bernoulli(sigmoid(logit + bias)), the
bias set so the mean click rate is ``base_ctr``. The probability of every row is written beside
the file (``<file>.oracle.npy``) and the AUC of those probabilities on the generated labels
reported: what no model can expect to beat.

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
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recscale.config import Validated, check, check_choice, to_dict
from recscale.data.schema import FeatureSchema

log = logging.getLogger(__name__)

BLOCK_ROWS = 1 << 15
TIME_SLICES = 1000  # arriving ids: their weights are computed once per slice of the log
WARM_UP = 3.0  # arrivals start this many lifetimes before the log (a steady state at its start)


@dataclass(frozen=True)
class FeatureDraw(Validated):
    """How one feature's values are drawn (``data.generator.features.<name>``)."""

    cardinality: int = 1000  # sparse: distinct ids
    pooling: float = 4.0  # multi-hot: mean list length (Poisson)
    missing: float = 0.02  # fraction of rows without a value
    effect: float = 1.0  # scales the feature's planted effect (0: pure noise)
    # > 0: ids arrive over the log and fade, weight exp(-(t - arrival) / lifetime), t in [0, 1)
    lifetime: float = 0.0
    of: str | None = None  # an attribute of this categorical feature's id (fixed per id)

    def validate(self, prefix: str = "data.generator.features") -> None:
        check(self.cardinality >= 1, f"{prefix}.cardinality", self.cardinality, ">= 1")
        check(self.pooling > 0, f"{prefix}.pooling", self.pooling, "> 0")
        check(0 <= self.missing < 1, f"{prefix}.missing", self.missing, "in [0, 1)")
        check(self.effect >= 0, f"{prefix}.effect", self.effect, ">= 0")
        check(self.lifetime >= 0, f"{prefix}.lifetime", self.lifetime, ">= 0")
        check(self.of is None or (isinstance(self.of, str) and bool(self.of)), f"{prefix}.of",
              self.of, "null or the name of a categorical sparse feature")
        check(self.of is None or self.lifetime == 0, f"{prefix}.lifetime", self.lifetime,
              "0 for an attribute (`of`): it follows its owner's ids")


@dataclass(frozen=True)
class TimeColumn(Validated):
    """``data.generator.time``: a column of each row's time, and the order rows are written in."""

    column: str = "ts"
    start: str = "2026-01-01"  # the log's first time (ISO date)
    days: float = 90.0  # the log spans this many days; row i of n at start + i / n of it
    # time: rows written in time order; shuffled: in a seeded random order (a log as it comes
    # from several sources, not sorted; the generator holds the rows in memory to shuffle them)
    order: Literal["time", "shuffled"] = "time"

    def validate(self, prefix: str = "data.generator.time") -> None:
        check(isinstance(self.column, str) and bool(self.column), f"{prefix}.column",
              self.column, "a column name")
        check(self.days > 0, f"{prefix}.days", self.days, "> 0")
        check_choice(f"{prefix}.order", self.order, ("time", "shuffled"))
        try:
            np.datetime64(self.start, "s")
        except ValueError:
            check(False, f"{prefix}.start", self.start, "an ISO date ('2026-01-01')")

    def seconds(self, times: np.ndarray) -> np.ndarray:
        """Times in [0, 1) of the log -> seconds since 1970-01-01."""
        t0 = np.datetime64(self.start, "s").astype(np.int64)
        return t0 + np.floor(times * self.days * 86400).astype(np.int64)


@dataclass(frozen=True)
class TableSynthConfig(Validated):
    num_rows: int = 100_000
    seed: int = 0
    zipf_exponent: float = 1.1
    base_ctr: float = 0.25
    signal_strength: float = 1.0
    crosses: int = 2  # low-rank crosses between the first pairs of sparse features
    # the crossed pairs by feature name; empty: the first ``crosses`` pairs in schema order
    cross_pairs: tuple[tuple[str, str], ...] = ()
    features: Mapping[str, FeatureDraw] = field(default_factory=dict)
    time: TimeColumn | None = None  # a time column (and the rows' order); null: none
    # with a label rule: the values written for clicks and for the rest, each row's drawn
    # uniformly (e.g. ratings {click: [4, 5], other: [1, 2, 3]}); null: one of each
    label_values: Mapping[str, tuple[Any, ...]] | None = None

    def validate(self, prefix: str = "data.generator") -> None:
        if self.label_values is not None:
            check(set(self.label_values) == {"click", "other"}
                  and all(len(v) >= 1 for v in self.label_values.values()),
                  f"{prefix}.label_values", self.label_values,
                  "{click: [values], other: [values]}, each at least one value")
        check(self.num_rows >= 1, f"{prefix}.num_rows", self.num_rows, ">= 1")
        check(self.zipf_exponent > 0, f"{prefix}.zipf_exponent", self.zipf_exponent, "> 0")
        check(0 < self.base_ctr < 1, f"{prefix}.base_ctr", self.base_ctr, "in (0, 1)")
        check(self.crosses >= 0, f"{prefix}.crosses", self.crosses, ">= 0")
        for i, pair in enumerate(self.cross_pairs):
            check(len(pair) == 2 and pair[0] != pair[1], f"{prefix}.cross_pairs[{i}]",
                  list(pair), "two different sparse features' names")

    def draw(self, name: str) -> FeatureDraw:
        return self.features.get(name) or FeatureDraw()


@dataclass(frozen=True)
class TableSynthReport:
    path: str
    oracle_path: str  # the rows' true click probabilities (.npy)
    labels_path: str  # the clicks drawn from them (int8 .npy)
    num_rows: int
    ctr: float
    fingerprint: str


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# one feature's drawn ids on a block: (row of each id, its rank, each row's pooling scale, each
# id's weight)
Bag = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def cross_effect(a: Bag, b: Bag, u: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    """A planted low-rank cross on ``n`` rows: each row's pooled ``u`` vectors of bag ``a``
    dotted with its pooled ``v`` vectors of bag ``b``."""
    (ra, ka, sa, wa), (rb, kb, sb, wb) = a, b
    ua = np.stack([np.bincount(ra, u[ka, c] * wa, minlength=n) for c in range(u.shape[1])], 1)
    vb = np.stack([np.bincount(rb, v[kb, c] * wb, minlength=n) for c in range(v.shape[1])], 1)
    return ((ua * sa[:, None]) * (vb * sb[:, None])).sum(1)


def _gather_bags(offsets: np.ndarray, owner: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Positions, in a flat array of per-id bags (``offsets``), of the bags of ``owner`` ids
    (``lengths[i]`` of bag ``owner[i]``; 0 for a row without one), in row order."""
    total = int(lengths.sum())
    starts = np.repeat(offsets[owner] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return starts + np.arange(total)


class SchemaPlantedModel:
    """The planted click model of a schema (module docstring)."""

    def __init__(self, schema: FeatureSchema, cfg: TableSynthConfig):
        self.schema, self.cfg = schema, cfg
        rng = np.random.default_rng([cfg.seed, 7])
        s = cfg.signal_strength
        # histories are built from the log by preprocessing: nothing of theirs is drawn
        self.sparse = [f for f in schema.sparse if f.kind != "history"]
        self.draws = {f.name: cfg.draw(f.name) for f in [*schema.dense, *self.sparse]}
        self._check_names()
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
        by_name = {f.name: f for f in self.sparse}
        if cfg.cross_pairs:
            pairs = [(by_name[a], by_name[b]) for a, b in cfg.cross_pairs]
        else:
            pairs = [(a, b) for i, a in enumerate(self.sparse) for b in self.sparse[i + 1:]]
            pairs = pairs[: cfg.crosses]
        self.crosses = []
        for a, b in pairs:
            u = rng.normal(0, 0.5 * s, (self.draws[a.name].cardinality, 2))
            v = rng.normal(0, 0.5 * s, (self.draws[b.name].cardinality, 2))
            self.crosses.append((a.name, b.name, u, v))
        self.dense_w = {f.name: rng.normal(0, 0.4 * s * self.draws[f.name].effect)
                        for f in schema.dense}
        self.dense_mu = {f.name: rng.uniform(0.5, 3.0) for f in schema.dense}
        self._draw_arrivals()
        self._draw_attributes()
        self.bias = 0.0
        n = 50_000
        logits = self._sample(np.random.default_rng([cfg.seed, 8]), (np.arange(n) + 0.5) / n)[1]
        lo, hi = -20.0, 20.0
        for _ in range(60):  # the bias that gives base_ctr on average
            mid = (lo + hi) / 2
            if _sigmoid(logits + mid).mean() < cfg.base_ctr:
                lo = mid
            else:
                hi = mid
        self.bias = (lo + hi) / 2

    def _check_names(self) -> None:
        """``cross_pairs`` and ``of`` name sparse features of the schema (``of`` a categorical
        one that is not itself an attribute)."""
        kinds = {f.name: f.kind for f in self.sparse}
        for i, pair in enumerate(self.cfg.cross_pairs):
            for name in pair:
                check(name in kinds, f"data.generator.cross_pairs[{i}]", list(pair),
                      "names of sparse features of the schema: " + ", ".join(kinds))
        for name, d in self.draws.items():
            if d.of is None:
                continue
            owner = self.draws.get(d.of)
            check(kinds.get(d.of) == "categorical" and d.of != name and owner.of is None,
                  f"data.generator.features.{name}.of", d.of,
                  "a categorical sparse feature of the schema that is not itself an attribute")

    def _draw_arrivals(self) -> None:
        """Arrival times, weights and lifetimes of the features whose ids arrive."""
        self.arrivals: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
        for i, f in enumerate(self.sparse):
            d = self.draws[f.name]
            first = next(g for g in self.sparse if g.table_name == f.table_name)
            if first is not f and first.name in self.arrivals:
                at, weight, life = self.arrivals[first.name]
                idx = np.arange(d.cardinality) % len(at)
                self.arrivals[f.name] = (at[idx], weight[idx], d.lifetime or life)
            elif d.lifetime > 0:
                rng = np.random.default_rng([self.cfg.seed, 10, i])
                at = rng.uniform(-WARM_UP * d.lifetime, 1.0, d.cardinality)
                weight = rng.lognormal(0.0, self.cfg.zipf_exponent, d.cardinality)
                self.arrivals[f.name] = (at, weight, d.lifetime)

    def _draw_attributes(self) -> None:
        """The fixed value(s) of every attribute (``of``) for each id of its owner."""
        self.attrs: dict[str, dict[str, np.ndarray]] = {}
        for i, f in enumerate([*self.schema.dense, *self.sparse]):
            d = self.draws[f.name]
            if d.of is None:
                continue
            rng = np.random.default_rng([self.cfg.seed, 11, i])
            n = self.draws[d.of].cardinality
            present = rng.random(n) >= d.missing
            if f in self.schema.dense:
                x = rng.lognormal(self.dense_mu[f.name], 1.0, n)
                self.attrs[f.name] = {"x": x, "present": present}
                continue
            lengths = present.astype(np.int64) if f.kind == "categorical" else \
                np.where(present, rng.poisson(d.pooling, n), 0).astype(np.int64)
            ranks = np.minimum(np.searchsorted(self.cdf[f.name], rng.random(int(lengths.sum()))),
                               d.cardinality - 1)
            wt = np.round(rng.uniform(0.2, 2.0, len(ranks)), 3) if f.weights else \
                np.ones(len(ranks))
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            self.attrs[f.name] = {"present": present, "lengths": lengths, "offsets": offsets,
                                  "ranks": ranks, "weights": wt}

    def _ranks(self, f, rng: np.random.Generator, lengths: np.ndarray,
               times: np.ndarray) -> np.ndarray:
        """``lengths.sum()`` ids of ``f`` for rows at ``times`` (ascending), in row order."""
        d = self.draws[f.name]
        u = rng.random(int(lengths.sum()))
        if f.name not in self.arrivals:
            return np.minimum(np.searchsorted(self.cdf[f.name], u), d.cardinality - 1)
        at, weight, life = self.arrivals[f.name]
        slot = np.repeat(np.minimum((times * TIME_SLICES).astype(np.int64), TIME_SLICES - 1),
                         lengths)
        ranks = np.empty(len(u), np.int64)
        firsts = np.flatnonzero(np.diff(slot, prepend=-1))
        for j, start in enumerate(firsts):
            stop = firsts[j + 1] if j + 1 < len(firsts) else len(u)
            t0 = slot[start] / TIME_SLICES
            w = np.where(at <= t0, weight * np.exp(-np.maximum(t0 + 0.5 / TIME_SLICES - at, 0)
                                                   / life), 0.0)
            if not w.any():  # nothing arrived yet (a tiny lifetime): the first to arrive
                w[np.argmin(at)] = 1.0
            cdf = np.cumsum(w)
            ranks[start:stop] = np.minimum(np.searchsorted(cdf, u[start:stop] * cdf[-1]),
                                           len(w) - 1)
        return ranks

    def _sample(self, rng: np.random.Generator, times: np.ndarray) -> tuple[dict, np.ndarray]:
        """Rows at ``times`` (ascending, in [0, 1)): their source columns and planted logits."""
        n = len(times)
        logit = np.zeros(n)
        cols: dict[str, pa.Array | None] = {}
        for f in self.schema.dense:  # the columns in the order they are first drawn
            cols.setdefault(f.source, None)
        for f in self.sparse:
            if f.weights:
                cols.setdefault(f.weights, None)
            cols.setdefault(f.source, None)
        summed: dict[str, Bag] = {}
        owned: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # an owner's (present, id) per row
        seen: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # a dense column's (value, present)
        col_owner = {}  # a dense column whose first feature is an attribute: its owner
        for f in self.schema.dense:
            col_owner.setdefault(f.source, self.draws[f.name].of)
        for f in self.schema.dense:
            if col_owner[f.source] is not None:
                continue
            d = self.draws[f.name]
            x = rng.lognormal(self.dense_mu[f.name], 1.0, n)
            present = rng.random(n) >= d.missing
            x, present = seen.setdefault(f.source, (x, present))
            logit += self.dense_effect(f, x, present)
            if cols[f.source] is None:
                cols[f.source] = pa.array(np.round(x, 4), mask=~present)
        for f in self.sparse:
            d = self.draws[f.name]
            if d.of is not None:
                continue
            present = rng.random(n) >= d.missing
            if f.kind == "multi_hot":
                lengths = np.where(present, rng.poisson(d.pooling, n), 0).astype(np.int64)
            else:
                lengths = present.astype(np.int64)
            ranks = self._ranks(f, rng, lengths, times)
            wt = np.ones(len(ranks))
            if f.weights:
                wt = np.round(rng.uniform(0.2, 2.0, len(ranks)), 3)
            if f.kind == "categorical":
                ids = np.full(n, -1, np.int64)
                ids[present] = ranks
                owned[f.name] = (present, ids)
            logit += self._bag(f, cols, summed, present, lengths, ranks, wt)
        for f in self.schema.dense:
            owner = col_owner[f.source]
            if owner is None:
                continue
            a = self.attrs[next(g.name for g in self.schema.dense if g.source == f.source)]
            o_present, o_ids = owned[owner]
            present = o_present & a["present"][np.maximum(o_ids, 0)]
            x = a["x"][np.maximum(o_ids, 0)]
            logit += self.dense_effect(f, x, present)
            if cols[f.source] is None:
                cols[f.source] = pa.array(np.round(x, 4), mask=~present)
        for f in self.sparse:
            d = self.draws[f.name]
            if d.of is None:
                continue
            a = self.attrs[f.name]
            o_present, o_ids = owned[d.of]
            lengths = np.where(o_present, a["lengths"][np.maximum(o_ids, 0)], 0)
            pos = _gather_bags(a["offsets"], np.maximum(o_ids, 0), lengths)
            present = lengths > 0 if f.kind == "categorical" else o_present & \
                a["present"][np.maximum(o_ids, 0)]
            logit += self._bag(f, cols, summed, present, lengths, a["ranks"][pos],
                               a["weights"][pos])
        for a, b, u, v in self.crosses:
            logit += cross_effect(summed[a], summed[b], u, v, n)
        return cols, logit

    def dense_effect(self, f, x: np.ndarray, present: np.ndarray) -> np.ndarray:
        """Dense feature ``f``'s planted effect on rows of raw value ``x`` (0 where not
        ``present``)."""
        z = np.log1p(x) - self.dense_mu[f.name]
        return np.where(present, self.dense_w[f.name] * z, 0.0)

    def pooling_scale(self, f, lengths: np.ndarray) -> np.ndarray:
        """What a row's summed ids of ``f`` are multiplied by: 1 (one id), 1 / sqrt(pooling)
        (a multi-hot sum) or 1 / its length (``pooling: mean``)."""
        n = len(lengths)
        d = self.draws[f.name]
        scale = np.full(n, 1.0 / np.sqrt(d.pooling)) if f.kind == "multi_hot" else np.ones(n)
        return 1.0 / np.maximum(lengths, 1) if f.pooling == "mean" else scale

    def bag_effect(self, f, bag: Bag, n: int) -> np.ndarray:
        """``f``'s planted effect on each of ``n`` rows from its drawn ids ``bag``."""
        rows, ranks, scale, wt = bag
        return scale * np.bincount(rows, self.effects[f.name][ranks] * wt, minlength=n)

    def _bag(self, f, cols: dict, summed: dict, present: np.ndarray, lengths: np.ndarray,
             ranks: np.ndarray, wt: np.ndarray) -> np.ndarray:
        """The planted effect of ``f``'s ids per row; writes its column(s) (first time only)."""
        n = len(lengths)
        rows = np.repeat(np.arange(n), lengths)
        if f.weights:
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            cols[f.weights] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(wt))
        summed[f.name] = (rows, ranks, self.pooling_scale(f, lengths), wt)
        if cols[f.source] is None:
            cols[f.source] = self._ids(f, ranks, lengths, present)
        return self.bag_effect(f, summed[f.name], n)

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

    def block(self, index: int, n: int) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        """Rows ``index * BLOCK_ROWS ..``: the table, the true probabilities and the clicks (the
        label column holds them as 0/1, or as values the schema's label rule reads so)."""
        rng = np.random.default_rng([self.cfg.seed, 9, index])
        start = index * BLOCK_ROWS
        times = (start + np.arange(n)) / self.cfg.num_rows
        cols, logit = self._sample(rng, times)
        prob = _sigmoid(logit + self.bias)
        label = (rng.random(n) < prob).astype(np.int8)
        rule = self.schema.label_rule
        if rule is None:
            written = label
        elif self.cfg.label_values is None:  # the non-click value at 0, the click value at 1
            written = pa.array(np.array([rule.example(False), rule.example(True)],
                                        dtype=object)[label].tolist())
        else:  # each row one of its class's values, uniformly
            pick = rng.random(n)
            values = [np.array(self.cfg.label_values[k], dtype=object) for k in ("other", "click")]
            written = pa.array([values[c][int(u * len(values[c]))]
                                for c, u in zip(label.tolist(), pick.tolist())])
        if self.cfg.time is not None:
            cols[self.cfg.time.column] = pa.array(self.cfg.time.seconds(times))
        return pa.table({self.schema.label_column: written, **cols}), prob, label


def check_label_values(schema: FeatureSchema, cfg: TableSynthConfig) -> None:
    """``label_values`` are read by the schema's label rule as their class says."""
    if cfg.label_values is None:
        return
    rule = schema.label_rule
    check(rule is not None, "data.generator.label_values", cfg.label_values,
          "null unless features.label is a rule ({column, positive})")
    for key, want in (("click", True), ("other", False)):
        for v in cfg.label_values[key]:
            read = rule.clicks_of_numbers(np.array([float(v)]))[0] if rule.numeric and \
                isinstance(v, (int, float)) else rule.clicks_of_text(np.array([str(v)], object))[0]
            check(bool(read) == want,
                  f"data.generator.label_values.{key}", list(cfg.label_values[key]),
                  f"values features.label.positive ({rule.positive!r}) reads as "
                  f"{'clicks' if want else 'non-clicks'}")


def generate_table(schema: FeatureSchema, cfg: TableSynthConfig, path: str | os.PathLike,
                   progress: Callable[[int], None] | None = None) -> TableSynthReport:
    """Write ``cfg.num_rows`` rows of ``schema``'s source columns to the parquet file ``path``,
    and their true probabilities beside it. A file made from the same config and schema is
    reused."""
    path = Path(path)
    fingerprint = hashlib.sha256(json.dumps(
        {"cfg": to_dict(cfg), "schema": to_dict(schema), "v": 2}, sort_keys=True,
        default=str).encode()).hexdigest()[:16]
    meta = path.with_suffix(".json")
    oracle_path, labels_path = str(path) + ".oracle.npy", str(path) + ".labels.npy"
    if meta.exists() and path.exists() and Path(oracle_path).exists() \
            and Path(labels_path).exists():
        known = json.loads(meta.read_text())
        if known.get("fingerprint") == fingerprint and known.get("labels_path") == labels_path:
            log.info("reusing %s (same config and schema)", path)
            return TableSynthReport(**known)
    model = SchemaPlantedModel(schema, cfg)
    check_label_values(schema, cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    probs, labels, held = [], [], []
    shuffled = cfg.time is not None and cfg.time.order == "shuffled"
    writer = None
    done = 0
    try:
        for i, start in enumerate(range(0, cfg.num_rows, BLOCK_ROWS)):
            n = min(BLOCK_ROWS, cfg.num_rows - start)
            table, prob, label = model.block(i, n)
            if shuffled:  # written at the end, in a seeded random order
                held.append(table)
            else:
                if writer is None:
                    writer = pq.ParquetWriter(path, table.schema, compression="zstd")
                writer.write_table(table)
            probs.append(prob)
            labels.append(label)
            done += n
            if progress:
                progress(n)
        if shuffled:
            order = np.random.default_rng([cfg.seed, 12]).permutation(done)
            pq.write_table(pa.concat_tables(held).take(pa.array(order)), path,
                           compression="zstd", row_group_size=BLOCK_ROWS)
            probs, labels = [np.concatenate(probs)[order]], [np.concatenate(labels)[order]]
    finally:
        if writer is not None:
            writer.close()
    p, y = np.concatenate(probs), np.concatenate(labels)
    np.save(oracle_path, p)
    np.save(labels_path, y.astype(np.int8))
    rep = TableSynthReport(str(path), oracle_path, labels_path, done, float(y.mean()), fingerprint)
    meta.write_text(json.dumps(to_dict(rep)))
    log.info("generated %d rows for the schema (%d dense, %d sparse): CTR %.3f",
             done, len(schema.dense), len(schema.sparse), rep.ctr)
    return rep
