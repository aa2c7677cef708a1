"""The achievable bound of a planted-data env: the planted model's own form refit on the train
split only, beside the oracle (the true probabilities) on the same test rows.

The generator (``recscale.data.synthetic_table``) draws each label from a known logistic model:
an effect per id of every sparse feature (a bag pooled as planted: the sum over ``sqrt(pooling)``,
or the mean; times each id's weight), one table's effects shared by the features on that table
(scaled per feature), low-rank crosses between the planted pairs, and a linear effect of each
dense column's ``log1p``. This script fits exactly that form, by full-batch L-BFGS (scipy), on the train
split's rows (the first ``preprocess.splits[0]`` of the file, in time order), with L2 on every
id's parameters chosen on the validation split; an id the train rows never hold keeps effect 0
(the prior's mean: L2 pulls every effect there). Its test AUC and log loss are what a model can
reach from these train rows; the oracle's are what no model can expect to beat. Beside them: the
best single feature's smoothed train click rate (chosen on validation), the cheap bar, and the
share of test rows whose id the train rows never held, per categorical feature.

It reads the env's conf (conf/base merged with conf/<env>), generates the env's raw file if
it is not there (the same file the dlrm pipeline writes; reused when the config is unchanged)
and reads the raw parquet and its ``.oracle.npy`` directly.

An env on the Criteo preset (``features: criteo``: conf/base, conf/mlperf_dcnv2) draws from
``recscale.data.synthetic`` (multi-hot: ``recscale.data.multihot``). Its rows are regenerated in
memory from the generator's own per-block streams (checked equal to the raw file's
``.oracle.npy`` where that file exists from the same config; nothing is written), and the form
refit is that model's: a per-category effect on each of its 8 main features, its 3 crosses as
rank-4 factorisations (the dot of a vector per category of each side), the per-category slope
of ``log1p(I2)`` (minus the generator's centre of it), a weight per ``log1p`` count and a bias; a
multi-hot bag is read as planted (the sum of its ids' parameters over ``sqrt(pooling)``). L2 on
the per-category parameters: one value for all, strongest first while validation improves, then
the crosses' own beside it. A category the train rows never hold keeps every parameter at 0.
Beside the oracle it prints the unseen-ids bound: the true parameters with those of categories
unseen in the (fitted) train rows set to 0. ``--max-train`` fits on the latest train rows only.

    nice -n 5 python benchmarks/quality_bound.py --env arriving --env clicklog
    nice -n 5 python benchmarks/quality_bound.py --env arriving --rows 100000   # quicker, tmp dir
    nice -n 5 python benchmarks/quality_bound.py --out /tmp/qb     # not the envs' raw_dir
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/quality_bound.py --env base
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/quality_bound.py --env mlperf_dcnv2 \
        --max-train 800000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import scipy.sparse as sp
import yaml
from scipy.optimize import minimize

from recscale.config import parse
from recscale.data.criteo import NUM_DENSE
from recscale.data.multihot import MultiHotPlantedModel
from recscale.data.processed import split_bounds
from recscale.data.schema import FeatureSchema, parse_features
from recscale.data.source import DataConfig
from recscale.data.synthetic import BLOCK_ROWS, PlantedModel, SyntheticConfig, _sigmoid
from recscale.data.synthetic_table import generate_table
from recscale.evaluate.metrics import auc_score, log_loss

ROOT = Path(__file__).resolve().parents[1]
L2_GRID = (1.0, 2.0, 4.0)  # per-parameter L2, in units of the train rows' mean log loss x rows
RANK = 2  # the planted crosses' rank


def merged(base: dict, over: dict) -> dict:
    """``over`` merged into ``base`` key by key (Kedro's soft merge of an env)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def env_params(env: str) -> dict:
    params = yaml.safe_load((ROOT / "conf/base/parameters_dlrm.yml").read_text())
    path = ROOT / "conf" / env / "parameters_dlrm.yml"
    return merged(params, yaml.safe_load(path.read_text())) if env != "base" else params


def flat_ids(col: pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """A categorical or list column -> its ids, flat, and the number of ids of each row."""
    col = col.combine_chunks()
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy().astype(np.int64)
        return pc.list_flatten(col), lengths
    lengths = (~col.is_null().to_numpy(zero_copy_only=False)).astype(np.int64)
    return col.drop_null(), lengths


def design(table: pa.Table, schema: FeatureSchema, pooling: dict, n_train: int):
    """The rows of ``table`` as the planted form reads them: per sparse feature a sparse matrix
    (rows x its table's train vocabulary; an id the train rows never hold has no column) of the
    ids' pooled weights, and per dense column log1p of the value (standardized on the train rows)
    and a missing flag."""
    tables: dict[str, list] = {}
    raw = {}
    for f in schema.sparse:
        ids, lengths = flat_ids(table.column(f.source))
        raw[f.name] = (ids, lengths)
        tables.setdefault(f.table_name, []).append(ids.slice(0, int(lengths[:n_train].sum())))
    vocab = {t: pc.unique(pa.chunked_array(v).combine_chunks()) for t, v in tables.items()}
    sparse = {}
    for f in schema.sparse:
        ids, lengths = raw[f.name]
        idx = pc.fill_null(pc.index_in(ids, value_set=vocab[f.table_name]), -1).to_numpy()
        w = np.ones(len(idx))
        if f.weights:
            w = pc.list_flatten(table.column(f.weights).combine_chunks()).to_numpy()
        row_scale = 1.0 / np.maximum(lengths, 1) if f.pooling == "mean" else \
            np.full(len(lengths), 1.0 / np.sqrt(pooling[f.name]) if f.kind == "multi_hot" else 1.0)
        rows = np.repeat(np.arange(len(lengths)), lengths)
        keep = idx >= 0
        sparse[f.name] = sp.csr_matrix(
            ((w * np.repeat(row_scale, lengths))[keep], (rows[keep], idx[keep])),
            shape=(len(lengths), len(vocab[f.table_name])))
    dense = []
    for c in dict.fromkeys(f.source for f in schema.dense):
        x = table.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
        miss = np.isnan(x)
        z = np.log1p(np.where(miss, 0.0, np.maximum(x, 0)))
        mu, sd = z[:n_train][~miss[:n_train]].mean(), z[:n_train][~miss[:n_train]].std() + 1e-9
        dense += [np.where(miss, 0.0, (z - mu) / sd), miss.astype(np.float64)]
    dense = np.stack(dense, 1) if dense else np.zeros((table.num_rows, 0))
    return sparse, dense, {t: len(v) for t, v in vocab.items()}


class PlantedForm:
    """The planted model's form with free parameters (module docstring): per table an effect
    per id (a feature on an earlier feature's table reads them times the ratio of the two
    features' planted ``effect``, as the generator plants them), per crossed pair a rank-2
    vector per id of each side, a weight per dense column and its missing flag, and a bias; its
    penalised log loss and gradient in closed form."""

    def __init__(self, schema: FeatureSchema, sizes: dict, crosses: list, n_dense: int,
                 ratio: dict[str, float]):
        self.schema, self.crosses, self.ratio = schema, crosses, ratio
        self.table_of = {f.name: f.table_name for f in schema.sparse}
        shapes = [(f"t_{t}", (n,)) for t, n in sizes.items()]
        for i, pair in enumerate(crosses):
            shapes += [(f"x{i}_{k}", (sizes[self.table_of[name]], RANK))
                       for k, name in enumerate(pair)]
        shapes += [("w", (n_dense,)), ("b", ())]
        self.slices, start = {}, 0
        for name, shape in shapes:
            size = int(np.prod(shape))
            self.slices[name] = (slice(start, start + size), shape)
            start += size
        self.size = start
        self.penalised = np.zeros(start, bool)
        for name, (sl, _) in self.slices.items():
            self.penalised[sl] = name.startswith(("t_", "x"))

    def init(self) -> np.ndarray:
        theta = np.zeros(self.size)
        rng = np.random.default_rng(0)
        for name, (sl, _) in self.slices.items():
            if name.startswith("x"):
                theta[sl] = 0.01 * rng.standard_normal(sl.stop - sl.start)
        return theta

    def view(self, theta: np.ndarray, name: str) -> np.ndarray:
        sl, shape = self.slices[name]
        return theta[sl].reshape(shape)

    def logit(self, theta, X, dense, parts: dict | None = None) -> np.ndarray:
        out = dense @ self.view(theta, "w") + self.view(theta, "b")
        for f in self.schema.sparse:
            lin = X[f.name] @ self.view(theta, f"t_{f.table_name}")
            if parts is not None:
                parts[f.name] = lin
            out = out + self.ratio[f.name] * lin
        for i, (a, b) in enumerate(self.crosses):
            pa_, pb = X[a] @ self.view(theta, f"x{i}_0"), X[b] @ self.view(theta, f"x{i}_1")
            if parts is not None:
                parts[(i, 0)], parts[(i, 1)] = pa_, pb
            out = out + (pa_ * pb).sum(1)
        return out

    def loss_grad(self, theta, X, dense, y, l2: float):
        parts: dict = {}
        z = self.logit(theta, X, dense, parts)
        n = len(y)
        loss = np.mean(np.logaddexp(0, z) - y * z) + l2 / n * (theta[self.penalised] ** 2).sum()
        r = (1.0 / (1.0 + np.exp(-z)) - y) / n
        g = np.zeros_like(theta)
        g[self.penalised] = 2 * l2 / n * theta[self.penalised]
        self.view(g, "w")[...] += dense.T @ r
        g[self.slices["b"][0]] += r.sum()
        for f in self.schema.sparse:
            self.view(g, f"t_{f.table_name}")[...] += self.ratio[f.name] * (X[f.name].T @ r)
        for i, (a, b) in enumerate(self.crosses):
            self.view(g, f"x{i}_0")[...] += X[a].T @ (r[:, None] * parts[(i, 1)])
            self.view(g, f"x{i}_1")[...] += X[b].T @ (r[:, None] * parts[(i, 0)])
        return loss, g


def fit(form: PlantedForm, X, dense, y, l2: float, theta0: np.ndarray, iters: int = 400):
    """L-BFGS of the planted form's log loss + ``l2 / rows`` x the squared id parameters."""
    res = minimize(form.loss_grad, theta0, args=(X, dense, y, l2), jac=True, method="L-BFGS-B",
                   options={"maxiter": iters, "maxcor": 20})
    return res.x


def predict(form: PlantedForm, theta, X, dense) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-form.logit(theta, X, dense)))


