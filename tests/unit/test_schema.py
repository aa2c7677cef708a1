"""The feature schema: parsing and its errors (each names the key), the Criteo preset, dense
transforms against numpy, the fitted schema in the manifest (and a manifest from before it), and
what the model builds from it: tables of their own dims, the dot interaction's one dim."""

import numpy as np
import pytest

from recscale.config import ConfigError, parse
from recscale.data.schema import (
    DenseFeature,
    EmbeddingTable,
    FeatureSchema,
    FittedSchema,
    SparseFeature,
    criteo_schema,
    parse_features,
)
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig, recipe_for

MIXED = {"label": "clicked",
         "dense": [{"name": "price", "transforms": [{"clip": [0, 500]}, "log1p"]},
                   {"name": "age", "missing": -1.0, "transforms": []}],
         "sparse": [{"name": "user", "table": "users"}, {"name": "item"},
                    {"name": "genres", "kind": "multi_hot"}],
         "tables": [{"name": "users", "dim": 8}, {"name": "item", "dim": 16, "rows": 500}]}


def test_a_schema_parses_with_its_defaults_and_the_preset_is_criteos():
    s = parse(FeatureSchema, MIXED, "features")
    assert [f.name for f in s.dense] == ["price", "age"] and s.dense[0].source == "price"
    assert [f.table_name for f in s.sparse] == ["users", "item", "genres"]
    assert s.table_of("genres") == EmbeddingTable("genres") and s.table_of("item").rows == 500
    c = parse_features("criteo")
    assert c == criteo_schema() and len(c.dense) == 13 and len(c.sparse) == 26
    assert c.sparse[0].id_type == "hex" and c.dense[0].transforms == ({"clip": [0, None]}, "log1p")


@pytest.mark.parametrize("change, match", [
    ({"dense": [{"name": "x", "transforms": ["sqrt"]}]},
     r"features.dense\[0\].transforms\[0\]='sqrt' is not allowed: expected one of 'log1p', 'clip'"),
    ({"dense": [{"name": "x", "transforms": [{"clip": [5, 1]}]}]},
     r"features.dense\[0\].transforms\[0\]=\{'clip': \[5, 1\]\} is not allowed: expected "
     r"\{clip: \[low, high\]\} with low <= high"),
    ({"sparse": [{"name": "user", "kind": "list"}]},
     r"features.sparse\[0\].kind='list' is not allowed"),
    ({"dense": [{"name": "user"}]},
     r"features.sparse\[0\].name='user' is not allowed: expected a name no other feature has "
     r"\(features.dense\[0\] has it\)"),
    ({"tables": [{"name": "users", "dim": 6}]},
     r"features.tables\[0\].dim=6 is not allowed: expected null or a positive multiple of 4"),
    ({"tables": [{"name": "nobody"}]},
     r"features.tables\[0\].name='nobody' is not allowed: expected the table of a sparse "
     r"feature"),
    ({"sparse": [{"name": "a", "table": "t"}, {"name": "b", "table": "t", "ids": "vocab"}],
      "tables": []},
     r"features.sparse\[1\].ids='vocab' is not allowed: expected 'hash', as features.sparse\[0\] "
     r"\(a\), which shares table 't' with it"),
    ({"sparse": [{"name": "a", "table": "t", "id_type": "string"}, {"name": "b", "table": "t"}],
      "tables": []},
     r"features.sparse\[1\].id_type='int' is not allowed: expected 'string'"),
    ({"sparse": [{"name": "a", "pooling": "max"}], "tables": []},
     r"features.sparse\[0\].pooling='max' is not allowed: expected one of 'sum', 'mean'"),
    ({"sparse": []}, r"features.sparse=\[\] is not allowed: expected at least one sparse"),
])
def test_a_bad_schema_is_refused_naming_the_key(change, match):
    with pytest.raises(ConfigError, match=match):
        parse(FeatureSchema, {**MIXED, **change}, "features")
    with pytest.raises(ConfigError, match=r"features='movielens' is not allowed: expected one "
                                          r"of 'criteo'"):
        parse_features("movielens")


def test_dense_transforms_are_numpys_in_order_and_missing_rows_get_their_value(seed):
    rng = np.random.default_rng(seed)
    raw = rng.integers(-50, 1000, 400)
    present = rng.random(400) < 0.8
    f = DenseFeature("x", transforms=({"clip": [0, 500]}, "log1p"), missing=-2.5)
    want = np.log1p(np.minimum(np.maximum(raw.astype(np.float64), 0.0), 500.0)).astype(np.float32)
    want[~present] = -2.5
    got = f.apply(raw, present)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    # the Criteo preset is what preprocessing always did: negatives to 0, log1p, missing 0
    c = criteo_schema().dense[0].apply(raw, present)
    old = np.log1p(np.maximum(raw, 0).astype(np.float64)).astype(np.float32)
    old[~present] = 0.0
    assert np.array_equal(c, old)
    assert np.array_equal(DenseFeature("y", transforms=()).apply(raw, present)[present],
                          raw[present].astype(np.float32))


