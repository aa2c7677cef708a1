"""The lower bound's coupled-pieces term (``sharding.coupled``): on a small mix where memory
decides which pieces share a rank, CP-SAT proves the least slowest rank of any plan. It must
be a bound (never above a plan that exists, whichever plan's maximum it was given as its upper
limit) and it must see what the other terms cannot (mix 160's best plan is 1.20 x its mean)."""

import sys
from pathlib import Path

import pytest

from recscale.sharding import coupled as C
from recscale.sharding.bounds import plan_lower_bound
from recscale.sharding.context import PlanContext
from recscale.sharding.option_grid import TableArrays
from recscale.sharding.tiering import CACHE_CANDIDATES
from tests.planner.test_sharding_properties import plan_of, small_mix

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_balance import balance  # noqa: E402


def _ctx(seed):
    tables, topo, opts = small_mix(seed)
    plan = plan_of(seed, "balanced")
    return PlanContext.build(TableArrays.build(tables), topo, 256, plan.options), plan


def test_mix_160s_plan_is_proven_the_best_where_the_other_terms_say_balance_is_possible():
    # 4 tables on 12 zionex ranks: t03's column pieces fill the HBM of 10 ranks, so t01's
    # pieces either share those ranks or take the 2 left; the best plan is 1.20 x its mean
    plan = plan_of(160, "balanced")
    alone = plan_lower_bound(plan, coupled=False)
    assert alone.largest_piece < plan.mean_cost < 0.85 * plan.max_cost  # "balance possible"
    b = balance(plan)  # with the coupled term
    assert b["piece_s"] == pytest.approx(plan.max_cost, rel=1e-4)  # proven: no plan is lower
    assert b["bound_s"] == b["piece_s"]
    assert not b["balance_possible"] and b["meets"]


@pytest.mark.parametrize("seed", [7, 47])
def test_the_term_is_never_above_a_plan_that_exists(seed):
    # given a worse plan's maximum as its upper limit (greedy's, round robin's: more options
    # stay in the model), it stays at or below the balanced plan's maximum, and close to it
    # (within 1%: 7 is 6 tables on 2 cpu-local ranks, 47 is 30 on 3)
    ctx, best = _ctx(seed)
    for strategy in ("greedy", "round_robin"):
        worse = plan_of(seed, strategy)
        v = C.coupled_bound(ctx, CACHE_CANDIDATES, worse.max_cost)
        if worse.max_cost > 1.01 * best.max_cost:
            assert v is not None and 0.99 * best.max_cost <= v <= best.max_cost * (1 + 1e-9), (
                strategy, v, best.max_cost)


def test_the_term_is_left_out_where_the_model_is_large_or_the_plan_even(monkeypatch):
    ctx, plan = _ctx(160)
    monkeypatch.setattr(C, "CELLS", 10)
    assert C.coupled_bound(ctx, CACHE_CANDIDATES, plan.max_cost) is None
    assert plan_lower_bound(plan).coupled == 0.0
    even = plan_of(0, "balanced")  # within 1.05 x its mean: nothing to prove
    assert even.max_cost <= 1.05 * even.mean_cost and plan_lower_bound(even).coupled == 0.0


def test_an_upper_limit_no_plan_gets_under_is_the_answer():
    # half the largest piece: some table has no option whose pieces all cost less
    ctx, plan = _ctx(160)
    low = 0.5 * plan_lower_bound(plan, coupled=False).largest_piece
    assert C.coupled_bound(ctx, CACHE_CANDIDATES, low) == low
