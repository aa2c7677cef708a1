"""The option search on the slowest rank (``option_search.reoption``: other options and tiers,
coarser as well as finer, for the tables there) and the piece bound it stops on
(``bounds.piece_bound``: a piece plus the floor that tables split over every rank put under it)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

import recscale.sharding.option_search as option_search
import recscale.sharding.partition as partition
from recscale.sharding import TableSpec, Topology, plan_sharding
from recscale.sharding.bounds import least_target, lower_bound, plan_lower_bound
from recscale.sharding.types import PlannerOptions
from tests.planner.test_sharding_properties import plan_of, small_mix

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_balance as bb  # noqa: E402


@pytest.fixture(autouse=True)
def _without_descent(monkeypatch):
    """Every test here plans without the final plan's descent (``partition.DESCENT``) and exact
    stage (``partition.EXACT``): they would take over the gain of the mechanism each one
    compares with and without (descent lowers seed 36's plan without ``_memory_hog`` to the
    plan with it, say)."""
    monkeypatch.setattr(partition, "DESCENT", False)
    monkeypatch.setattr(partition, "EXACT", False)


def _without_search(monkeypatch):
    monkeypatch.setattr(partition, "reoption", lambda ctx, tiers, best, choice, *rest:
                        (best, choice, tiers))


def without_packed_order(monkeypatch):
    """The option search without its second candidate order (by where a table's new pieces
    land on the lightest ranks): for tests of a mechanism whose gain it would take over."""
    monkeypatch.setattr(option_search, "PACKED_ORDER", False)


def test_the_piece_bound_adds_the_floor_of_tables_spread_over_every_rank():
    """A row-wise-only table puts one equal block on each of 4 ranks; a table-wise-only table is
    one piece, on one of those ranks: no plan's slowest rank is below the piece plus a block,
    which the old bound (the larger of the two alone) did not see; the planner reaches it."""
    tables = [TableSpec("spread", 400_000, 64, 20.0,
                        constraints={"sharding_types": ["row_wise"]}),
              TableSpec("lump", 50_000, 128, 40.0,
                        constraints={"sharding_types": ["table_wise"]})]
    topo = Topology.preset("cpu-local", world_size=4, local_world_size=4)
    lb = lower_bound(tables, topo, 256, PlannerOptions())
    plan = plan_sharding(tables, topo, 256)
    block = plan.table("spread").shards[0].cost
    lump = plan.table("lump").shards[0].cost
    assert lb.largest_piece == pytest.approx(lump + block, rel=1e-9)
    assert lb.spread_floor == pytest.approx(block, rel=1e-9) and lb.piece_table == "lump"
    assert plan.max_cost == pytest.approx(lb.value, rel=1e-9)


def test_a_coarser_option_removes_the_row_wise_floor_and_reaches_the_bound(monkeypatch):
    """bench_balance's seed 120 (13 tables on 128 zionex ranks): two tables row-wise over every
    rank put half the mean under every rank; table-row-wise inside a host costs a twentieth of
    that in all. The search ends at the bound; without it the slowest rank is over 2.5x that."""
    m = bb.draw_mix(120)
    plan = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    lb = plan_lower_bound(plan)
    assert plan.max_cost <= 1.01 * lb.value
    _without_search(monkeypatch)
    before = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    assert before.max_cost > 2.5 * plan.max_cost
    assert {t.name: t.sharding_type for t in before.tables}["t0009"] == "row_wise"
    assert {t.name: t.sharding_type for t in plan.tables}["t0009"] == "table_row_wise"


@pytest.mark.parametrize("seed", range(0, 40, 6))
def test_the_search_never_raises_the_slowest_rank(seed, monkeypatch):
    tables, topo, opts = small_mix(seed)
    plan = plan_of(seed, "balanced")  # the property tests' plan of this mix (planned once)
    if isinstance(plan, Exception):  # a refusal is the same with or without the search
        return
    _without_search(monkeypatch)
    before = plan_sharding(tables, topo, 256, opts)
    assert plan.max_cost <= before.max_cost * (1 + 1e-9)


def test_a_tables_new_shards_are_placed_around_the_others_which_stay():
    """``shards.replace_table`` + ``rank_placement.place``: the incremental move the search also
    tries. Every other shard keeps its rank; the table's row-wise blocks land one per rank; the
    ranks' loads are the old ones less the table's old shards plus its new ones."""
    import numpy as np

    from recscale.sharding.context import PlanContext
    from recscale.sharding.cost import RW
    from recscale.sharding.option_grid import TableArrays
    from recscale.sharding.option_search import choice_of
    from recscale.sharding.partition import solve
    from recscale.sharding.rank_placement import place
    from recscale.sharding.shards import replace_table

    tables, topo, opts = small_mix(4)
    arrays = TableArrays.build(tables)
    options = PlannerOptions.coerce(opts)
    ctx = PlanContext.build(arrays, topo, 256, options)
    sol = solve(arrays, topo, 256, options)
    choice = choice_of(ctx, sol)
    lay = sol.layout
    rw = int(np.flatnonzero(ctx.grid.kind == RW)[0])
    tab = next(t for t, s, e in lay.groups if lay.kind[s] != RW and e - s < ctx.W)
    tier = np.full(ctx.n, ctx.ct)
    for t, s, _ in lay.groups:
        tier[t] = lay.tier[s]
    cache = np.where(tier != ctx.ct, sol.cache_fraction, 0.0)
    new_lay = replace_table(ctx, lay, tab, rw, tier, cache)
    choice[tab] = rw
    new = place(ctx, new_lay, choice == ctx.dp_col, sol.cache_fraction)
    before = {(int(t), int(ro), int(co)): int(r) for t, ro, co, r in
              zip(lay.table, lay.row_off, lay.col_off, lay.rank) if t != tab}
    after = {(int(t), int(ro), int(co)): int(r) for t, ro, co, r in
             zip(new.layout.table, new.layout.row_off, new.layout.col_off, new.layout.rank)}
    assert all(after[k] == r for k, r in before.items())
    mine = new.layout.table == tab
    assert sorted(new.layout.rank[mine].tolist()) == list(range(ctx.W))
    assert new.layout.row_len[mine].sum() == int(arrays.N[tab])
    expect = sol.load.sum() - lay.cost[lay.table == tab].sum() + new.layout.cost[mine].sum()
    assert new.load.sum() == pytest.approx(expect, rel=1e-9)


def test_a_finer_option_that_costs_more_in_all_does_not_lower_the_bound():
    """bench_balance's seed 184 (24 tables, 64 zionex ranks): table t0006's smallest pieces
    (column-wise, 0.89 of the plan's mean) come only with a total that lifts the mean above its
    table-column-wise pieces (1.08). The bound counts that (the least over the table's options of
    the larger of its piece and the mean it implies), so it sits within 5% of the plan's slowest
    rank instead of 18% below it."""
    m = bb.draw_mix(184)
    plan = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    lb = plan_lower_bound(plan)
    assert lb.largest_piece >= 1.04 * plan.mean_cost
    assert plan.max_cost <= 1.05 * lb.value


def test_a_plan_balanced_at_a_needless_mean_is_searched_too(monkeypatch):
    """bench_balance's seed 36 (28 tables, 128 zionex ranks): three tables row-wise over every
    rank give a plan balanced to 0.2% whose mean is 5x the bound. The search stops on the bound,
    not on the plan's own mean, so it goes on to table-row-wise and ends 4x faster."""
    m = bb.draw_mix(36)
    plan = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    _without_search(monkeypatch)
    before = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    assert before.max_over_mean < 1.01
    assert before.max_cost > 4 * plan.max_cost
    assert plan.max_cost <= 1.2 * plan_lower_bound(plan).value


def test_a_table_whose_cache_hbm_cannot_hold_is_tried_below_without_one(monkeypatch):
    """bench_balance's seed 291 (10 tables, 96 zionex ranks, fp32): t0000 (2.1e9 rows x 304) is
    row-wise over every rank in HBM. Column-wise in 19 pieces fits DDR but not with the plan's
    cache (a third of 143 GB in 36 GB of HBM); without a cache its pieces cost half a row-wise
    block and a twentieth in all. The search tries each lower tier with and without the cache."""
    m = bb.draw_mix(291)
    plan = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    t0 = plan.table("t0000")
    assert (t0.sharding_type, t0.tier, len(t0.shards)) == ("column_wise", "ddr", 19)
    assert {s.cache_fraction for s in t0.shards} == {0.0} and plan.cache_fraction > 0
    assert plan.max_cost <= 1.01 * plan_lower_bound(plan).value
    _without_search(monkeypatch)
    before = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    assert before.table("t0000").sharding_type == "row_wise"
    assert before.max_cost > 3 * plan.max_cost


def test_a_plan_without_a_cache_tries_the_slowest_ranks_tables_below_with_one(monkeypatch):
    """bench_balance's seed 213 (22 tables, 112 zionex ranks, fp16): everything fits HBM in
    aggregate, so tiering picks no cache, but no rank's HBM holds t0000 (9.6e8 rows x 448) or
    t0001 (1.2e9 x 144) in a cheap shape: t0001 is row-wise over every rank, t0000 in DDR
    without a cache, 28 pieces each nearly a rank's mean. When nothing else helps, the search
    tries those tables below with a small cache (``NO_CACHE_TRIES``): t0001 goes table-row-wise
    into DDR with a fifth of its rows cached, and the plan ends at its bound, 2.4x faster. The
    bound counts the caches the plan's tables took."""
    m = bb.draw_mix(213)
    plan = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    t1 = plan.table("t0001")
    assert plan.cache_fraction == 0.0
    assert (t1.sharding_type, t1.tier) == ("table_row_wise", "ddr")
    assert {s.cache_fraction for s in t1.shards} == {0.2}
    lb = plan_lower_bound(plan)
    assert lb.value <= plan.max_cost * (1 + 1e-9) and plan.max_cost <= 1.01 * lb.value
    # a bound for the plan's own cache fraction alone would claim more than the plan shows
    no_cache = lower_bound(m["tables"], m["topology"], bb.BATCH,
                           PlannerOptions(**m["options"]), 0.0)
    assert plan.max_cost < 0.6 * no_cache.value
    monkeypatch.setattr(option_search, "NO_CACHE_TRIES", ())
    before = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    assert before.table("t0001").sharding_type == "row_wise"
    assert before.max_cost > 2.2 * plan.max_cost


def test_a_table_is_split_into_as_many_pieces_as_the_light_ranks_it_can_fill(monkeypatch):
    """Small mix 127 (7 tables on 16 cpu-local ranks): t04's ten column pieces, six of them
    82.5 ms, and t02's five, 76-86 ms, leave every rank one large piece. t06 (37 ms in all) in
    three pieces of 12 ms put three of t04's ranks at 95 ms, 1.075x the mean: its options all
    leave the same mean, so the search, ordered by the mean, tried the cheapest in all (three
    pieces again). Ordered by where its pieces land on the lightest ranks without it, six
    pieces of 6.4 ms fill the six t04 ranks to 88.9 ms: 1.017x the mean, 5% faster."""
    plan = plan_of(127, "balanced")
    assert plan.table("t06").sharding_type == "column_wise"
    assert len(plan.table("t06").shards) == 6
    assert plan.max_cost <= 1.02 * plan.mean_cost
    without_packed_order(monkeypatch)
    tables, topo, opts = small_mix(127)
    before = plan_sharding(tables, topo, 256, {**opts, "strategy": "balanced"})
    assert len(before.table("t06").shards) == 3
    assert before.max_cost > 1.05 * plan.max_cost


def test_two_tables_change_together_where_neither_helps_alone(monkeypatch):
    """bench_balance's seed 112 (30 tables, 48 zionex ranks): no single option change lowers the
    slowest rank at the end of the search; the best candidates of its two first tables together
    do (1.3% lower). (Without the rocks-and-sand starts and the packed candidate order, whose
    searches end lower still.)"""
    import recscale.sharding.option_search as option_search

    monkeypatch.setattr(partition, "ROCKS", ())
    without_packed_order(monkeypatch)
    m = bb.draw_mix(112)
    plan = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    monkeypatch.setattr(option_search, "PAIR_CANDIDATES", 0)
    alone = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    assert plan.max_cost < 0.995 * alone.max_cost


def test_a_table_filling_the_memory_of_light_ranks_is_split_finer(monkeypatch):
    """bench_balance's seed 36: t0014's nine column pieces (35.5 GB of 40 GB HBM each, 0.28 of
    the mean) leave nine ranks at a third of the load with no room for more, so the rest run
    above the mean. When no table of the slowest rank helps, the search tries the table that
    fills those ranks (``_memory_hog``): finer, it frees them, and the plan ends 6.5% faster than
    the search without it (whose own end the packed candidate order brought down 3%)."""
    import recscale.sharding.option_search as option_search

    m = bb.draw_mix(36)
    plan = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    assert len(plan.table("t0014").shards) > 9
    monkeypatch.setattr(option_search, "_memory_hog", lambda *args: None)
    before = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    assert len(before.table("t0014").shards) == 9
    assert plan.max_cost < 0.95 * before.max_cost


def test_the_target_bound_is_the_least_over_every_choice_of_options():
    """``bounds.least_target`` (every table at once: a target T, each table's cheapest option with
    pieces of at most T) against every choice of one option per table, on random small grids
    with options no rank can hold (inf) and ties in the pieces."""
    rng = np.random.default_rng(11)
    for trial in range(200):
        n, m, W = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 6))
        piece = rng.uniform(0, 1, (n, m))
        if trial % 3 == 0:
            piece = np.round(piece, 1)
        piece[rng.random((n, m)) < 0.2] = np.inf
        total = rng.uniform(0, 3, (n, m))
        rows = [i for i in range(n) if np.isfinite(piece[i]).any()]  # the others: no plan's
        exact = 0.0
        if rows:
            exact = min(max(max(piece[i, c[i]] for i in rows),
                            sum(total[i, c[i]] for i in rows) / W)
                        for c in itertools.product(range(m), repeat=n)
                        if all(np.isfinite(piece[i, c[i]]) for i in rows))
        assert least_target(piece, total, W)[0] == pytest.approx(exact, abs=1e-12)


def test_every_table_at_once_tightens_the_bound_on_a_lumpy_mix(monkeypatch):
    """bench_balance's seed 236 (69 tables on 120 zionex ranks): each table alone bounds the
    slowest rank at 0.95 of the plan's mean; all of them held to the same largest piece at once
    lift the bound 2.7%, to 0.98 of it, and it stays below the plan's slowest rank."""
    import recscale.sharding.bounds as bounds

    m = bb.draw_mix(236)
    plan = plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
    lb = plan_lower_bound(plan)
    monkeypatch.setattr(bounds, "least_target", lambda piece, total, W: (0.0, 0))
    alone = plan_lower_bound(plan)
    assert lb.largest_piece >= 1.02 * alone.largest_piece
    assert lb.largest_piece >= 0.975 * plan.mean_cost
    assert lb.value <= plan.max_cost
