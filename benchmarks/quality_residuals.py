"""Where the model misses the planted click model: the trained DLRM's logit minus the true logit
of the synthetic Criteo generator (conf/base) or of the schema generator (`--env clicklog`, any
env whose `data.source` is `synthetic` with a `features` schema), taken apart by the planted
model's parts, on the validation split.

    kedro run --pipelines=dlrm                       # once: the data
    nice -n 10 python benchmarks/quality_residuals.py
    kedro run --pipelines=dlrm --env=clicklog        # a schema env: its data, then
    python benchmarks/quality_residuals.py --env clicklog
    nice -n 10 python benchmarks/quality_residuals.py '{"train": {"epochs": 3}}'   # a setting
    OMP_NUM_THREADS=1 python benchmarks/quality_bound.py --env base --save-validation bound.npz
    python benchmarks/quality_residuals.py --predictions bound.npz   # the bound, the same way

Printed (one training run through ``train_dlrm``, about a minute on 2 cores):
- the model's logit regressed on the true parts (dense counts, main effects of single ids,
  low-rank crosses of id pairs, the dense x id slope): a coefficient below 1 is a part the model
  under-weights;
- for each main-effect feature, the slope of the residual on the true effect among ids of one
  train-count bucket: -0.5 means the model carries half of those ids' effects. The shrinkage an
  L2 fit of the true form would choose is about n p (1 - p) s^2 / (1 + n p (1 - p) s^2) (n the
  id's train rows, p the click rate, s the effects' spread), -0.2 at 50 rows here;
- the same for the crosses, by the rarer id of the pair;
- for each cross, the variance of the mean residual over its (id, id) cells beyond what either
  id alone explains: errors in the cross's shape, not its scale.

A schema env (``--env``) is read the same way from its raw file: each row's ids mapped back to
the generator's ranks, each part (a feature's main effect, pooled as planted; each cross; the
dense effects) recomputed, their sum checked against the file's ``.oracle.npy``; main effects and
crosses of categorical features by their ids' train rows.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recscale.config import parse
from recscale.data.preprocess import load_manifest
from recscale.data.synthetic import BLOCK_ROWS, PlantedModel
from recscale.data.synthetic_table import SchemaPlantedModel, cross_effect
from recscale.evaluate import auc_score, log_loss
from recscale.runconfig import DLRMConfig
from recscale.scoring import score_split
from recscale.train import train_dlrm
from tune_dcnv2 import ROOT, env_params  # an env's params with JSON overrides (a sibling script)

EDGES = (0, 10, 30, 100, 300, 1000, np.inf)


def planted_parts(pm: PlantedModel, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The planted logit's parts for global row numbers ``rows`` (regenerated block by block
    from the generator's seeds, as it drew them)."""
    n = pm.cfg.num_rows
    out: dict[str, list] = {k: [] for k in ("dense", "main", "cross", "dc", "ranks", "present")}
    b0, b1 = int(rows.min()) // BLOCK_ROWS, int(rows.max()) // BLOCK_ROWS
    for b in range(b0, b1 + 1):
        nb = min(BLOCK_ROWS, n - b * BLOCK_ROWS)
        cols, logit = pm.sample(np.random.default_rng([pm.cfg.seed, 1, b]), nb)
        dense = pm.sample_dense(np.random.default_rng([pm.cfg.seed, 1, b]), nb)[3]
        ranks, present = cols["ranks"], cols["sparse_present"]
        main = sum(np.where(present[:, j], pm.main_effects[j][ranks[:, j]], 0.0)
                   for j in pm.main_features)
        cross = sum(np.where(present[:, f] & present[:, g], (
            pm.cross_u[(f, g)][ranks[:, f]] * pm.cross_v[(f, g)][ranks[:, g]]).sum(1), 0.0)
            for f, g in pm.crosses)
        for k, v in (("dense", dense), ("main", main), ("cross", cross),
                     ("dc", logit - dense - main - cross), ("ranks", ranks),
                     ("present", present)):
            out[k].append(v)
    at = rows - b0 * BLOCK_ROWS
    return {k: np.concatenate(v)[at] for k, v in out.items()}


def bucket_slopes(resid: np.ndarray, effect: np.ndarray, counts: np.ndarray,
                  mask: np.ndarray) -> list[str]:
    """Slope of the residual on the true effect within each train-count bucket (share of rows)."""
    cells = []
    for lo, hi in zip(EDGES[:-1], EDGES[1:]):
        m = mask & (counts >= lo) & (counts < hi)
        if m.sum() < 500:
            cells.append("      -     ")
            continue
        e = effect[m] - effect[m].mean()
        slope = float((e * (resid[m] - resid[m].mean())).sum() / (e * e).sum())
        cells.append(f"{slope:+.2f} ({m.mean() * 100:2.0f}%)")
    return cells


