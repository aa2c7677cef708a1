"""benchmarks/simulate_cluster.py's core on a small mix: 50 tables on 2 hosts x 4 ranks of the
zionex preset, fp16 weights, enough parameters to spill from HBM into DDR."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from recscale.sharding import Topology

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import simulate_cluster as sim  # noqa: E402

PARAMS = 200 * 10**9  # 400 GB in fp16: more than 8 x 40 GB HBM
TABLES = 50


@pytest.fixture(scope="module")
def result():
    tables = sim.table_mix(TABLES, PARAMS, seed=3)
    topo = Topology.preset("zionex", world_size=8, local_world_size=4)
    return tables, topo, sim.simulate(tables, topo, local_batch=256)


def test_mix_has_the_parameters_asked_for_and_is_seeded():
    tables = sim.table_mix(TABLES, PARAMS, seed=3)
    assert len(tables) == TABLES
    assert sum(t.num_params for t in tables) == PARAMS
    assert {t.embedding_dim for t in tables} <= set(sim.DIMS)
    assert all(1.0 <= t.pooling_factor <= 50.0 for t in tables)
    assert [t.to_dict() for t in sim.table_mix(TABLES, PARAMS, seed=3)] == \
        [t.to_dict() for t in tables]
    assert [t.num_embeddings for t in sim.table_mix(TABLES, PARAMS, seed=4)] != \
        [t.num_embeddings for t in tables]
    with pytest.raises(ValueError, match="multiple of 64"):
        sim.table_mix(TABLES, PARAMS + 1)


def test_every_table_placed_whole(result):
    tables, topo, res = result
    plan = res["plan"]
    assert res["parameters"] == PARAMS
    assert plan.options.weight_precision == "fp16"
    assert sorted(t.name for t in plan.tables) == sorted(t.name for t in tables)
    for tp in plan.tables:
        if tp.sharding_type == "data_parallel":
            assert sorted(s.rank for s in tp.shards) == list(range(topo.world_size))
            continue
        covered = sum(s.row_length * s.col_length for s in tp.shards)
        assert covered == tp.num_embeddings * tp.embedding_dim, tp.name
        assert all(0 <= s.rank < topo.world_size for s in tp.shards)


def test_memory_per_rank_within_each_tier(result):
    _, topo, res = result
    used = res["memory_max_per_rank"]
    for tier in ("hbm", "ddr", "ssd"):
        assert used[tier] <= topo.capacity(tier) * res["plan"].options.memory_fraction * (1 + 1e-9)
        assert res["capacity_per_rank"][tier] == topo.capacity(tier)
    assert used["ddr"] > 0  # the mix does not fit HBM alone: the tiers are exercised
    # fp16 weights + one fp32 AdaGrad state per row, summed over every shard in its tier
    plan = res["plan"]
    stored = sum(s.storage_bytes for tp in plan.tables for s in tp.shards)
    expected = sum((tp.embedding_dim * 2 + 4) * tp.num_embeddings * len(tp.shards)
                   if tp.sharding_type == "data_parallel" else
                   sum(s.row_length * (s.col_length * 2 + 4) for s in tp.shards)
                   for tp in plan.tables)
    assert stored == pytest.approx(expected, rel=1e-12)


def test_bytes_per_link_add_up_to_the_traffic_estimate(result):
    _, _, res = result
    links = res["link_bytes"]
    est = links["estimate"]
    for term in ("input", "output", "output_grad", "dp_input", "dp_output_grad"):
        assert links["intra"][term] + links["inter"][term] == pytest.approx(est[term], rel=1e-12)
        assert links["intra"][term] >= 0 and links["inter"][term] >= 0
    total = sum(links["intra"].values()) + sum(links["inter"].values())
    assert total == pytest.approx(est["total"], rel=1e-12)
    dense = res["dense_link_bytes"]
    assert res["bytes_intra"] + res["bytes_inter"] == pytest.approx(
        est["total"] + dense["intra"] + dense["inter"], rel=1e-12)
    # the hierarchical reduction on 2 hosts x 4: per rank 2 x 3/4 of the bytes inside the host
    # (reduce-scatter + all-gather), 2 x 1/2 of its quarter slice across hosts
    assert dense["inter"] / (dense["intra"] + dense["inter"]) == pytest.approx(0.25 / 1.75)


def test_recosted_ranks_match_the_plan_and_the_split_adds_up(result):
    _, _, res = result
    plan, rc = res["plan"], res["rank_costs"]
    np.testing.assert_allclose(rc["compute"], [r.compute_cost for r in plan.ranks], rtol=1e-9)
    np.testing.assert_allclose(rc["comms"], [r.comms_cost for r in plan.ranks], rtol=1e-9)
    np.testing.assert_allclose(rc["intra"] + rc["inter"] + rc["dp"], rc["comms"], rtol=1e-9)
    split = res["step_split_s"]
    assert sum(split.values()) == pytest.approx(res["step_s"], rel=1e-12)
    assert split["compute"] + split["intra_host_comm"] + split["inter_host_comm"] + \
        res["dp_tables_s"] == pytest.approx(plan.max_cost, rel=1e-9)
    assert res["samples_per_s"] == pytest.approx(256 * 8 / res["step_s"], rel=1e-12)


def test_quick_run_writes_markdown_and_json(tmp_path, capsys):
    assert sim.main(["--quick", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "simulate_cluster.md").read_text()
    assert "python benchmarks/simulate_cluster.py --quick" in md
    assert "| samples/s |" in md
    data = json.loads((tmp_path / "simulate_cluster.json").read_text())
    assert [d["preset"] for d in data] == ["zionex", "dgx-h100"]
    assert all(d["hosts"] == 2 and d["ranks_per_host"] == 8 for d in data)