def best_rate(table: pa.Table, schema: FeatureSchema, y: np.ndarray, b: np.ndarray):
    """The smoothed train click rate of the categorical feature best on validation, on test."""
    best = None
    prior = y[: b[0]].mean()
    for f in schema.sparse:
        if f.kind != "categorical":
            continue
        codes = pc.dictionary_encode(table.column(f.source).combine_chunks().cast(pa.string()))
        idx = pc.fill_null(codes.indices, -1).to_numpy().astype(np.int64) + 1
        k = idx.max() + 1
        s = np.bincount(idx[: b[0]], y[: b[0]], k)
        m = np.bincount(idx[: b[0]], minlength=k)
        rate = (s + 10 * prior) / (m + 10)
        val = auc_score(y[b[0]: b[1]], rate[idx[b[0]: b[1]]])
        if best is None or val > best[0]:
            best = (val, f.name, rate[idx[b[1]:]])
    return best[1], best[2]


def unseen_shares(table: pa.Table, schema: FeatureSchema, b: np.ndarray) -> dict[str, float]:
    out = {}
    for f in schema.sparse:
        if f.kind != "categorical":
            continue
        col = table.column(f.source).combine_chunks()
        train = pc.unique(col.slice(0, b[0]).drop_null())
        test = col.slice(b[1]).drop_null()
        out[f.name] = 1.0 - float(pc.mean(pc.is_in(test, value_set=train).cast(pa.int8())).as_py())
    return out