def cell_variance(resid: np.ndarray, key: np.ndarray, min_rows: int = 100) -> float:
    """Variance of the mean residual over the cells of ``key`` with at least ``min_rows`` rows,
    less the sampling noise of those means."""
    _, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
    means = np.bincount(inv, weights=resid) / cnt
    keep = cnt[inv] >= min_rows
    if not keep.any():
        return 0.0
    return float(np.var(means[inv][keep]) - np.mean((resid.var() / cnt[inv])[keep]))


def id_ranks(pm: SchemaPlantedModel, f, values: pa.Array) -> np.ndarray:
    """The generator's ranks of the ids ``values`` (written by ``SchemaPlantedModel._ids``) of
    sparse feature ``f``; -1 for an id the generator never writes."""
    card = len(pm.effects[f.name])
    if f.id_type == "string":
        tail = pc.utf8_slice_codeunits(values, len(f.name) + 1, 1 << 30)
        ranks = pc.cast(tail, pa.int64()).to_numpy(zero_copy_only=False)
        return np.where((ranks >= 0) & (ranks < card), ranks, -1)
    codes = pm.codes[f.name].astype(np.int64)
    if f.id_type == "hex":
        codes = codes & 0xFFFFFFFF
        keys = np.array([int(v, 16) for v in values.to_pylist()], dtype=np.int64)
    else:
        keys = values.to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.argsort(codes, kind="stable")  # a shared table's repeated codes: the first rank
    at = np.clip(np.searchsorted(codes[order], keys), 0, card - 1)
    return np.where(codes[order][at] == keys, order[at], -1)


def table_parts(pm: SchemaPlantedModel, table: pa.Table) -> dict[str, np.ndarray]:
    """The planted logit's parts on the rows of the generator's ``table``: ``main:<feature>``
    (its ids' effects pooled as planted), ``cross:<a>x<b>``, ``dense``; and ``rank:<feature>``
    for the categorical features (-1 where missing). Their sum plus ``pm.bias`` is the oracle's
    logit."""
    n = table.num_rows
    out: dict[str, np.ndarray] = {}
    summed = {}
    for f in pm.sparse:
        col = table.column(f.source).combine_chunks()
        if f.kind == "multi_hot":
            lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy().astype(np.int64)
            flat = pc.list_flatten(col)
            wt = pc.list_flatten(table.column(f.weights).combine_chunks()).to_numpy(
                zero_copy_only=False) if f.weights else np.ones(len(flat))
        else:
            lengths = (~col.is_null().to_numpy(zero_copy_only=False)).astype(np.int64)
            flat, wt = col.drop_null(), np.ones(int(lengths.sum()))
        ranks = id_ranks(pm, f, flat)
        if (ranks < 0).any():
            raise SystemExit(f"{f.name}: {int((ranks < 0).sum())} ids the generator does not "
                             "write: another generator or config?")
        rows = np.repeat(np.arange(n), lengths)
        summed[f.name] = (rows, ranks, pm.pooling_scale(f, lengths), wt)
        out[f"main:{f.name}"] = pm.bag_effect(f, summed[f.name], n)
        if f.kind == "categorical":
            r = np.full(n, -1)
            r[rows] = ranks
            out[f"rank:{f.name}"] = r
    for a, b, u, v in pm.crosses:
        out[f"cross:{a}x{b}"] = cross_effect(summed[a], summed[b], u, v, n)
    dense = np.zeros(n)
    for f in pm.schema.dense:
        x = table.column(f.source).to_numpy(zero_copy_only=False).astype(np.float64)
        present = ~np.isnan(x)
        dense += pm.dense_effect(f, np.where(present, x, 0.0), present)
    out["dense"] = dense
    return out


def oracle_tolerance(pm: SchemaPlantedModel) -> float:
    """How far probabilities recomputed from the file may sit from the oracle's: the file holds
    dense values rounded to 4 decimals, which moves log1p by at most 5e-5, each dense effect by
    its weight times that, and a probability by a quarter of the logit's change."""
    return 0.25 * 5e-5 * sum(abs(w) for w in pm.dense_w.values()) + 1e-9


