"""benchmarks/quality_residuals.py: the planted logit's parts it regenerates add up to the
generator's own probabilities, and its bucket slopes read a known shrinkage back."""

import sys
from pathlib import Path

import numpy as np

from recscale.data.synthetic import BLOCK_ROWS, PlantedModel, SyntheticConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import quality_residuals as qr  # noqa: E402


def test_the_parts_add_up_to_the_generators_probabilities_on_drawn_rows():
    cfg = SyntheticConfig(num_rows=BLOCK_ROWS + 5000, seed=3, cardinality_scale=0.001)
    pm = PlantedModel(cfg)
    rows = np.sort(np.random.default_rng(0).choice(cfg.num_rows, 3000, replace=False))
    P = qr.planted_parts(pm, rows)
    logit = P["dense"] + P["main"] + P["cross"] + P["dc"] + pm.bias
    truth = np.concatenate([pm.block(b, min(BLOCK_ROWS, cfg.num_rows - b * BLOCK_ROWS))[1]
                            for b in range(2)])[rows]
    np.testing.assert_allclose(1 / (1 + np.exp(-logit)), truth, rtol=0, atol=1e-12)
    assert P["main"].std() > 0.3 and P["cross"].std() > 0.3  # the parts are not empty
    # what is left after dense, main and cross is the dense x id slope, term by term
    logc = np.concatenate([pm.sample_dense(np.random.default_rng([cfg.seed, 1, b]),
                                           min(BLOCK_ROWS, cfg.num_rows - b * BLOCK_ROWS))[2]
                           for b in range(2)])[rows]
    c = pm.dc_feature
    want = np.where(P["present"][:, c], pm.dc_slope[P["ranks"][:, c]]
                    * (logc[:, pm.dc_dense] - pm.dense_center[pm.dc_dense]), 0.0)
    np.testing.assert_allclose(P["dc"], want, rtol=0, atol=1e-9)


def test_a_model_carrying_part_of_each_effect_reads_as_that_slope_per_bucket():
    rng = np.random.default_rng(1)
    n = 60_000
    effect = rng.normal(0, 0.6, n)
    counts = rng.choice([5, 50, 5000], n)
    carried = np.where(counts == 5, 0.2, np.where(counts == 50, 0.6, 0.95))
    resid = (carried - 1) * effect + rng.normal(0, 0.05, n)
    cells = qr.bucket_slopes(resid, effect, counts, np.ones(n, bool))
    slopes = [float(c.split()[0]) for c in cells if c.strip() != "-"]
    assert slopes == [-0.8, -0.4, -0.05]


def test_a_schema_envs_parts_add_up_to_its_files_probabilities(tmp_path, seed):
    """Every id type, a weighted and a mean-pooled bag, missing values, a table shared by two
    features and crosses of a bag with an id: the ids mapped back to the generator's ranks and
    the parts recomputed from the file give its ``.oracle.npy``."""
    import pyarrow.parquet as pq

    from recscale.config import parse
    from recscale.data.schema import parse_features
    from recscale.data.synthetic_table import SchemaPlantedModel, TableSynthConfig, generate_table

    schema = parse_features({
        "label": "y",
        "dense": [{"name": "price", "transforms": ["log1p"]},
                  {"name": "band", "column": "price", "transforms": [{"bucketize": [3.0]}]}],
        "sparse": [{"name": "user", "id_type": "string"},
                   {"name": "item", "ids": "vocab"},
                   {"name": "site", "id_type": "hex"},
                   {"name": "tags", "kind": "multi_hot", "max_len": 6, "pooling": "mean"},
                   {"name": "topics", "kind": "multi_hot", "max_len": 8, "weights": "topic_w"},
                   {"name": "seen", "kind": "multi_hot", "table": "item", "ids": "vocab",
                    "max_len": 9}],
        "tables": [{"name": "user", "rows": 400}, {"name": "tags", "rows": 64, "dim": 8}]})
    cfg = parse(TableSynthConfig, {"num_rows": 5000, "seed": seed, "crosses": 0,
                                   "cross_pairs": [["user", "item"], ["tags", "site"]],
                                   "features": {"user": {"cardinality": 90, "missing": 0.1},
                                                "item": {"cardinality": 40},
                                                "tags": {"cardinality": 30, "pooling": 2.5},
                                                "topics": {"cardinality": 20, "pooling": 3.0},
                                                "seen": {"cardinality": 40, "pooling": 4.0}}},
                "data.generator")
    rep = generate_table(schema, cfg, tmp_path / "t.parquet")
    pm = SchemaPlantedModel(schema, cfg)
    P = qr.table_parts(pm, pq.read_table(rep.path))
    logit = sum(v for k, v in P.items() if not k.startswith("rank:")) + pm.bias
    # exact but for the file's dense values, rounded to 4 decimals (a bound on what that moves)
    np.testing.assert_allclose(1 / (1 + np.exp(-logit)), np.load(rep.oracle_path), rtol=0,
                               atol=qr.oracle_tolerance(pm))
    assert {k for k in P if k.startswith("cross:")} == {"cross:userxitem", "cross:tagsxsite"}
    # none left empty; the dense part's size is the draw of two small weights, so only not constant
    assert all(P[k].std() > 0.05 for k in P if not k.startswith(("rank:", "dense")))
    assert P["dense"].std() > 1e-3
    assert 0.05 < (P["rank:user"] == -1).mean() < 0.15 and (P["rank:item"] == -1).mean() < 0.05