def bound(env: str, rows: int | None, out_dir: Path | None,
          save_validation: Path | None = None) -> dict:
    params = env_params(env)
    data = dict(params["data"])
    if rows:
        data["generator"] = {**data.get("generator", {}), "num_rows": rows}
    data_cfg = parse(DataConfig, data, "data")
    schema = parse_features(params["features"])
    raw_dir = out_dir / env if out_dir else ROOT / data_cfg.raw_dir
    gen = data_cfg.generator
    rep = generate_table(schema, gen, raw_dir / "table_00.parquet")
    table = pq.read_table(rep.path)
    oracle = np.load(rep.oracle_path)
    y = table.column(schema.label).to_numpy().astype(np.float64)
    b = split_bounds(table.num_rows, params["preprocess"].get("splits", [0.8, 0.1, 0.1]))
    pooling = {f.name: gen.draw(f.name).pooling for f in schema.sparse}
    if gen.cross_pairs:
        crosses = [tuple(p) for p in gen.cross_pairs]
    else:
        names = [f.name for f in schema.sparse]
        crosses = [(a, c) for i, a in enumerate(names) for c in names[i + 1:]][: gen.crosses]
    X, dense, sizes = design(table, schema, pooling, int(b[0]))
    part = {s: ({k: v[lo:hi] for k, v in X.items()}, dense[lo:hi], y[lo:hi])
            for s, (lo, hi) in {"train": (0, b[0]), "val": (b[0], b[1]),
                                "test": (b[1], len(y))}.items()}
    first = {}
    for f in schema.sparse:
        first.setdefault(f.table_name, f.name)
    ratio = {f.name: gen.draw(f.name).effect / max(gen.draw(first[f.table_name]).effect, 1e-12)
             for f in schema.sparse}
    form = PlantedForm(schema, sizes, crosses, dense.shape[1], ratio)
    t0 = time.time()
    best, theta = None, form.init()
    for l2 in sorted(L2_GRID, reverse=True):  # strongest first, each warm-starting the next
        theta = fit(form, *part["train"], l2, theta)
        val = log_loss(part["val"][2], predict(form, theta, *part["val"][:2]))
        print(f"  {env}: l2 {l2}: validation log loss {val:.5f}")
        if best is None or val < best[0]:
            best = (val, l2, predict(form, theta, *part["test"][:2]),
                    predict(form, theta, *part["val"][:2]))
    if save_validation is not None:  # quality_residuals.py --env ENV --predictions
        np.savez(save_validation, rows=np.arange(b[0], b[1]), labels=part["val"][2],
                 probs=best[3])
        print(f"  {env}: the fit's validation probabilities written to {save_validation}")
    yt = part["test"][2]
    rate_name, rate_p = best_rate(table, schema, y, b)
    return {"env": env, "rows": table.num_rows, "test_rows": len(yt), "l2": best[1],
            "fit_s": time.time() - t0,
            "oracle": (auc_score(yt, oracle[b[1]:]), log_loss(yt, oracle[b[1]:])),
            "bound": (auc_score(yt, best[2]), log_loss(yt, best[2])),
            "rate": (auc_score(yt, rate_p), log_loss(yt, rate_p)), "rate_feature": rate_name,
            "unseen": unseen_shares(table, schema, b)}


