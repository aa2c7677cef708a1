"""Planner balance where hot tables spill below the compute tier on several hosts: the tier of a
table and its splitting decided together (``partition._promote``) and host-bound groups moved
between hosts (``local_search.improve(groups=True)``), and the cache fraction chosen by the plans
it gives (``partition._other_caches``), starts whose pieces are rocks or sand
(``proposals.rocks_and_sand``), the search's end swapped with every rank's shards
(``local_search.improve(wide=True)``), the load above 1.05 x the mean lowered table by table
(``descent.descend``), and the rock starts the search passed over searched where the plan ends
uneven (``partition._rocks_left``)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import recscale.sharding.partition as partition
from recscale.sharding import PlannerError, ShardingPlan, TableSpec, Topology, plan_sharding
from recscale.sharding.bounds import least_target, plan_lower_bound
from recscale.sharding.context import PlanContext
from recscale.sharding.option_grid import TableArrays
from recscale.sharding.proposals import SAND, price_options, rocks_and_sand
from recscale.sharding.tiering import assign_tiers, choose_data_parallel
from recscale.sharding.types import PlannerOptions
from tests.planner.test_option_search import without_packed_order
from tests.planner.test_sharding import check_geometry
from tests.planner.test_sharding_properties import small_mix

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_balance as bb  # noqa: E402


def tier_heavy(n: int, seed: int, total_params: float) -> list[TableSpec]:
    """5% of the tables hold 90% of the parameters and are the hottest (pooling 20-100)."""
    rng = np.random.default_rng(seed)
    big = max(1, n // 20)
    dims = rng.choice([64, 128, 256], n)
    weight = np.concatenate([rng.lognormal(0.0, 0.5, big) * 0.9 / big * (n - big),
                             rng.lognormal(0.0, 1.0, n - big) * 0.1])
    rows = np.maximum(1000, (weight / (weight * dims).sum() * total_params).astype(np.int64))
    pool = np.concatenate([rng.uniform(20, 100, big), rng.uniform(1, 10, n - big)])
    return [TableSpec(f"h{i:03d}", int(r), int(d), float(p))
            for i, (r, d, p) in enumerate(zip(rows, dims, pool))]


def test_tier_heavy_three_hosts_reach_the_balance_the_bound_allows():
    # 60 tables, 2.1e12 fp16 parameters on 3 zionex hosts (24 ranks): the hot tables fill DDR
    # and one spills to SSD. The search before tiers and splitting were decided together ended
    # at max/mean 1.266 here (a host holding a host-bound SSD table); the bound allows ~0.5.
    topo = Topology.preset("zionex", world_size=24)
    tables = tier_heavy(60, 2, 2.1e12)
    plan = plan_sharding(tables, topo, 512, weight_precision="fp16")
    bound = plan_lower_bound(plan)
    assert bound.value <= 0.95 * plan.mean_cost  # the bound allows max/mean <= 1.05
    assert plan.max_over_mean <= 1.05
    assert plan.max_cost >= bound.value
    # valid: every tier within its usable bytes on every rank
    mf = plan.options.memory_fraction
    for r in plan.ranks:
        for tier in ("hbm", "ddr", "ssd"):
            assert r.memory(tier) <= topo.capacity(tier) * mf * (1 + 1e-9)
    assert {s.tier for t in plan.tables for s in t.shards} >= {"hbm", "ddr"}
    # every table's shards cover its rows x columns exactly once, at most one shard per rank,
    # and host-bound tables stay in one host
    lw = topo.local_world_size
    for t in plan.tables:
        if t.sharding_type == "data_parallel":
            continue
        assert sum(s.row_length * s.col_length for s in t.shards) == (
            t.num_embeddings * t.embedding_dim)
        assert len({s.rank for s in t.shards}) == len(t.shards)
        if t.sharding_type in ("table_row_wise", "table_column_wise"):
            assert len({s.rank // lw for s in t.shards}) == 1
    assert ShardingPlan.from_dict(plan.to_dict()) == plan


def test_the_cache_fraction_is_the_one_whose_plan_is_fastest_not_the_least_lookup_estimate(
        monkeypatch):
    """Small mix 28 (13 tables, 3 dgx-h100 hosts of 4): the least estimated lookup time in
    total is a cache of half the spilled rows in HBM, which leaves HBM too full for a hot
    table, so it goes to DDR in three costly pieces. Planned with the next cache fractions too
    (``partition._other_caches``), a tenth cached keeps it in HBM, split five ways: the
    slowest rank is 15% faster (the rocks-and-sand starts left out, to see this alone, and the
    exact stage, whose second pass tries other cache fractions too)."""
    monkeypatch.setattr(partition, "ROCKS", ())
    monkeypatch.setattr(partition, "EXACT", False)
    tables, topo, opts = small_mix(28)
    plan = plan_sharding(tables, topo, 256, opts)
    monkeypatch.setattr(partition, "CACHE_TRIES", 0)
    estimated = plan_sharding(tables, topo, 256, opts)
    assert estimated.cache_fraction == 0.5 and plan.cache_fraction != 0.5
    assert plan.max_cost <= 0.87 * estimated.max_cost
    # the one that plans fastest among those tried: no other fraction's plan is faster here
    for c in (0.0, 0.05, 0.2, 0.35):
        forced = plan_sharding(tables, topo, 256, {**opts, "cache_fraction": c})
        assert plan.max_cost <= forced.max_cost * (1 + 1e-9), c


@pytest.mark.parametrize("seed", [22])
def test_trying_other_cache_fractions_never_slows_a_plan(seed, monkeypatch):
    tables, topo, opts = small_mix(seed)
    plan = plan_sharding(tables, topo, 256, opts)
    monkeypatch.setattr(partition, "CACHE_TRIES", 0)
    assert plan.max_cost <= plan_sharding(tables, topo, 256, opts).max_cost * (1 + 1e-9)


def test_rocks_and_sand_starts_end_faster_where_pieces_are_few_per_rank(monkeypatch):
    """Small mix 50 (31 tables on 4 zionex hosts of 4): the starts that split every table
    against one share of the mean leave pieces of a third to a half of a rank, two or three a
    rank; a start whose pieces are rocks (near a rank each) or sand (at most a fifth) searches
    to a plan 12% faster. (With the option search's packed candidate order off: alone, it
    ends within 1% of the rocks and sand.)"""
    without_packed_order(monkeypatch)
    tables, topo, opts = small_mix(50)
    plan = plan_sharding(tables, topo, 256, opts)
    monkeypatch.setattr(partition, "ROCKS", ())
    without = plan_sharding(tables, topo, 256, opts)
    assert plan.max_cost <= 0.9 * without.max_cost
    assert plan.max_over_mean <= 1.05


def _with_fewer_pools(monkeypatch, seed: int, pools: int):
    """bench_balance's mix ``seed`` planned with every pool of rocks-and-sand starts and with
    the first ``pools`` alone (the option search's packed candidate order and the end's swaps
    with any rank off in both)."""
    without_packed_order(monkeypatch)
    monkeypatch.setattr(partition, "WIDE_SWAPS", False)
    m = bb.draw_mix(seed)
    plan = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    monkeypatch.setattr(partition, "ROCKS", partition.ROCKS[:pools])
    return plan, plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])


def test_fine_sand_evens_ranks_whose_rocks_are_nearly_a_rank_each(monkeypatch):
    """bench_balance's seed 8 (16 tables on 45 cpu-local ranks): against a target near the
    mean, rocks are 0.6-1.0 of a rank, and sand of up to a fifth of one leaves ranks up to 7%
    above the mean. The second pool of starts (sand of at most a twentieth, searched on its
    own) ends 6% faster, within 5% of its mean. (With the option search's packed candidate
    order off, which brings the coarse pool's end within 5% of its mean too.)"""
    plan, coarse = _with_fewer_pools(monkeypatch, 8, 1)
    assert coarse.max_over_mean > 1.06
    assert plan.max_cost <= 0.95 * coarse.max_cost and plan.max_over_mean <= 1.05


def test_a_pool_sharing_its_finest_start_with_a_coarser_one_ends_elsewhere(monkeypatch):
    """bench_balance's seed 267 (110 tables on 80 zionex ranks, 3x the HBM): the fine-sand pool
    refines its two best starts and ends at max/mean 1.10; the finest start beside one with
    sand of a tenth (the third pool, the finest start placed once for both) ends 1.012, a
    little faster too. (With the option search's packed candidate order off: with it,
    the plan ends 24% faster still, at max/mean 1.027; and the end's swaps with any rank off:
    with them, the second pool's end reaches 1.009 too.)"""
    plan, two = _with_fewer_pools(monkeypatch, 267, 2)
    assert two.max_over_mean > 1.09
    assert plan.max_cost < two.max_cost and plan.max_over_mean <= 1.02


def test_rocks_and_sand_takes_no_piece_in_between_where_a_table_has_the_choice():
    tables, topo, opts = small_mix(50)
    ctx = PlanContext.build(TableArrays.build(tables), topo, 256, PlannerOptions.coerce(opts))
    is_dp = choose_data_parallel(ctx)
    tiers = assign_tiers(ctx, is_dp, 0.95)
    prices = price_options(ctx, tiers.tier, tiers.cache)
    oc, base = prices.costs, prices.base & ~is_dp[:, None]
    target = least_target(np.where(base, oc.max, np.inf), np.where(base, oc.total, np.inf),
                          ctx.W)[0]
    choice = rocks_and_sand(ctx, prices, is_dp, 1.0, 0.6)
    rows = np.arange(ctx.n)[~is_dp]
    piece = oc.max[rows, choice[rows]]
    assert (piece <= target * (1 + 1e-9)).all()
    either = base & (oc.max <= target) & ((oc.max <= SAND * target) | (oc.max >= 0.6 * target))
    has = either[rows].any(axis=1)
    assert has.sum() >= ctx.n // 2  # the rule decides for most tables here
    mid = (piece > SAND * target) & (piece < 0.6 * target)
    assert not mid[has].any()
    # and each takes the cheapest such option
    cheapest = np.where(either[rows], oc.total[rows], np.inf).min(axis=1)
    assert np.allclose(oc.total[rows, choice[rows]][has], cheapest[has])


def test_swaps_with_any_rank_lower_a_slowest_rank_the_lightest_cannot(monkeypatch):
    """bench_balance's seed 175 (48 tables on 80 zionex ranks, the weights filling HBM): the
    option search's end, swapped with the shards of every rank (``improve(wide=True)``), is at
    least 0.5% faster than the same end searched with the lightest ranks alone: where memory is
    full, a slightly lighter piece of a medium rank is what a slow rank can trade. Every wide
    search keeps every tier of every rank within its bytes and never raises the maximum."""
    calls = []
    real = partition.improve

    def spy(ctx, sol, groups=False, wide=False):
        out = real(ctx, sol, groups, wide)
        if wide:
            calls.append((sol.load.max(), real(ctx, sol, groups).load.max(), out))
        return out

    monkeypatch.setattr(partition, "improve", spy)
    m = bb.draw_mix(175)
    plan = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    assert calls
    for before, _, out in calls:
        assert out.load.max() <= before * (1 + 1e-12) and (out.free >= -1e-6).all()
    gain = min(out.load.max() / narrow for _, narrow, out in calls)
    assert gain < 0.995
    assert plan.max_cost <= min(out.load.max() for *_, out in calls) * (1 + 1e-9)


@pytest.fixture(scope="module")
def descended():
    """Small mix 67 planned, with the plan ``descent.descend`` started from and its result (and
    the arguments it was called with)."""
    seen = []
    real = partition.descend

    def spy(ctx, sol, piece, prices, evaluate):
        out = real(ctx, sol, piece, prices, evaluate)
        seen.append((ctx, sol, piece, prices, out))
        return out

    partition.descend = spy
    try:
        tables, topo, opts = small_mix(67)
        plan = plan_sharding(tables, topo, 256, opts)
    finally:
        partition.descend = real
    assert len(seen) == 1
    return plan, seen[0]


def test_the_load_above_the_target_lowered_table_by_table_crosses_a_plateau(descended):
    """Small mix 67 (12 zionex ranks): the option search ends at max/mean 1.071 with several
    ranks within a few percent of the slowest, so no single change it tries makes the slowest
    faster. Lowering the load above 1.05 x the mean one table at a time (``descent.descend``)
    ends at least 1% faster (2.3% here) and within 1.05 of the mean; every tier of every rank
    stays within its bytes, and the plan is the one descend returned."""
    plan, (_, before, _, _, after) = descended
    assert before.load.max() / before.load.mean() > 1.05
    assert after.load.max() <= before.load.max() * 0.99
    assert (after.free >= -1e-6).all()
    assert plan.max_cost == pytest.approx(after.load.max(), rel=1e-12)
    assert plan.max_over_mean <= 1.05


def test_descent_keeps_no_change_that_raises_the_maximum_or_only_the_mean(descended):
    """Changes offered to ``descend`` that lower the excess only by raising the slowest rank, or
    only by raising every other rank (the mean, and with it a target that moved with it), are
    not kept: the plan comes back as it went in."""
    from dataclasses import replace

    from recscale.sharding.descent import descend

    _, (ctx, before, piece, prices, _) = descended
    r = int(np.argmax(before.load))

    def raise_max(sol, tab, option, tier, cache):  # the slowest 1% slower, the rest at the mean
        compute = np.full(ctx.W, sol.load.mean()) - sol.comms
        compute[r] = sol.load[r] * 1.01 - sol.comms[r]
        return replace(sol, compute=compute)

    def raise_mean(sol, tab, option, tier, cache):  # every other rank up to just below the max
        compute = sol.compute.copy()
        others = np.arange(ctx.W) != r
        compute[others] = sol.load[r] * 0.999 - sol.comms[others]
        return replace(sol, compute=compute)

    for fake in (raise_max, raise_mean):
        assert descend(ctx, before, piece, prices, fake) is before


def test_rock_pools_passed_over_are_searched_where_the_plan_ends_uneven(monkeypatch):
    """Six tables on one zionex host of 8, one pinned to DDR: the rock starts place worse than
    the others, so the search passes over them, and the plan ends (descended) at max/mean
    1.058. Searched once the plan is found uneven (``partition._rocks_left``), a pool of them
    ends within 1.05 of its mean and the slowest rank faster. A plan already within 1.05 (small
    mix 50) searches none of them again."""
    from planner_golden import mix

    tables = [TableSpec("p", 10_000, 32, constraints={"tier": "ddr"})] + mix(5)
    topo = Topology.preset("zionex", world_size=8)
    calls = []
    real = partition._partition

    def spy(*args, **kw):
        out = real(*args, **kw)
        if kw.get("rocks_left"):
            calls.append(out)
        return out

    monkeypatch.setattr(partition, "_partition", spy)
    monkeypatch.setattr(partition, "EXACT", False)  # the stage after it would even it out too
    plan = plan_sharding(tables, topo, 128)
    assert len(calls) == 1 and calls[0] is not None
    monkeypatch.setattr(partition, "ROCKS_WHILE_UNEVEN", False)
    without = plan_sharding(tables, topo, 128)
    assert without.max_over_mean > 1.05
    assert plan.max_cost < without.max_cost and plan.max_over_mean <= 1.05
    mf = plan.options.memory_fraction
    for tp in plan.tables:  # still a valid plan: shards tile their tables, the pin holds
        check_geometry(tp, topo)
    assert {s.tier for s in plan.tables[0].shards} == {"ddr"}
    for r in plan.ranks:
        for tier in topo.tiers:
            assert r.memory(tier) <= topo.capacity(tier) * mf * (1 + 1e-9), (r.rank, tier)

    monkeypatch.setattr(partition, "ROCKS_WHILE_UNEVEN", True)
    calls.clear()
    tables, topo, opts = small_mix(50)
    assert plan_sharding(tables, topo, 256, opts).max_over_mean <= 1.05
    assert calls == []


def test_a_mix_no_start_packs_is_planned_from_small_pieces(monkeypatch):
    """bench_balance's seed 147 (10 tables on 18 cpu-local ranks, DDR only, the weights near
    80% of it): every start leaves some table's equal shards too few ranks with room, and
    there is no lower tier to spill to. Starts whose pieces hold at most a share of a rank's
    bytes (``proposals.small_pieces``) pack, and the plan is valid and balanced; without them
    the planner refuses the mix."""
    m = bb.draw_mix(147)
    tables, topo = m["tables"], m["topology"]
    plan = plan_sharding(tables, topo, bb.BATCH, m["options"])
    mf = plan.options.memory_fraction
    for tp in plan.tables:
        check_geometry(tp, topo)
    for r in plan.ranks:
        assert r.memory("ddr") <= topo.capacity("ddr") * mf * (1 + 1e-9), r.rank
    assert bb.balance(plan)["meets"]
    monkeypatch.setattr(partition, "SMALL_PIECES", ())
    with pytest.raises(PlannerError, match="to fit"):
        plan_sharding(tables, topo, bb.BATCH, m["options"])