def print_table_env(pm: SchemaPlantedModel, P: dict, resid: np.ndarray, model: np.ndarray,
                    train_counts: dict[str, np.ndarray]) -> None:
    """The schema env's report: the model logit on each part, then slopes by id train rows."""
    names = [k for k in P if not k.startswith("rank:")]
    X = np.stack([P[k] for k in names] + [np.ones(len(model))], 1)
    coef = np.linalg.lstsq(X, model, rcond=None)[0]
    print("model logit on the true parts (1: carried whole): " + ", ".join(
        f"{k} {c:.3f} (sd {P[k].std():.2f})" for k, c in zip(names, coef)))
    print(f"  after the parts' scales are refit: sd {np.std(model - X @ coef):.3f}")
    head = " ".join(f"{f'{lo:g}-{hi:g}':>12s}" for lo, hi in zip(EDGES[:-1], EDGES[1:]))
    print(f"\nmain effects: residual slope on the true effect, by the id's train rows\n"
          f"{'':16s}{head}")
    for name, cnt in train_counts.items():
        r = P[f"rank:{name}"]
        print(f"  {name:14s}" + " ".join(bucket_slopes(resid, P[f"main:{name}"],
                                                      cnt[np.maximum(r, 0)], r >= 0)))
    crosses = [(a, b) for a, b, _, _ in pm.crosses if a in train_counts and b in train_counts]
    if not crosses:
        return
    print(f"\ncrosses: the same, by the rarer id of the pair\n{'':16s}{head}")
    for a, b in crosses:
        ra, rb = P[f"rank:{a}"], P[f"rank:{b}"]
        both = (ra >= 0) & (rb >= 0)
        counts = np.minimum(train_counts[a][np.maximum(ra, 0)], train_counts[b][np.maximum(rb, 0)])
        print(f"  {a + 'x' + b:14s}" + " ".join(bucket_slopes(resid, P[f"cross:{a}x{b}"],
                                                             counts, both)))
    print("\ncrosses: residual variance over (id, id) cells of 100+ rows, beyond either id alone")
    for a, b in crosses:
        ra, rb = P[f"rank:{a}"], P[f"rank:{b}"]
        pair = cell_variance(resid, ra * (len(pm.effects[b]) + 1) + rb)
        one = max(cell_variance(resid, ra), cell_variance(resid, rb))
        print(f"  {a}x{b}: {pair:.4f} (the larger single id {one:.4f})")