# ---- the Criteo preset's generator (recscale.data.synthetic; multi-hot: recscale.data.multihot)

CROSS_DIM = 4  # the Criteo planted crosses' rank
CRITEO_L2_GRID = (8.0, 4.0, 2.0, 1.0)  # per-parameter L2 (x rows' mean loss), strongest first
CRITEO_ITERS = 150  # L-BFGS iterations per fit (each fit warm-starts from the previous)


def criteo_rows(cfg: SyntheticConfig, first: int = 0):
    """Rows ``first`` on of the raw file of ``cfg``, regenerated in memory block by block from
    the generator's own streams (each block has its own, so earlier blocks are skipped):
    (planted model, labels, true probabilities (float32, as the file's ``.oracle.npy``), log1p
    counts [rows, 13], and per used feature its bags: ids per row and the ids' category ranks,
    flat). Only the features the planted model reads are kept."""
    multi = cfg.multi_hot
    model = MultiHotPlantedModel(cfg) if multi else PlantedModel(cfg)
    used = sorted({int(j) for j in model.main_features} | {j for p in model.crosses for j in p}
                  | {model.dc_feature})
    n = cfg.num_rows - first
    labels = np.empty(n, np.int8)
    oracle = np.empty(n, np.float32)
    logc = np.empty((n, NUM_DENSE), np.float32)
    lengths = {j: [] for j in used}
    ranks = {j: [] for j in used}
    for b in range(first // BLOCK_ROWS, (cfg.num_rows + BLOCK_ROWS - 1) // BLOCK_ROWS):
        m = min(BLOCK_ROWS, cfg.num_rows - b * BLOCK_ROWS)
        rng = np.random.default_rng([cfg.seed, 2, b] if multi else [cfg.seed, 1, b])
        cols, logit = model.sample(rng, m)
        prob = _sigmoid(logit + model.bias)
        label = rng.random(m) < prob
        skip = max(first - b * BLOCK_ROWS, 0)  # rows of this block before ``first``
        start = b * BLOCK_ROWS + skip - first
        labels[start:start + m - skip] = label[skip:]
        oracle[start:start + m - skip] = prob[skip:]
        logc[start:start + m - skip] = np.log1p(np.maximum(cols["dense"][skip:], 0))
        for j in used:
            if multi:
                bag = cols["lengths"][:, j]
                lengths[j].append(bag[skip:].astype(np.int32))
                ranks[j].append(cols["ranks"][j][int(bag[:skip].sum()):].astype(np.int32))
            else:
                present = cols["sparse_present"][skip:, j]
                lengths[j].append(present.astype(np.int32))
                ranks[j].append(cols["ranks"][skip:, j][present].astype(np.int32))
    bags = {j: (np.concatenate(lengths[j]), np.concatenate(ranks[j])) for j in used}
    return model, labels, oracle, logc, bags


def criteo_design(model, bags: dict, n_rows: int) -> dict:
    """Per used feature a sparse matrix rows x categories: the feature's bag as the planted
    model pools it (one-hot: the id's indicator; multi-hot: each id's count / sqrt(pooling))."""
    X = {}
    for j, (lengths, ranks) in bags.items():
        scale = float(model.scale[j]) if hasattr(model, "scale") else 1.0
        indptr = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        x = sp.csr_matrix((np.full(len(ranks), scale), ranks, indptr),
                          shape=(n_rows, int(model.cards[j])))
        x.sum_duplicates()
        X[j] = x
    return X


class CriteoForm:
    """The Criteo planted model's form with free parameters: a per-category effect of each of the
    8 main features, per planted cross a rank-4 vector per category of each side (their dot), a
    per-category slope of the dense-by-categorical cross (times ``log1p(I2)`` minus the
    generator's centre of it), a weight per standardized ``log1p`` count, and a bias. L2 on the
    per-category parameters (main effects, cross vectors, slopes: one weight each)."""

    def __init__(self, model):
        self.main = [int(j) for j in model.main_features]
        self.crosses = [(int(f), int(g)) for f, g in model.crosses]
        self.c, self.d = int(model.dc_feature), int(model.dc_dense)
        self.center = float(model.dense_center[self.d])
        cards = model.cards
        shapes = [(f"m{j}", (int(cards[j]),)) for j in self.main]
        for i, (f, g) in enumerate(self.crosses):
            shapes += [(f"u{i}", (int(cards[f]), CROSS_DIM)), (f"v{i}", (int(cards[g]), CROSS_DIM))]
        shapes += [("s", (int(cards[self.c]),)), ("w", (NUM_DENSE,)), ("b", ())]
        self.slices, start = {}, 0
        for name, shape in shapes:
            size = int(np.prod(shape))
            self.slices[name] = (slice(start, start + size), shape)
            start += size
        self.size = start
        self.group = np.full(start, -1)  # 0 main, 1 cross, 2 slope, -1 not penalised
        for name, (sl, _) in self.slices.items():
            self.group[sl] = {"m": 0, "u": 1, "v": 1, "s": 2}.get(name[0], -1)

    def view(self, theta: np.ndarray, name: str) -> np.ndarray:
        sl, shape = self.slices[name]
        return theta[sl].reshape(shape)

    def seen_mask(self, seen: dict) -> np.ndarray:
        """1 on the parameters of categories the train rows hold (and the dense ones), else 0."""
        mask = np.ones(self.size)
        for j in self.main:
            self.view(mask, f"m{j}")[...] *= seen[j]
        for i, (f, g) in enumerate(self.crosses):
            self.view(mask, f"u{i}")[...] *= seen[f][:, None]
            self.view(mask, f"v{i}")[...] *= seen[g][:, None]
        self.view(mask, "s")[...] *= seen[self.c]
        return mask

    def init(self, mask: np.ndarray) -> np.ndarray:
        theta = np.zeros(self.size)
        cross = self.group == 1
        theta[cross] = 0.05 * np.random.default_rng(0).standard_normal(int(cross.sum()))
        return theta * mask

    def logit(self, theta, X, dense, dc, parts: dict | None = None) -> np.ndarray:
        out = dense @ self.view(theta, "w") + self.view(theta, "b")
        for j in self.main:
            out = out + X[j] @ self.view(theta, f"m{j}")
        for i, (f, g) in enumerate(self.crosses):
            pu, pv = X[f] @ self.view(theta, f"u{i}"), X[g] @ self.view(theta, f"v{i}")
            if parts is not None:
                parts[i] = (pu, pv)
            out = out + (pu * pv).sum(1)
        return out + (X[self.c] @ self.view(theta, "s")) * dc

    def loss_grad(self, theta, X, dense, dc, y, l2: np.ndarray, mask: np.ndarray):
        parts: dict = {}
        z = self.logit(theta, X, dense, dc, parts)
        n = len(y)
        loss = np.mean(np.logaddexp(0, z) - y * z) + (l2 * theta ** 2).sum() / n
        r = (1.0 / (1.0 + np.exp(-z)) - y) / n
        g = 2 * l2 / n * theta
        self.view(g, "w")[...] += dense.T @ r
        g[self.slices["b"][0]] += r.sum()
        for j in self.main:
            self.view(g, f"m{j}")[...] += X[j].T @ r
        for i, (f, gg) in enumerate(self.crosses):
            pu, pv = parts[i]
            self.view(g, f"u{i}")[...] += X[f].T @ (r[:, None] * pv)
            self.view(g, f"v{i}")[...] += X[gg].T @ (r[:, None] * pu)
        self.view(g, "s")[...] += X[self.c].T @ (r * dc)
        return loss, g * mask


def true_logit(model, X, logc, dc, seen: dict | None) -> np.ndarray:
    """The planted logit from the generator's own parameters; with ``seen``, every per-category
    parameter of a category outside ``seen`` set to 0 (the unseen-ids bound)."""
    keep = (lambda j: seen[j]) if seen is not None else (lambda j: 1.0)
    z = ((logc - model.dense_center) * model.dense_w).sum(1) + model.bias
    for j in model.main_features:
        z = z + X[int(j)] @ (model.main_effects[j] * keep(int(j)))
    for f, g in model.crosses:
        u = model.cross_u[(f, g)] * np.reshape(keep(f), (-1, 1))
        v = model.cross_v[(f, g)] * np.reshape(keep(g), (-1, 1))
        z = z + ((X[f] @ u) * (X[g] @ v)).sum(1)
    return z + (X[model.dc_feature] @ (model.dc_slope * keep(model.dc_feature))) * dc


def criteo_bound(env: str, params: dict, rows: int | None, max_train: int | None,
                 save_validation: Path | None = None) -> dict:
    """The bound of an env on the Criteo preset's generator (module docstring)."""
    data = dict(params["data"])
    if rows:
        data["synthetic"] = {**data.get("synthetic", {}), "num_rows": rows}
    cfg = parse(DataConfig, data, "data").synthetic
    t0 = time.time()
    b = split_bounds(cfg.num_rows, params["preprocess"].get("splits", [0.8, 0.1, 0.1]))
    train_n = int(b[0]) if not max_train else min(int(b[0]), max_train)
    first = int(b[0]) - train_n  # a subsample of the train split keeps its latest rows
    model, y8, oracle, logc, bags = criteo_rows(cfg, first)
    b = b - first
    y = y8.astype(np.float64)
    n = len(y)
    raw = ROOT / data["raw_dir"] / ("day_00.parquet" if cfg.multi_hot else "day_00.tsv")
    check = "no raw file to compare"
    meta = raw.with_name(raw.name + ".meta.json")
    if meta.exists() and json.loads(meta.read_text()).get("fingerprint") == cfg.fingerprint():
        same = np.array_equal(np.load(raw.with_name(raw.name + ".oracle.npy"))[first:], oracle)
        check = f"oracle equal to {raw.name}.oracle.npy: {same}"
        if not same:
            raise RuntimeError(f"regenerated rows differ from {raw}: {check}")
    print(f"  {env}: {n} rows regenerated in {time.time() - t0:.0f} s ({check})")
    X = criteo_design(model, bags, n)
    del bags
    dc_all = logc[:, model.dc_dense].astype(np.float64) - model.dense_center[model.dc_dense]
    mu, sd = logc[:b[0]].mean(0), logc[:b[0]].std(0) + 1e-9
    spans = {"train": (0, int(b[0])), "val": (int(b[0]), int(b[1])),
             "test": (int(b[1]), n)}
    part = {s: ({j: x[lo:hi] for j, x in X.items()},
                (logc[lo:hi].astype(np.float64) - mu) / sd, dc_all[lo:hi], y[lo:hi])
            for s, (lo, hi) in spans.items()}
    seen = {j: (np.asarray(x.getnnz(axis=0)) > 0).astype(np.float64)
            for j, x in part["train"][0].items()}
    form = CriteoForm(model)
    mask = form.seen_mask(seen)
    t1 = time.time()
    best, theta = None, form.init(mask)

    def run(l2s: tuple[float, float, float], theta0: np.ndarray):
        l2 = np.where(form.group >= 0, np.take(np.asarray(l2s), np.maximum(form.group, 0)), 0.0)
        res = minimize(form.loss_grad, theta0, jac=True, method="L-BFGS-B",
                       args=(*part["train"][0:3], part["train"][3], l2, mask),
                       options={"maxiter": CRITEO_ITERS, "maxcor": 20})
        val = log_loss(part["val"][3], _sigmoid(form.logit(res.x, *part["val"][:3])))
        print(f"  {env}: l2 main/cross/slope {l2s}: validation log loss {val:.5f} "
              f"({res.nit} iterations, {time.time() - t1:.0f} s)")
        return val, res.x

    for v in CRITEO_L2_GRID:  # one L2 for all, strongest first, until validation worsens
        val, theta = run((v, v, v), theta)
        if best is not None and val >= best[0]:
            break
        best = (val, (v, v, v), theta)
    v = best[1][0]
    for cross in (2 * v, v / 2):  # then the crosses' own L2, beside the best shared one
        val, theta = run((v, cross, v), best[2])
        if val < best[0]:
            best = (val, (v, cross, v), theta)
    if save_validation is not None:  # quality_residuals.py --predictions takes them apart
        lo, hi = spans["val"]
        np.savez(save_validation, rows=np.arange(lo, hi) + first, labels=part["val"][3],
                 probs=_sigmoid(form.logit(best[2], *part["val"][:3])))
        print(f"  {env}: the fit's validation probabilities written to {save_validation}")
    Xt, _, dct, yt = part["test"]
    lo = spans["test"][0]
    p_fit = _sigmoid(form.logit(best[2], *part["test"][:3]))
    p_true = _sigmoid(true_logit(model, Xt, logc[lo:].astype(np.float64), dct, None))
    p_seen = _sigmoid(true_logit(model, Xt, logc[lo:].astype(np.float64), dct, seen))
    drift = float(np.abs(p_true - oracle[lo:]).max())
    unseen = {f"C{j + 1}": float(np.mean((Xt[j] @ (1 - seen[j]))[np.diff(Xt[j].indptr) > 0] > 0))
              for j in sorted(X)}
    return {"env": env, "rows": cfg.num_rows, "train_rows": train_n, "test_rows": len(yt),
            "l2": best[1], "fit_s": time.time() - t1, "check": check, "drift": drift,
            "oracle": (auc_score(yt, oracle[lo:]), log_loss(yt, oracle[lo:])),
            "bound": (auc_score(yt, p_fit), log_loss(yt, p_fit)),
            "unseen_zeroed": (auc_score(yt, p_seen), log_loss(yt, p_seen)), "unseen": unseen}


def print_criteo(results: list[dict]) -> None:
    print("\n| env | test AUC: oracle | refit bound | true params, unseen ids 0 | log loss: "
          "oracle | refit bound | true params, unseen ids 0 | train rows | test rows |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['env']} | {r['oracle'][0]:.4f} | {r['bound'][0]:.4f} | "
              f"{r['unseen_zeroed'][0]:.4f} | {r['oracle'][1]:.4f} | {r['bound'][1]:.4f} | "
              f"{r['unseen_zeroed'][1]:.4f} | {r['train_rows']} | {r['test_rows']} |")
    for r in results:
        shares = ", ".join(f"{k} {v:.1%}" for k, v in r["unseen"].items())
        print(f"{r['env']}: test rows with an id unseen in train (of rows holding the feature): "
              f"{shares}; l2 (main, cross, slope) {r['l2']}, fits {r['fit_s']:.0f} s; "
              f"{r['check']}; true params vs oracle max |dp| {r['drift']:.1e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", action="append", help="conf env(s) with planted data (repeatable)")
    ap.add_argument("--rows", type=int, default=None,
                    help="rows to generate instead of the env's (written under a temp dir)")
    ap.add_argument("--out", default=None,
                    help="write the raw files under OUT/<env> instead of the env's raw_dir")
    ap.add_argument("--max-train", type=int, default=None,
                    help="Criteo preset envs: fit on at most this many train rows (the latest)")
    ap.add_argument("--save-validation", default=None, metavar="NPZ",
                    help="write the fit's validation rows and probabilities (one env; for "
                         "benchmarks/quality_residuals.py [--env ENV] --predictions)")
    args = ap.parse_args()
    out = Path(args.out) if args.out else \
        Path(tempfile.mkdtemp(prefix="quality_bound_")) if args.rows else None
    results, criteo = [], []
    for env in args.env or ["arriving", "clicklog"]:
        params = env_params(env)
        save = Path(args.save_validation) if args.save_validation else None
        if params.get("features", "criteo") == "criteo":
            criteo.append(criteo_bound(env, params, args.rows, args.max_train, save))
        else:
            results.append(bound(env, args.rows, out, save))
    if results:
        print_table(results)
    if criteo:
        print_criteo(criteo)


def print_table(results: list[dict]) -> None:
    print("\n| env | rows | test AUC: oracle | refit bound | best rate | log loss: oracle | "
          "refit bound | best rate | bound gap (AUC) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['env']} | {r['rows']} | {r['oracle'][0]:.4f} | {r['bound'][0]:.4f} | "
              f"{r['rate'][0]:.4f} ({r['rate_feature']}) | {r['oracle'][1]:.4f} | "
              f"{r['bound'][1]:.4f} | {r['rate'][1]:.4f} | {r['oracle'][0] - r['bound'][0]:.4f} |")
    for r in results:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in r["unseen"].items())
        print(f"{r['env']}: test rows with an id unseen in train: {shares}; l2 {r['l2']}, "
              f"fits {r['fit_s']:.0f} s")


if __name__ == "__main__":
    main()
