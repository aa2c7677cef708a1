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


# --- what a step costs beyond the planner's bandwidth terms ---------------------------------------
def test_the_update_bytes_follow_the_distinct_ids_and_one_is_the_old_model():
    from recscale.sharding.cost import TW, CostModel

    topo = Topology.preset("cpu-local")
    cm = CostModel(topo, 512, plan_sharding(_tables(2), topo, 512).options)
    N, L, d = 50_000.0, 3.0, 64.0
    base = cm.shards(TW, N, L, 1, N, d, 1, 1, 0.0)
    assert float(cm.shards(TW, N, L, 1, N, d, 1, 1, 0.0, 1.0).compute) == float(base.compute)
    lookups = 512 * 2 * L
    opt = cm.opt_row + cm.opt_elem * d
    for u in (0.1, 0.5):
        got = cm.shards(TW, N, L, 1, N, d, 1, 1, 0.0, u)
        # a row read per id; a row and its optimizer state read and written per distinct id
        want = (lookups * (d * 4 + u * (2 * d * 4 + 2 * opt)) / topo.ddr_bw
                + 2 * 512 * 2 * d * 4 / topo.ddr_bw)
        assert float(got.compute) == pytest.approx(want, rel=1e-12)
        assert float(got.comms) == float(base.comms)  # the wire carries every id either way


def test_each_distinct_row_the_update_writes_costs_the_tiers_row_seconds():
    """``<tier>_row_s``: seconds per distinct row of the fused update, on top of the bytes, in the
    planner's shard costs and so in the prediction. A table of repeated ids costs its distinct
    fraction of that; behind a cache, hits cost the compute tier's and misses the slow tier's."""
    topo = Topology.preset("cpu-local", world_size=1)
    one = [TableSpec("t", 40_000, 32, 3.0, distinct_fraction=0.25)]
    plan = plan_sharding(one, topo, 512)
    base = predict_step(plan, None).parts["embedding"][0]
    with_rows = dataclasses.replace(topo, ddr_row_s=4e-7)
    got = predict_step(plan, None, topology=with_rows).parts["embedding"][0]
    ids = 512 * 3.0  # the batch's ids of the table, a quarter of them distinct rows
    assert got - base == pytest.approx(ids * 0.25 * 4e-7, rel=1e-9)
    # the planner's shard cost holds it: it balances the seconds the prediction charges
    mine = plan_sharding(one, with_rows, 512).tables[0].shards[0].compute_cost
    assert mine - plan.tables[0].shards[0].compute_cost == pytest.approx(ids * 0.25 * 4e-7,
                                                                         rel=1e-9)
    # the same table on the SSD behind a cache of half its rows: the hit rate splits the rows
    ssd = dataclasses.replace(with_rows, ssd_bytes=1e12, ssd_bw=1e9, ddr_bytes=4e6,
                              ssd_row_s=1e-6)
    spilled = plan_sharding(one, ssd, 512, cache_fraction=0.5)
    s = spilled.tables[0].shards[0]
    assert s.tier == "ssd" and s.cache_fraction == 0.5
    from recscale.sharding.cost import CostModel

    h = float(CostModel(ssd, 512, spilled.options).hit_rate(0.5))
    a = predict_step(spilled, None).parts["embedding"][0]
    b = predict_step(spilled, None, topology=dataclasses.replace(ssd, ssd_row_s=0.0,
                                                                 ddr_row_s=0.0)).parts
    assert a - b["embedding"][0] == pytest.approx(ids * 0.25 * (h * 4e-7 + (1 - h) * 1e-6),
                                                  rel=1e-9)


def test_a_replica_is_costed_as_the_runtime_runs_it_on_the_global_batch():
    """The runtime looks a data-parallel table up for the global batch on every replica (ids
    gathered before, output gradients exchanged after), not locally + an all-reduce."""
    from recscale.sharding.cost import TW, CostModel

    topo = Topology.preset("cpu-local")
    t = TableSpec("small", 500, 32, 2.0, constraints={"sharding_types": ["data_parallel"]},
                  distinct_fraction=0.5)
    plan = plan_sharding([t], topo, 256)
    assert plan.tables[0].sharding_type == "data_parallel"
    p = predict_step(plan, None)
    cm = CostModel(topo, 256, plan.options)
    whole = float(cm.shards(TW, 500, 2.0, 1, 500, 32, 1, 1, 0.0, 0.5).compute)
    vec = 256 * 2.0  # the global batch's pooled vectors
    assert p.parts["embedding"] == pytest.approx((whole, whole), rel=1e-12)
    assert p.parts["input"] == pytest.approx(((vec * 2 * 8 + vec * 4) * cm.a2a,) * 2, rel=1e-12)
    assert p.parts["output_grad"] == pytest.approx((vec * 32 * 4 * cm.a2a,) * 2, rel=1e-12)


