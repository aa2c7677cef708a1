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

    nice -n 5 python benchmarks/quality_bound.py --env arriving --env clicklog
    nice -n 5 python benchmarks/quality_bound.py --env arriving --rows 100000   # quicker, tmp dir
    nice -n 5 python benchmarks/quality_bound.py --out /tmp/qb     # not the envs' raw_dir
"""

from __future__ import annotations

import argparse
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
from recscale.data.processed import split_bounds
from recscale.data.schema import FeatureSchema, parse_features
from recscale.data.source import DataConfig
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


def bound(env: str, rows: int | None, out_dir: Path | None) -> dict:
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
            best = (val, l2, predict(form, theta, *part["test"][:2]))
    yt = part["test"][2]
    rate_name, rate_p = best_rate(table, schema, y, b)
    return {"env": env, "rows": table.num_rows, "test_rows": len(yt), "l2": best[1],
            "fit_s": time.time() - t0,
            "oracle": (auc_score(yt, oracle[b[1]:]), log_loss(yt, oracle[b[1]:])),
            "bound": (auc_score(yt, best[2]), log_loss(yt, best[2])),
            "rate": (auc_score(yt, rate_p), log_loss(yt, rate_p)), "rate_feature": rate_name,
            "unseen": unseen_shares(table, schema, b)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", action="append", help="conf env(s) with planted data (repeatable)")
    ap.add_argument("--rows", type=int, default=None,
                    help="rows to generate instead of the env's (written under a temp dir)")
    ap.add_argument("--out", default=None,
                    help="write the raw files under OUT/<env> instead of the env's raw_dir")
    args = ap.parse_args()
    out = Path(args.out) if args.out else \
        Path(tempfile.mkdtemp(prefix="quality_bound_")) if args.rows else None
    results = [bound(env, args.rows, out) for env in args.env or ["arriving", "clicklog"]]
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