def test_the_fitted_schema_round_trips_through_the_manifest_and_old_manifests_are_criteo():
    s = parse(FeatureSchema, MIXED, "features")
    fitted = FittedSchema.fit(s, [1000, 40, 25])
    assert fitted.table_names == ("users", "item", "genres")
    assert fitted.table_rows == (1000, 500, 25)  # the item table's own rows win
    manifest = {"schema": fitted.to_dict(), "table_sizes": list(fitted.table_rows)}
    back = FittedSchema.of(manifest)
    assert back == fitted and back.table_dims(32) == (8, 16, 32)
    assert back.feature_tables() == (0, 1, 2) and back.num_dense == 2
    assert back.sparse_names == ("user", "item", "genres")
    old = FittedSchema.of({"table_sizes": [5, 7, 9], "sparse_features": ["a", "b", "c"]})
    assert old.sparse_names == ("a", "b", "c") and old.num_dense == 13
    assert old.table_rows == (5, 7, 9) and old.table_dims(16) == (16, 16, 16)
    with pytest.raises(ValueError, match="2 table sizes for the 3 tables users, item, genres"):
        FittedSchema.fit(s, [1, 2])


def test_tables_of_their_own_dims_build_a_model_and_dot_needs_one_dim(seed):
    import torch

    from recscale.data.batch import SparseFeatures

    s = FeatureSchema(dense=(DenseFeature("price"),), sparse=(
        SparseFeature("user", table="users"), SparseFeature("item"), SparseFeature("ctx")),
        tables=(EmbeddingTable("users", dim=8), EmbeddingTable("item", dim=16)))
    manifest = {"schema": FittedSchema.fit(s, [30, 40, 50]).to_dict(), "table_sizes": [30, 40, 50]}
    cat = ModelConfig(embedding_dim=4, bottom_mlp=(8, 4), top_mlp=(8, 1), interaction="cat")
    recipe = recipe_for(manifest, cat, TrainConfig())
    assert recipe.table_dims == (8, 16, 4) and recipe.num_dense == 1
    model = recipe.build()
    g = torch.Generator().manual_seed(seed)
    lengths = torch.ones(3, 6, dtype=torch.int64)
    values = torch.cat([torch.randint(0, n, (6,), generator=g) for n in (30, 40, 50)])
    pooled = model.embeddings(SparseFeatures(("user", "item", "ctx"), values, lengths))
    assert pooled.shape == (6, 8 + 16 + 4)
    assert model(torch.randn(6, 1, generator=g), SparseFeatures(("user", "item", "ctx"), values,
                                                                 lengths)).shape == (6,)
    assert model.dense.top[0].in_features == 4 + 28
    dot = ModelConfig(embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(8, 1))
    with pytest.raises(ConfigError, match=r"model.interaction='dot' is not allowed with tables of "
                                          r"different dims: table item has dim 16, the bottom "
                                          r"MLP's output 8"):
        recipe_for(manifest, dot, TrainConfig())


def test_a_schema_change_is_named_by_its_first_feature():
    from recscale.data.schema import schema_change

    base = parse(FeatureSchema, MIXED, "features")
    assert schema_change(base, base) is None
    grown = parse(FeatureSchema, {**MIXED, "tables": [
        {**t, "rows": (t.get("rows") or 0) + 7} for t in MIXED.get("tables", [])]}, "features")
    assert schema_change(base, grown) is None  # rows may grow (a vocabulary)
    fewer = parse(FeatureSchema, {**MIXED, "dense": MIXED["dense"][:1]}, "features")
    assert schema_change(base, fewer) == "dense feature age of the model is not in the data's schema"
    relabel = parse(FeatureSchema, {**MIXED, "label": "click"}, "features")
    assert schema_change(base, relabel) == "the label column is 'click', the model's is 'clicked'"
    redim = parse(FeatureSchema, {**MIXED, "tables": [{"name": "users", "dim": 4},
                                                      MIXED["tables"][1]]}, "features")
    assert schema_change(base, redim) == "table users has dim 4, the model's 8"
    averaged = parse(FeatureSchema, {**MIXED, "sparse": [
        *MIXED["sparse"][:2], {"name": "genres", "kind": "multi_hot", "pooling": "mean"}]},
        "features")
    assert schema_change(base, averaged) == "sparse feature genres changed: pooling 'sum' -> 'mean'"
