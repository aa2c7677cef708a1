"""Sharding planner: enumeration, cost model, shard geometry, capacities, determinism, round trip,
errors, accessors, report/chart, CLI, the ``sharding`` config block and plan-vs-run checks."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest

from recscale.comm import CommsConfig
from recscale.config import ConfigError, parse
from recscale.sharding import (
    SHARDING_TYPES,
    PlanMismatchError,
    PlannerError,
    PlannerOptions,
    ShardingConfig,
    ShardingPlan,
    TableSpec,
    Topology,
    format_report,
    plan_sharding,
    save_chart,
)
from recscale.sharding.context import PlanContext, option_costs
from recscale.sharding.cost import CostModel, column_splits, row_blocks
from recscale.sharding.option_grid import TableArrays, enumerate_options

HIER = ("table_row_wise", "table_column_wise")


def zionex(ws=16):
    return Topology.preset("zionex", world_size=ws)


def mix(n=40, seed=0):
    rng = np.random.default_rng(seed)
    rows = (1000 * (rng.pareto(1.2, n) + 1)).astype(int)
    dims = rng.choice([16, 32, 64, 128], n)
    pool = np.exp(rng.uniform(0, np.log(50), n))
    return [TableSpec(f"t{i:03d}", int(r), int(d), float(p))
            for i, (r, d, p) in enumerate(zip(rows, dims, pool))]


def forced(kind, rows=1_000_003, dim=128, pool=5.0):
    return TableSpec("forced", rows, dim, pool, constraints={"sharding_types": [kind]})


def small_tiers(ws=4):
    """HBM too small for the tables below, so they spill to DDR (and SSD)."""
    return Topology(world_size=ws, local_world_size=2, hbm_bytes=2e8, ddr_bytes=1e9,
                    ssd_bytes=1e10, hbm_bw=1e12, ddr_bw=2e10, ssd_bw=2e9,
                    intra_node_bw=1e11, inter_node_bw=1e10, name="tiny")


def check_geometry(tp, topo):
    """Row blocks cover every row once, column widths sum to the dim, host-bound stay in a host."""
    ranks = [s.rank for s in tp.shards]
    if tp.sharding_type == "data_parallel":
        assert sorted(ranks) == list(range(topo.world_size))
        assert all(s.row_length == tp.num_embeddings and s.col_length == tp.embedding_dim
                   for s in tp.shards)
        return
    assert len(set(ranks)) == len(ranks), "shards of one table share a rank"
    if tp.sharding_type in ("row_wise", "table_row_wise"):
        block = math.ceil(tp.num_embeddings / (topo.world_size if tp.sharding_type == "row_wise"
                                               else topo.local_world_size))
        assert tp.row_block_size == block
        end = 0  # the blocks tile the rows: each starts where the last ended, none empty
        for i, s in enumerate(tp.shards):
            assert s.row_offset == i * block and s.row_offset == end and s.row_length > 0
            assert s.col_offset == 0 and s.col_length == tp.embedding_dim
            end += s.row_length
        assert end == tp.num_embeddings
        assert all(s.row_length == block for s in tp.shards[:-1])
        assert 0 < tp.shards[-1].row_length <= block
    else:
        assert sum(s.col_length for s in tp.shards) == tp.embedding_dim
        assert [s.col_offset for s in tp.shards] == list(
            np.cumsum([0] + [s.col_length for s in tp.shards])[:-1])
        assert all(s.row_offset == 0 and s.row_length == tp.num_embeddings for s in tp.shards)
        if len(tp.shards) > 1:
            assert all(s.col_length % 4 == 0 and s.col_length >= 16 for s in tp.shards)
    if tp.sharding_type in HIER:
        assert len({topo.host_of(r) for r in ranks}) == 1


# --- enumeration and cost model ----------------------------------------------------------------------
def test_every_sharding_type_is_enumerated_and_costed():
    topo = zionex(16)
    tables = [TableSpec("a", 1_000_000, 128, 10.0), TableSpec("b", 100, 64, 1.0)]
    opts = PlannerOptions()
    arrays = TableArrays.build(tables)
    grid = enumerate_options(arrays, topo, opts)
    assert set(grid.kind.tolist()) == set(range(len(SHARDING_TYPES)))
    ctx = PlanContext.build(arrays, topo, 512, opts)
    oc = option_costs(ctx, np.zeros(2, dtype=int), np.zeros(2))
    for kind in range(len(SHARDING_TYPES)):
        cols = np.flatnonzero((grid.kind == kind) & grid.valid[0])
        assert cols.size, SHARDING_TYPES[kind]
        assert np.all(np.isfinite(oc.max[0, cols])) and np.all(oc.max[0, cols] > 0)
        assert np.all(oc.total[0, cols] >= oc.max[0, cols] * (1 - 1e-12))


@pytest.mark.parametrize("kind", SHARDING_TYPES)
def test_each_type_can_be_planned_with_valid_geometry(kind):
    topo = zionex(16)
    tables = [forced(kind)] + mix(10)
    plan = plan_sharding(tables, topo, 256)
    tp = plan.table("forced")
    assert tp.sharding_type == kind
    expected = {"data_parallel": 16, "table_wise": 1, "row_wise": 16, "table_row_wise": 8}
    if kind in expected:
        assert len(tp.shards) == expected[kind]
    assert all(s.cost > 0 and s.compute_cost > 0 for s in tp.shards)
    if kind != "data_parallel":
        assert all(s.comms_cost > 0 for s in tp.shards)
    for t in plan.tables:
        check_geometry(t, topo)


def test_row_and_column_split_helpers():
    assert row_blocks(10, 4) == [(0, 3), (3, 3), (6, 3), (9, 1)]
    assert row_blocks(10, 8) == [(0, 2), (2, 2), (4, 2), (6, 2), (8, 2)]  # empty blocks dropped
    assert sum(n for _, n in row_blocks(1_000_003, 128)) == 1_000_003
    assert column_splits(128, 3, 4) == [44, 44, 40]
    assert sum(column_splits(96, 5, 8)) == 96
    assert all(w % 8 == 0 for w in column_splits(96, 5, 8))


def test_geometry_on_a_mix_and_granularity():
    topo = zionex(32)
    plan = plan_sharding(mix(60), topo, 512, column_granularity=8, min_column_width=16)
    for t in plan.tables:
        if t.sharding_type in ("column_wise", "table_column_wise") and len(t.shards) > 1:
            assert all(s.col_length % 8 == 0 and s.col_length >= 16 for s in t.shards)
        check_geometry(t, topo)


def test_optimizer_state_and_weight_precision_set_bytes():
    topo = zionex(8)
    rows, dim = 1000, 64

    def storage(**kw):
        return float(CostModel(topo, 512, PlannerOptions(**kw)).storage_bytes(rows, dim))

    assert storage(optimizer="exact_sgd") == rows * dim * 4
    assert storage(optimizer="exact_rowwise_adagrad") == rows * dim * 4 + rows * 4
    assert storage(optimizer="exact_adagrad") == rows * dim * 8
    assert storage(optimizer="adam") == rows * dim * 12
    assert storage(optimizer="exact_sgd", weight_precision="fp16") == rows * dim * 2


def test_comm_precision_per_direction_enters_costs():
    topo = zionex(16)
    t = [TableSpec("a", 100_000, 128, 4.0)]
    a = TableArrays.build(t)

    def comms(kind, **kw):
        m = CostModel(topo, 512, PlannerOptions(**kw))
        return float(m.shards(kind, a.N, a.L, a.F, a.N, a.D, 16, 0, 0.0).comms[0])

    for kind in (1, 2, 3, 4, 5):  # every sharded type
        full = comms(kind)
        fwd = comms(kind, comms={"forward": "fp16"})
        both = comms(kind, comms=CommsConfig("fp16", "bf16", "fp32"))
        assert both < fwd < full
        assert comms(kind, comms="fp8") < both
    # a replica is costed as the runtime runs it: its output gradients travel in the backward
    # precision; the dense all-reduce's precision is the dense arch's (DDP), not the tables'
    assert comms(0, comms={"backward": "fp16"}) < comms(0)
    assert comms(0, comms={"dense_allreduce": "bf16"}) == comms(0)
    assert comms(1, comms={"dense_allreduce": "bf16"}) == comms(1)


def test_comms_config_accepts_the_later_issue_dict():
    plan = plan_sharding(mix(8), zionex(8), 128,
                         comms={"forward": "fp16", "backward": "bf16", "dense_allreduce": "bf16"})
    assert plan.options.comms == CommsConfig("fp16", "bf16", "bf16")
    assert "comms forward fp16 / backward bf16" in plan.report()


# --- memory tiers -------------------------------------------------------------------------------------
def test_no_tier_over_capacity_and_spill_uses_cache():
    topo = small_tiers()
    tables = [TableSpec(f"s{i}", 1_000_000, 64, float(1 + i)) for i in range(10)]
    plan = plan_sharding(tables, topo, 256)
    mf = plan.options.memory_fraction
    for r in plan.ranks:
        for tier in ("hbm", "ddr", "ssd"):
            assert r.memory(tier) <= topo.capacity(tier) * mf * (1 + 1e-9)
    tiers = {s.tier for t in plan.tables for s in t.shards}
    assert "ddr" in tiers
    spilled = [s for t in plan.tables for s in t.shards if s.tier != "hbm"]
    assert all(0 <= s.cache_fraction < 1 for s in spilled)
    # rank memory is the sum of its shards' bytes
    for r in plan.ranks:
        hbm = sum(s.compute_tier_bytes + (s.storage_bytes if s.tier == "hbm" else 0)
                  for _, s in plan.shards_for_rank(r.rank))
        assert hbm == pytest.approx(r.hbm_bytes)
    # here caching a share of every table beats keeping two tables whole in HBM
    assert plan.cache_fraction > 0 and all(s.cache_fraction > 0 for s in spilled)
    # without a cache, the hottest table (most lookups per byte) stays in HBM, the coldest spills
    plain = plan_sharding(tables, topo, 256, cache_fraction=0.0)
    assert plain.cache_fraction == 0.0
    assert plain.table("s9").tier == "hbm" and plain.table("s0").tier == "ddr"
    assert plain.table("s0").shards[0].cache_fraction == 0.0


def test_cpu_local_computes_in_ddr_and_pins_are_respected():
    topo = Topology.preset("cpu-local")
    assert (topo.world_size, topo.local_world_size, topo.hbm_bytes) == (2, 2, 0.0)
    assert topo.compute_tier == "ddr" and topo.tiers == ("ddr",)
    plan = plan_sharding(mix(12) + [forced("row_wise")], topo, 128)
    assert {s.tier for t in plan.tables for s in t.shards} == {"ddr"}
    assert all(r.hbm_bytes == 0 for r in plan.ranks)
    pinned = TableSpec("p", 10_000, 32, constraints={"tier": "ddr"})
    plan = plan_sharding([pinned] + mix(5), zionex(8), 128)
    assert plan.table("p").tier == "ddr"


def test_twelve_trillion_parameters_fit_zionex_128_in_fp16():
    rng = np.random.default_rng(0)
    n = 1000
    dims = rng.choice([64, 128, 256], n)
    w = rng.lognormal(0.0, 1.5, n)
    rows = np.maximum(1000, (w / (w * dims).sum() * 12e12).astype(np.int64))
    tables = [TableSpec(f"t{i}", int(r), int(d), 4.0) for i, (r, d) in enumerate(zip(rows, dims))]
    topo = zionex(128)
    no_ssd = Topology(**{**topo.to_dict(), "ssd_bytes": 0.0})
    with pytest.raises(PlannerError) as info:  # 48 TB of fp32 weights > 29 TB of HBM + DDR
        plan_sharding(tables, no_ssd, 512)
    assert "fp16" in str(info.value) and "lower tier (ssd)" in str(info.value)
    plan = plan_sharding(tables, topo, 512, weight_precision="fp16")
    assert sum(t.num_embeddings * t.embedding_dim for t in plan.tables) > 11.9e12
    for r in plan.ranks:
        for tier in ("hbm", "ddr", "ssd"):
            assert r.memory(tier) <= topo.capacity(tier) * 0.9 * (1 + 1e-9)
    assert plan.max_over_mean <= 1.05


# --- determinism and serialisation ----------------------------------------------------------------------
def test_same_input_same_plan():
    tables = mix(50)
    a = plan_sharding(tables, zionex(16), 512)
    b = plan_sharding(list(tables), zionex(16), 512)
    assert a == b
    da, db = a.to_dict(), b.to_dict()
    da["summary"].pop("planning_seconds")
    db["summary"].pop("planning_seconds")
    assert json.dumps(da) == json.dumps(db)


def test_round_trip_through_json(tmp_path):
    plan = plan_sharding(mix(30) + [forced("table_row_wise")], small_tiers(8), 512,
                         comms={"forward": "fp16"})
    again = ShardingPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    assert again.planning_seconds == plan.planning_seconds
    path = plan.save(tmp_path / "plan.json")
    assert ShardingPlan.load(path) == plan
    d = plan.to_dict()
    assert set(d["summary"]) >= {"max_cost", "mean_cost", "critical_path", "planning_seconds"}
    assert set(d["ranks"][0]) >= {"compute_cost", "comms_cost", "memory"}
    shard = d["tables"][0]["shards"][0]
    assert set(shard) >= {"rank", "row_offset", "row_length", "col_offset", "col_length", "tier",
                          "cache_fraction", "cost"}


# --- accessors, report, chart ----------------------------------------------------------------------------
def test_accessors_for_the_runtime():
    topo = zionex(16)
    plan = plan_sharding(mix(20), topo, 512)
    assert plan.world_size == 16 and plan.batch_size_per_rank == 512 and plan.local_world_size == 8
    types = plan.sharding_types()
    assert list(types) == [t.name for t in mix(20)]
    n = 0
    for r in range(16):
        for tp, s in plan.shards_for_rank(r):
            assert s.rank == r and s in tp.shards
            n += 1
    assert n == sum(len(t.shards) for t in plan.tables)
    costs = [r.cost for r in plan.ranks]
    assert plan.max_cost == max(costs) and plan.critical_rank == int(np.argmax(costs))
    assert plan.ranks[3].cost == pytest.approx(
        sum(s.cost for _, s in plan.shards_for_rank(3)))
    with pytest.raises(KeyError, match="nope"):
        plan.table("nope")
    with pytest.raises(ValueError, match="rank=16"):
        plan.shards_for_rank(16)


def test_report_and_chart(tmp_path):
    plan = plan_sharding(mix(20), small_tiers(8), 512)
    text = format_report(plan)
    assert text == plan.report()
    for needle in ("max/mean", "critical path", "sharding types", "hbm", "ddr", "t000"):
        assert needle in text
    path = save_chart(plan, tmp_path / "c" / "plan.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- balance and baselines ------------------------------------------------------------------------------
def test_balanced_beats_table_wise_baselines():
    tables = mix(120, seed=3)
    topo = zionex(32)
    ours = plan_sharding(tables, topo, 512)
    greedy = plan_sharding(tables, topo, 512, strategy="greedy")
    rr = plan_sharding(tables, topo, 512, strategy="round_robin")
    assert ours.max_cost <= greedy.max_cost * (1 + 1e-9)
    assert ours.max_cost < rr.max_cost
    assert ours.max_over_mean <= 1.05
    assert {t.sharding_type for t in greedy.tables} <= {"table_wise", "row_wise"}


def test_uniform_tables_are_split_to_balance():
    tables = [TableSpec(f"u{i}", 100_000, 128, 20.0) for i in range(20)]
    plan = plan_sharding(tables, zionex(8), 512)
    assert plan.max_over_mean <= 1.02
    greedy = plan_sharding(tables, zionex(8), 512, strategy="greedy")
    assert greedy.max_over_mean > 1.1  # 20 whole tables on 8 ranks: 3 vs 2.5
    assert plan.max_cost < greedy.max_cost


# --- errors ---------------------------------------------------------------------------------------------
def test_infeasible_input_names_table_bytes_capacity_and_fix():
    big = TableSpec("huge", 1_000_000_000, 128)
    with pytest.raises(PlannerError) as info:
        plan_sharding([big] + mix(3), Topology.preset("cpu-local"), 128)
    err = info.value
    msg = str(err)
    assert err.table == "huge" and "'huge'" in msg
    assert err.bytes_needed > 500e9 and "GB" in msg
    assert err.capacity is not None and err.capacity < 30e9
    assert "more ranks" in msg and "fp16" in msg and "lower tier" in msg
    pinned = TableSpec("p", 1000, 16, constraints={"tier": "hbm"})
    with pytest.raises(PlannerError, match="'p'.*hbm.*capacity 0"):
        plan_sharding([pinned], Topology.preset("cpu-local"), 128)


def test_shards_that_do_not_pack_name_the_table():
    # three whole tables of 60% of a rank each on two ranks: enough bytes in total, no packing
    topo = Topology.preset("cpu-local")
    rows = int(0.6 * 12e9 * 0.9 / (16 * 4 + 4))
    tables = [TableSpec(f"w{i}", rows, 16, constraints={"sharding_types": ["table_wise"]})
              for i in range(3)]
    with pytest.raises(PlannerError) as info:
        plan_sharding(tables, topo, 64)
    msg = str(info.value)
    assert info.value.table in {"w0", "w1", "w2"}
    assert "GB" in msg and "more ranks (> 2)" in msg and "a lower tier (ssd) on the topology" in msg
    # the whole mix's demand on the tier, so the user sees the pieces, not the bytes, are the
    # problem: the three tables' weights and state (90% of the usable bytes) and their buffers
    got = re.search(r"all shards need ([\d.]+) GB of the 21.60 GB usable in 'ddr' on 2 ranks "
                    r"\((\d+)%\)", msg)
    assert got, msg
    assert 3 * rows * 68 <= float(got[1]) * 1e9 <= 3 * rows * 68 * 1.02
    assert int(got[2]) == round(100 * float(got[1]) / 21.6)
    # allowed to split, the same tables fit
    plan = plan_sharding([TableSpec(t.name, t.num_embeddings, 16) for t in tables], topo, 64)
    assert all(r.ddr_bytes <= 12e9 * 0.9 for r in plan.ranks)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: TableSpec("x", 0, 16), r"num_embeddings=0 .*positive integer"),
        (lambda: TableSpec("x", 10, -4), r"embedding_dim=-4 .*positive integer"),
        (lambda: TableSpec("x", 10, 16, pooling_factor=0), r"pooling_factor=0"),
        (lambda: TableSpec("x", 10, 16, constraints={"sharding_types": ["diagonal"]}),
         r"sharding_types\[0\]='diagonal' .*'row_wise'"),
        (lambda: TableSpec("x", 10, 16, constraints={"tier": "tape"}), r"tier='tape' .*'ddr'"),
        (lambda: TableSpec("x", 10, 16, constraints={"colour": 1}), r"constraints.colour"),
        (lambda: Topology.preset("zionex", world_size=12), r"world_size=12 .*multiple of"),
        (lambda: Topology.preset("tpu-pod"), r"topology='tpu-pod' .*'zionex'"),
        (lambda: PlannerOptions(comms={"forward": "fp12"}), r"comms.forward='fp12' .*'bf16'"),
        (lambda: PlannerOptions(comms={"sideways": "fp16"}), r"comms.sideways"),
        (lambda: PlannerOptions(optimizer="lamb"), r"optimizer='lamb' .*'adam'"),
        (lambda: PlannerOptions(weight_precision="fp8"), r"weight_precision='fp8'"),
        (lambda: plan_sharding([TableSpec("a", 10, 4)], "zionex", 0), r"batch_size=0"),
        (lambda: plan_sharding([TableSpec("a", 10, 4)] * 2, "zionex", 8), r"'a' .*unique"),
        (lambda: plan_sharding([{"name": "a", "num_embeddings": 5}], "zionex", 8),
         r"embedding_dim"),
        (lambda: plan_sharding([TableSpec("a", 10, 4)], "zionex", 8, colour=1), r"colour"),
    ],
)
def test_bad_inputs_name_the_field(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_table_spec_defaults_and_dicts():
    t = TableSpec("clicks", 10, 16)
    assert t.feature_names == ("clicks",) and t.pooling_factor == 1.0 and t.constraints is None
    d = TableSpec.from_dict({"name": "a", "num_embeddings": 5, "embedding_dim": 8,
                             "feature_names": ["f1", "f2"],
                             "constraints": {"sharding_types": ["row_wise"]}})
    assert d.feature_names == ("f1", "f2") and d.constraints.sharding_types == ("row_wise",)
    assert TableSpec.from_dict(d.to_dict()) == d


def test_topology_presets():
    z = Topology.preset("zionex", world_size=128)
    assert (z.num_hosts, z.hbm_bytes, z.ddr_bytes * 8) == (16, 40e9, 1.5e12)
    assert z.inter_node_bw == 25e9 and z.compute_tier == "hbm"
    h = Topology.preset("dgx-h100")
    assert (h.world_size, h.hbm_bytes, h.inter_node_bw) == (8, 80e9, 50e9)
    assert Topology.preset("zionex", world_size=4).local_world_size == 4
    assert Topology.from_dict(z.to_dict()) == z


# --- the sharding parameter block ----------------------------------------------------------------------
def test_sharding_config_parses_the_parameter_block():
    cfg = parse(ShardingConfig, {"topology": "zionex", "world_size": 16,
                                 "options": {"weight_precision": "fp16", "strategy": "greedy",
                                             "split_fractions": [0.5]}},
                "sharding")
    assert isinstance(cfg.options, PlannerOptions)
    assert cfg.options == PlannerOptions(weight_precision="fp16", strategy="greedy",
                                         split_fractions=(0.5,))
    assert cfg.topology_for(4) == Topology.preset("zionex", world_size=16)
    assert ShardingConfig().options == PlannerOptions()
    assert parse(ShardingConfig, {"options": None}, "sharding").options == PlannerOptions()
    # null world_size: the run's; the run fills the optimizer and the wire precisions
    assert parse(ShardingConfig, {}, "sharding").topology_for(2).world_size == 2
    run = replace(cfg.options, optimizer="exact_sgd", comms=CommsConfig("fp16", "fp16", "fp32"))
    assert run.optimizer == "exact_sgd" and run.comms.forward == "fp16"
    assert run.weight_precision == "fp16"
    again = PlannerOptions.coerce(cfg.options, optimizer="adam", comms={"backward": "fp16"})
    assert again.optimizer == "adam" and again.comms == CommsConfig(backward="fp16")


@pytest.mark.parametrize(
    "params, match",
    [
        ({"topology": "tpu-pod"}, r"sharding.topology='tpu-pod' is not allowed: .*'zionex'"),
        ({"topolgy": "zionex"}, r"unknown key sharding.topolgy"),
        ({"world_size": 0}, r"sharding.world_size=0 "),
        ({"local_world_size": 1.5}, r"sharding.local_world_size=1.5 "),
        ({"options": {"colour": 1}}, r"unknown key sharding.options.colour"),
        ({"options": {"memory_fraction": 2}}, r"sharding.options.memory_fraction=2 .*\(0, 1\]"),
        ({"options": {"comms": "bf16"}}, r"sharding.options.comms='bf16' .*top-level comms"),
        ({"options": {"optimizer": "exact_sgd"}},
         r"sharding.options.optimizer='exact_sgd' .*train.embedding_optimizer.name"),
        ({"options": "fast"}, r"sharding.options='fast' .*mapping"),
    ],
)
def test_sharding_config_names_the_bad_key(params, match):
    with pytest.raises(ConfigError, match=match):
        parse(ShardingConfig, params, "sharding")


def test_sharding_config_validates_on_construction():
    with pytest.raises(ConfigError, match=r"^sharding.topology='x' "):
        ShardingConfig(topology="x")
    with pytest.raises(ConfigError, match=r"^sharding.options.strategy='x' "):
        ShardingConfig(options={"strategy": "x"})


# --- a plan knows the run it was made for ------------------------------------------------------------------
def test_plan_refuses_a_run_it_was_not_made_for():
    comms = CommsConfig("fp16", "bf16", "bf16")
    plan = plan_sharding(mix(8), zionex(8), batch_size_per_rank=512, comms=comms)
    assert plan.batch_size_per_rank == 512 and plan.to_dict()["batch_size_per_rank"] == 512
    plan.check_matches(batch_size_per_rank=512, world_size=8)
    plan.check_matches(batch_size_per_rank=512, world_size=8,
                       comms=CommsConfig("fp16", "bf16", "bf16", loss_scale=8.0))
    with pytest.raises(PlanMismatchError) as info:
        plan.check_matches(batch_size_per_rank=1024, world_size=8, comms=comms)
    assert str(info.value) == (
        "the sharding plan was made for batch_size_per_rank=512 but "
        "train.batch_size_per_rank=1024: plan again for this run (kedro run --pipelines=sharding) "
        "or set train.batch_size_per_rank=512")
    assert isinstance(info.value, ConfigError)
    assert (info.value.key, info.value.planned, info.value.actual) == (
        "train.batch_size_per_rank", 512, 1024)
    with pytest.raises(PlanMismatchError, match=(
            r"^the sharding plan was made for world_size=8 but train.launch.world_size=16: plan "
            r"again .* or set train.launch.world_size=8$")):
        plan.check_matches(batch_size_per_rank=512, world_size=16)
    for field, other in (("forward", CommsConfig("fp32", "bf16", "bf16")),
                         ("backward", CommsConfig("fp16", "fp16", "bf16")),
                         ("dense_allreduce", CommsConfig("fp16", "bf16", "fp32"))):
        planned, actual = getattr(comms, field), getattr(other, field)
        with pytest.raises(PlanMismatchError, match=(
                rf"^the sharding plan was made for comms.{field}={planned} but "
                rf"comms.{field}={actual}: .* or set comms.{field}={planned}$")):
            plan.check_matches(batch_size_per_rank=512, world_size=8, comms=other)
    # the first mismatch is named
    with pytest.raises(PlanMismatchError, match="batch_size_per_rank=512 but"):
        plan.check_matches(batch_size_per_rank=1, world_size=1, comms=CommsConfig())


def test_plans_saved_with_batch_size_still_load():
    plan = plan_sharding(mix(5), zionex(8), 256)
    d = plan.to_dict()
    old = {("batch_size" if k == "batch_size_per_rank" else k): v for k, v in d.items()}
    assert "batch_size_per_rank" not in old
    assert ShardingPlan.from_dict(old) == plan


# --- CLI and import hygiene -----------------------------------------------------------------------------
def test_cli_plans_a_small_yaml(tmp_path, capsys):
    from recscale.sharding.__main__ import main

    tables = tmp_path / "tables.yaml"
    tables.write_text(
        "- {name: users, num_embeddings: 200000, embedding_dim: 64, pooling_factor: 1}\n"
        "- {name: items, num_embeddings: 50000, embedding_dim: 32, pooling_factor: 10,\n"
        "   feature_names: [clicked, viewed]}\n"
        "- {name: tiny, num_embeddings: 10, embedding_dim: 16}\n")
    out = tmp_path / "plan.json"
    chart = tmp_path / "plan.png"
    rc = main(["--tables", str(tables), "--topology", "zionex", "--world-size", "16",
               "--batch-size", "512", "--out", str(out), "--chart", str(chart),
               "--comms-forward", "fp16", "--comms-backward", "bf16"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "Sharding plan: 3 tables on zionex" in text and "comms forward fp16" in text
    plan = ShardingPlan.load(out)
    assert plan.world_size == 16 and plan.table("items").feature_names == ("clicked", "viewed")
    assert chart.stat().st_size > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {name: x, num_embeddings: -1, embedding_dim: 4}\n")
    assert main(["--tables", str(bad)]) == 2
    assert "num_embeddings=-1" in capsys.readouterr().err