def test_the_output_assembly_is_counted_once_per_step():
    topo = dataclasses.replace(Topology.preset("cpu-local"), assemble_s=1e-9)
    tables = _tables(4, 32) + [TableSpec("tiny", 50, 32, 1.0,
                                         constraints={"sharding_types": ["data_parallel"]})]
    plan = plan_sharding(tables, topo, 512)
    width = 5 * 32
    off = predict_step(plan, None, topology=dataclasses.replace(topo, assemble_s=0.0))
    on = predict_step(plan, None, topology=topo)
    # the flat exchange's pieces and the replicas' rows: placed together, once per rank
    assert {t.sharding_type for t in plan.tables} >= {"data_parallel", "table_wise"}
    for a, b in zip(off.compute, on.compute):
        assert b - a == pytest.approx(512 * width * 1e-9, rel=1e-9)
    one = plan_sharding(_tables(4, 32), Topology.preset("cpu-local", world_size=1), 512)
    one_topo = dataclasses.replace(one.topology, assemble_s=1e-9)
    # one process, one fused module: nothing to assemble
    assert predict_step(one, None, topology=one_topo) == predict_step(one, None)


def test_a_rank_whose_shards_span_tiers_also_places_its_own_lookups():
    topo = dataclasses.replace(Topology.preset("cpu-local"), assemble_s=1e-9)
    plan = plan_sharding(_tables(4, 32), topo, 512)
    tw = [tp for tp in plan.tables if tp.sharding_type == "table_wise"]
    on0 = [tp for tp in tw if tp.shards[0].rank == 0]
    assert len(on0) >= 2
    # one of rank 0's tables moves to the SSD-backed cache: rank 0 now looks up in two tiers
    moved = on0[0]
    tables = [dataclasses.replace(tp, shards=tuple(dataclasses.replace(s, tier="ssd")
                                                   for s in tp.shards)) if tp is moved else tp
              for tp in plan.tables]
    spilled = dataclasses.replace(plan, tables=tuple(tables))
    off = predict_step(spilled, None, topology=dataclasses.replace(topo, assemble_s=0.0))
    on = predict_step(spilled, None, topology=topo)
    width = 4 * 32
    cols0 = sum(len(tp.feature_names) * s.col_length for tp in plan.tables
                if tp.sharding_type != "data_parallel" for s in tp.shards if s.rank == 0)
    # every rank places the collection's output once; rank 0 also its own lookups (the global
    # batch of 2 ranks x its columns)
    assert on.compute[0] - off.compute[0] == pytest.approx(512 * width * 1e-9 + 1024 * cols0 * 1e-9,
                                                           rel=1e-6)
    assert on.compute[1] - off.compute[1] == pytest.approx(512 * width * 1e-9, rel=1e-6)


def test_the_interaction_is_costed_per_element_where_calibrated():
    from recscale.config import parse
    from recscale.model import ModelConfig, dense_spec

    dot = dense_spec(ModelConfig(embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(4, 1)), 3, 13)
    f = 4  # 3 tables + the bottom MLP's output
    assert dot.interaction_flops_per_sample == 2 * f * f * 8
    assert dot.interaction_per_sample == f * f * 8
    top_in = 8 + f * (f - 1) // 2
    mlp = 2 * (13 * 16 + 16 * 8) + 2 * (top_in * 4 + 4 * 1)
    assert dot.flops_per_sample == mlp + 2 * f * f * 8
    dcn = dense_spec(parse(ModelConfig, {"embedding_dim": 8, "bottom_mlp": [16, 8],
                                         "top_mlp": [4, 1], "interaction": "dcn",
                                         "dcn": {"num_layers": 2, "low_rank": 5}}, "model"), 3, 13)
    n = 8 + 3 * 8
    assert dcn.flops_per_sample == 2 * (13 * 16 + 16 * 8) + 2 * (n * 4 + 4) + 2 * 4 * n * 5
    assert dcn.interaction_per_sample == n + 2 * n
    topo = Topology.preset("cpu-local")
    assert dot.seconds(100, topo, 1e9) == pytest.approx(3 * 100 * dot.flops_per_sample / 1e9)
    cal = dataclasses.replace(topo, interaction_s=1e-8)
    assert dot.seconds(100, cal, 1e9) == pytest.approx(
        3 * 100 * mlp / 1e9 + 100 * f * f * 8 * 1e-8)


