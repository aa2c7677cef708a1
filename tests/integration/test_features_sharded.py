"""A schema with a shared table, mean pooling and weighted ids through the whole sharded path:
generated, preprocessed, planned (one spec per table, with its features), trained on 2 gloo
ranks (one of them padding its last step with an empty, weighted batch) and scored."""

import dataclasses

import numpy as np
import pytest
import torch

from recscale.config import parse
from recscale.data.batch import SparseFeatures
from recscale.data.preprocess import preprocess_table
from recscale.data.processed import PreprocessConfig, load_manifest
from recscale.data.schema import FittedSchema, parse_features
from recscale.data.synthetic_table import TableSynthConfig, generate_table
from recscale.embedding import table_init
from recscale.embedding.features import FeatureBags
from recscale.model.dlrm import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.scoring import score_split
from recscale.sharding import Topology, plan_sharding, table_specs_from_manifest
from recscale.sharding.types import TableConstraints
from recscale.train.entry import train_dlrm

pytestmark = pytest.mark.dist

SCHEMA = {"label": "click", "dense": [{"name": "price"}],
          "sparse": [{"name": "item", "table": "items", "ids": "vocab"},
                     {"name": "history", "kind": "multi_hot", "table": "items", "ids": "vocab",
                      "max_len": 6, "truncate": "keep_last"},
                     {"name": "tags", "kind": "multi_hot", "pooling": "mean",
                      "weights": "tag_w", "max_len": 5, "truncate": "keep_first"}],
          "tables": [{"name": "items", "dim": 8}, {"name": "tags", "rows": 64, "dim": 4}]}


def test_shared_mean_and_weighted_features_train_sharded_on_two_ranks(tmp_path):
    schema = parse_features(SCHEMA)
    gen = parse(TableSynthConfig, {"num_rows": 3202, "seed": 3, "features": {
        "item": {"cardinality": 50}, "history": {"cardinality": 50, "pooling": 3.0},
        "tags": {"cardinality": 20, "pooling": 2.0}}}, "data.generator")
    generate_table(schema, gen, tmp_path / "raw.parquet")
    man = load_manifest(preprocess_table([tmp_path / "raw.parquet"], tmp_path / "out",
                                         PreprocessConfig(output_dir=str(tmp_path / "out")),
                                         schema).manifest_path)
    assert man["splits"]["train"]["rows"] == 2561  # ranks of 1281 and 1280 rows
    fitted = FittedSchema.of(man)
    specs = table_specs_from_manifest(man, fitted.table_dims(8), None, fitted.feature_tables(),
                                      fitted.table_names)
    assert [(s.name, s.feature_names) for s in specs] == [("t_items", ("item", "history")),
                                                          ("t_tags", ("tags",))]
    pools = man["pooling_factors"]
    assert specs[0].pooling_factor == pytest.approx(pools[0] + pools[1])
    # the shared table split by rows (its partial sums reduced before the mean), tags replicated
    specs = [dataclasses.replace(s, constraints=TableConstraints(sharding_types=(kind,)))
             for s, kind in zip(specs, ("row_wise", "data_parallel"))]
    plan = plan_sharding(specs, Topology.preset("cpu-local", world_size=2), 128)
    assert [t.sharding_type for t in plan.tables] == ["row_wise", "data_parallel"]
    model_cfg = parse(ModelConfig, {"embedding_dim": 8, "bottom_mlp": [8], "top_mlp": [8, 1],
                                    "interaction": "cat"}, "model")
    train_cfg = parse(TrainConfig, {"batch_size_per_rank": 128, "progress": "off",
                                    "launch": {"world_size": 2}}, "train")
    out = train_dlrm(man, model_cfg, train_cfg, plan=plan)
    assert out.result.steps == 11 and out.result.samples == 2561  # every row once
    assert np.isfinite(out.result.final_loss)
    emb = out.model.embeddings
    assert isinstance(emb, FeatureBags) and emb.dims == (8, 8, 4)
    # item and history look up one table: the same id pools to the same vector in both
    ids = torch.tensor([5, 17])
    sp = SparseFeatures(("item", "history", "tags"), torch.cat([ids, ids]),
                        torch.tensor([[1, 1], [1, 1], [0, 0]]))
    with torch.no_grad():
        pooled = emb(sp)
    assert torch.equal(pooled[:, :8], pooled[:, 8:16]) and bool(pooled[:, :8].abs().sum() > 0)
    assert not pooled[:, 16:].any()  # an empty tags bag averages to 0
    items, tags = (w.detach() for w in emb.split_weights())
    assert items.shape == (man["table_sizes"][0], 8) and tags.shape == (64, 4)
    assert not torch.equal(items, table_init(train_cfg.seed, 0, *items.shape))  # it trained
    s = score_split(out.model, man, "test", 256)
    assert len(s.probs) == man["splits"]["test"]["rows"] and np.isfinite(s.probs).all()
