"""The step-time prediction (dense part, overlap, re-costing on another topology) and the lower
bound on any plan's slowest rank."""

import dataclasses

import pytest

from recscale.sharding import TableSpec, Topology, plan_sharding
from recscale.sharding.bounds import plan_lower_bound
from recscale.sharding.step_time import DenseSpec, predict_step

DENSE = DenseSpec.mlps(13, [64, 16], 16 + 27 * 26 // 2, [64, 1])


def _tables(n=8, dim=64):
    return [TableSpec(f"t{i}", 20_000 * (i + 1), dim, 1.0 + i) for i in range(n)]


def test_the_prediction_adds_the_dense_part_and_hides_what_the_pipeline_overlaps():
    plan = plan_sharding(_tables(), Topology.preset("cpu-local"), 512)
    bare = predict_step(plan, None)
    full = predict_step(plan, DENSE)
    # the dense arch is compute on every rank: 3 x forward FLOPs at the assumed CPU rate
    dense_s = 3 * 512 * DENSE.flops_per_sample / 2e10
    dense_s += 2 * (2 - 1) / 2 * DENSE.params * 4 / plan.topology.intra_node_bw  # DDP's ring
    for a, b in zip(bare.compute, full.compute):
        assert b - a == pytest.approx(dense_s, rel=1e-9)
    plain = predict_step(plan, DENSE, pipelined=False)
    assert plain.compute == full.compute and plain.step >= full.step
    parts = full.parts
    exposed = [i + o + g for i, o, g in zip(parts["input"], parts["output"], parts["output_grad"])]
    assert plain.step == pytest.approx(max(c + e for c, e in zip(plain.compute, exposed)))
    # every rank's step is the slowest rank's: compute + communication adds up to it
    for c, m in zip(full.compute, full.comm):
        assert c + m == pytest.approx(full.step)


def test_one_rank_has_no_communication_and_recosting_on_the_own_topology_changes_nothing():
    one = plan_sharding(_tables(), Topology.preset("cpu-local", world_size=1), 512)
    p = predict_step(one, DENSE)
    assert p.comm == (0.0,) and p.step == pytest.approx(p.compute[0])
    two = plan_sharding(_tables(), Topology.preset("cpu-local"), 512)
    assert predict_step(two, DENSE, topology=two.topology) == predict_step(two, DENSE)
    faster = dataclasses.replace(two.topology, ddr_bw=2 * two.topology.ddr_bw)
    assert predict_step(two, DENSE, topology=faster).step < predict_step(two, DENSE).step
    with pytest.raises(ValueError, match="topology.world_size=1"):
        predict_step(two, DENSE, topology=one.topology)


@pytest.mark.parametrize("topo, kw", [
    (Topology.preset("zionex", world_size=16), {}),
    # HBM holds a tenth of the tables: the rest spill to DDR
    (dataclasses.replace(Topology.preset("zionex", world_size=8), hbm_bytes=1e8), {}),
    (Topology.preset("cpu-local").with_ram_budget(3e7, 1e10), {}),  # every table on SSD
])
def test_the_lower_bound_is_below_every_plans_slowest_rank(topo, kw):
    tables = _tables(40, 128)
    for strategy in ("balanced", "greedy", "round_robin"):
        plan = plan_sharding(tables, topo, 512, strategy=strategy, **kw)
        lb = plan_lower_bound(plan)
        assert lb.value == max(lb.total_over_ranks, lb.largest_piece)
        assert lb.value <= plan.max_cost * (1 + 1e-9), strategy
    assert "lower bound on any plan's max" in plan.report()


def test_the_lower_bound_is_reached_by_equal_whole_tables_one_per_rank():
    tables = [TableSpec(f"t{i}", 1000, 16, 1.0, constraints={"sharding_types": ["table_wise"]})
              for i in range(2)]
    plan = plan_sharding(tables, Topology.preset("cpu-local"), 256)
    lb = plan_lower_bound(plan)
    assert plan.max_cost == pytest.approx(lb.value)