def table_env(cfg: DLRMConfig, manifest: dict, rows: np.ndarray, probs: np.ndarray,
              labels: np.ndarray, what: str) -> None:
    """Take a schema env's predictions apart (the module docstring)."""
    gen = cfg.data.generator
    pm = SchemaPlantedModel(cfg.schema, gen)
    path = ROOT / cfg.data.raw_dir / "table_00.parquet"
    if not path.exists() or len(manifest.get("source_files", [])) != 1:
        raise SystemExit(f"{path} (the env's one generated file) is not there: kedro run first")
    raw = pq.read_table(path)
    P = table_parts(pm, raw.take(pa.array(rows)))
    true = sum(v for k, v in P.items() if not k.startswith("rank:")) + pm.bias
    oracle = np.load(str(path) + ".oracle.npy", mmap_mode="r")[rows]
    if not np.allclose(1 / (1 + np.exp(-true)), oracle, rtol=0, atol=oracle_tolerance(pm)):
        raise SystemExit(f"the regenerated parts do not give {path}.oracle.npy: another config?")
    p = np.clip(probs, 1e-7, 1 - 1e-7)
    model = np.log(p / (1 - p))
    resid = model - true
    print(f"{what}: {len(true)} rows, AUC {auc_score(labels, p):.4f}, log loss "
          f"{log_loss(labels, p):.4f} (oracle {auc_score(labels, oracle):.4f}); model logit - "
          f"true logit: sd {resid.std():.3f}")
    n_train = manifest["splits"]["train"]["rows"]
    if int(rows.min()) < n_train:
        raise SystemExit(f"{what}: its rows start at {int(rows.min())}, inside the first "
                         f"{n_train} (the train rows, when a file is split in row order)")
    counts = {}
    for f in pm.sparse:
        if f.kind != "categorical":
            continue
        col = raw.column(f.source).slice(0, n_train).combine_chunks().drop_null()
        counts[f.name] = np.bincount(id_ranks(pm, f, col), minlength=len(pm.effects[f.name]))
    print_table_env(pm, P, resid, model, counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="?", default="{}", help="JSON, merged into the params")
    ap.add_argument("--env", default="base", help="the conf env whose kedro run made the data")
    ap.add_argument("--split", default="validation")
    ap.add_argument("--predictions", default=None, metavar="NPZ",
                    help="take apart these probabilities (arrays rows, probs: e.g. "
                         "quality_bound.py --save-validation) instead of training")
    ap.add_argument("--save", default=None, metavar="NPZ",
                    help="write the trained model's rows and probabilities here")
    args = ap.parse_args()
    cfg = parse(DLRMConfig, env_params(args.env, json.loads(args.overrides)), "")
    schema_env = cfg.data.source == "synthetic" and not isinstance(cfg.features, str)
    if not schema_env and (cfg.data.source != "synthetic" or cfg.data.synthetic.multi_hot):
        raise SystemExit("quality_residuals.py reads the planted single-id Criteo generator "
                         f"(data.source: synthetic); this config has {cfg.data.source}")
    manifest = load_manifest(ROOT / cfg.preprocess.output_dir)
    if args.predictions:
        got = np.load(args.predictions)
        rows, probs, labels = got["rows"], got["probs"], got["labels"]
    else:
        out = train_dlrm(manifest, cfg.model, cfg.train)
        s = score_split(out.model.eval(), manifest, args.split, 16384)
        rows, probs, labels = s.rows, s.probs, s.labels
        if args.save:
            np.savez(args.save, rows=rows, probs=probs, labels=labels)
    if schema_env:
        return table_env(cfg, manifest, rows, probs, labels, args.predictions or args.split)
    pm = PlantedModel(cfg.data.synthetic)
    P = planted_parts(pm, rows)
    true = P["dense"] + P["main"] + P["cross"] + P["dc"] + pm.bias
    oracle = ROOT / cfg.data.raw_dir / "day_00.tsv.oracle.npy"
    if oracle.exists() and not np.allclose(1 / (1 + np.exp(-true)),
                                           np.load(oracle, mmap_mode="r")[rows], atol=1e-6):
        raise SystemExit(f"the regenerated parts do not give {oracle}: another generator?")
    p = np.clip(probs, 1e-7, 1 - 1e-7)
    model = np.log(p / (1 - p))
    X = np.stack([P["dense"], P["main"], P["cross"], P["dc"], np.ones_like(true)], 1)
    coef = np.linalg.lstsq(X, model, rcond=None)[0]
    resid = model - true
    print(f"{args.predictions or args.split}: {len(true)} rows, AUC {auc_score(labels, p):.4f}, "
          f"log loss {log_loss(labels, p):.4f} (oracle {auc_score(labels, 1 / (1 + np.exp(-true))):.4f}); "
          f"model logit - true logit: sd {resid.std():.3f}; after the parts' scales are refit: "
          f"sd {np.std(model - X @ coef):.3f}")
    print("model logit on the true parts: " + ", ".join(
        f"{k} {c:.3f} (part sd {P[k].std():.2f})"
        for k, c in zip(("dense", "main", "cross", "dc"), coef)))
    n_train = manifest["splits"]["train"]["rows"]
    ranks, present = P["ranks"], P["present"]
    expect = [n_train * np.diff(np.concatenate([[0.0], cdf])) for cdf in pm.cdfs]
    head = " ".join(f"{f'{lo:g}-{hi:g}':>12s}" for lo, hi in zip(EDGES[:-1], EDGES[1:]))
    print(f"\nmain effects: residual slope on the true effect, by the id's train rows\n"
          f"{'':10s}{head}")
    for j in pm.main_features:
        eff = np.where(present[:, j], pm.main_effects[j][ranks[:, j]], 0.0)
        cells = bucket_slopes(resid, eff, expect[j][ranks[:, j]], present[:, j])
        print(f"  C{j + 1:<7d}" + " ".join(cells))
    print(f"\ncrosses: the same, by the rarer id of the pair\n{'':10s}{head}")
    for f, g in pm.crosses:
        both = present[:, f] & present[:, g]
        eff = np.where(both, (pm.cross_u[(f, g)][ranks[:, f]]
                              * pm.cross_v[(f, g)][ranks[:, g]]).sum(1), 0.0)
        counts = np.minimum(expect[f][ranks[:, f]], expect[g][ranks[:, g]])
        print(f"  C{f + 1}xC{g + 1:<4d}" + " ".join(bucket_slopes(resid, eff, counts, both)))
    print("\ncrosses: residual variance over (id, id) cells of 100+ rows, beyond either id alone")
    for f, g in pm.crosses:
        pair = cell_variance(resid, ranks[:, f] * (int(pm.cards[g]) + 1) + ranks[:, g])
        one = max(cell_variance(resid, ranks[:, f]), cell_variance(resid, ranks[:, g]))
        print(f"  C{f + 1}xC{g + 1}: {pair:.4f} (the larger single id {one:.4f})")


if __name__ == "__main__":
    main()
