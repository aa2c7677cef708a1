"""The Kedro sharding node builds table specs from the preprocessed data and plans them."""

import pytest

from recscale.config import ConfigError
from recscale.pipelines.common import parse_dlrm_config
from recscale.pipelines.sharding.nodes import plan_tables
from recscale.sharding import table_specs_from_manifest as table_specs


def test_table_specs_come_from_the_data(parquet_dataset):
    specs = table_specs(parquet_dataset, 16)
    assert [s.num_embeddings for s in specs] == parquet_dataset["table_sizes"]
    assert specs[21].pooling_factor == pytest.approx(parquet_dataset["pooling_factors"][21])
    assert specs[0].feature_names == ("C1",)


def test_plan_node_plans_for_the_training_world_size(parquet_dataset):
    cfg = parse_dlrm_config({}, "criteo", {}, {"topology": "cpu-local"}, {}, {"embedding_dim": 16},
                            {"launch": {"world_size": 2}, "batch_size_per_rank": 256,
                             "embedding_optimizer": {"name": "exact_sgd"}}, {})
    plan, report, image, metrics = plan_tables(parquet_dataset, cfg)
    assert plan["topology"]["world_size"] == 2 and len(plan["tables"]) == 26
    assert "Sharding plan: 26 tables on cpu-local (2 ranks" in report
    assert "optimizer exact_sgd" in report
    assert image.size[0] > 100
    # the metrics are the plan's: each rank's cost is what its shards cost (and the replicas'
    # share), and max / mean is over those
    costs = [r["cost"] for r in plan["ranks"]]
    on_rank = [sum(s["cost"] for t in plan["tables"] for s in t["shards"] if s["rank"] == r)
               for r in range(2)]
    assert all(c >= o * (1 - 1e-9) for c, o in zip(costs, on_rank)) and max(on_rank) > 0
    assert metrics["max_cost_ms"]["value"] == pytest.approx(1e3 * max(costs), rel=1e-12)
    assert metrics["mean_cost_ms"]["value"] == pytest.approx(1e3 * sum(costs) / 2, rel=1e-12)
    assert metrics["max_over_mean"]["value"] == pytest.approx(max(costs) * 2 / sum(costs),
                                                               rel=1e-12)
    with pytest.raises(ConfigError, match="unknown key sharding.topolgy"):
        parse_dlrm_config({}, "criteo", {}, {"topolgy": "zionex"}, {}, {"embedding_dim": 16},
                          {"batch_size_per_rank": 256}, {})