def test_a_links_burst_takes_each_phases_first_bytes_across_hosts_off_its_time():
    """Two hosts x 1 rank on a slow link: a burst larger than every phase's bytes leaves only
    the collectives' latency; a smaller one takes exactly its own seconds off each phase that
    sends more than it (input, output, its gradient, DDP's all-reduce)."""
    topo = dataclasses.replace(Topology.preset("cpu-local", world_size=2, local_world_size=1),
                               inter_node_bw=1e8, inter_node_lat_s=1e-4)
    plan = plan_sharding(_tables(dim=32), topo, 512)
    base = predict_step(plan, DENSE, pipelined=False)
    phases = ("input", "output", "output_grad")
    assert all(min(base.parts[k]) > 0 for k in phases)
    huge = dataclasses.replace(topo, inter_node_burst_bytes=1e12)
    free = predict_step(plan, DENSE, pipelined=False, topology=huge)
    for k in phases:
        assert free.parts[k] == pytest.approx((0.0, 0.0), abs=1e-12)
    burst = 1e4  # 0.1 ms at the link's rate, below every phase's bytes here
    some = predict_step(plan, DENSE, pipelined=False,
                        topology=dataclasses.replace(topo, inter_node_burst_bytes=burst))
    for k in phases:
        for a, b in zip(base.parts[k], some.parts[k]):
            assert a - b == pytest.approx(burst / 1e8, rel=1e-9)
    for a, b in zip(base.parts["dense"], some.parts["dense"]):
        assert a - b == pytest.approx(burst / 1e8, rel=1e-9)
    # one host: no link, nothing changes
    one = plan_sharding(_tables(dim=32), Topology.preset("cpu-local"), 512)
    assert predict_step(one, DENSE, topology=dataclasses.replace(
        one.topology, inter_node_burst_bytes=1e12)) == predict_step(one, DENSE)


def test_a_rank_that_prefetches_for_a_slow_tier_waits_for_the_next_batchs_ids():
    """Pipelined, the ids' all-to-all (its bytes and its latency) runs while the batch computes,
    except on a rank holding a shard behind a slow tier's cache: it names the next batch's ids to
    the cache as soon as they are sent, so it waits for them; fbgemm's managed cache (DDR on a
    GPU) does not prefetch."""
    lat = 1e-4

    def hidden(plan, tier):
        """Per rank: (seconds of communication the pipeline hides, what it could hide: the
        ids' all-to-all, at most the rank's compute), one of rank 0's tables on ``tier``."""
        moved = next(tp for tp in plan.tables
                     if tp.sharding_type == "table_wise" and tp.shards[0].rank == 0)
        plan = dataclasses.replace(plan, tables=tuple(
            dataclasses.replace(tp, shards=tuple(dataclasses.replace(s, tier=tier)
                                                 for s in tp.shards)) if tp is moved else tp
            for tp in plan.tables))
        piped = predict_step(plan, None)
        plain = predict_step(plan, None, pipelined=False)
        inp = piped.parts["input"]
        return ([a - b for a, b in zip(plain.parts["exposed"], piped.parts["exposed"])],
                [min(i + lat, c) for i, c in zip(inp, piped.compute)])

    cpu = plan_sharding(_tables(4, 32), dataclasses.replace(
        Topology.preset("cpu-local"), intra_node_lat_s=lat), 512)
    got, could = hidden(cpu, "ddr")  # the compute tier on a CPU
    assert got == pytest.approx(could, rel=1e-9) and min(got) > lat
    got, could = hidden(cpu, "ssd")
    assert got[0] == 0 and got[1] == pytest.approx(could[1], rel=1e-9)
    gpu = plan_sharding(_tables(4, 32), dataclasses.replace(
        Topology.preset("dgx-h100", world_size=2, local_world_size=2), intra_node_lat_s=lat), 512)
    got, could = hidden(gpu, "ddr")
    assert got == pytest.approx(could, rel=1e-9) and min(got) > 0
    got, could = hidden(gpu, "ssd")
    assert got[0] == 0 and got[1] == pytest.approx(could[1], rel=1e-9)
