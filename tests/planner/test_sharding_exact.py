"""The planner's exact stage (``sharding.exact``): a small plan still above 1.05 x its mean has
every table's option and every piece's rank chosen again at once by CP-SAT, a slow tier's tables
at the plan's cache fraction and then at any; the result is a valid plan with a lower slowest
rank, the same on every run; even or large plans are left alone."""

import numpy as np
import pytest

from recscale.sharding import exact as E
from recscale.sharding import partition, plan_sharding
from recscale.sharding.bounds import plan_lower_bound
from tests.planner.test_sharding import check_geometry
from tests.planner.test_sharding_properties import small_mix

_RUNS: dict = {}  # (seed, on) -> _plan's answer, for the tests that read the same one


def _plan(seed, monkeypatch, on=True, fresh=False):
    """The balanced plan of property mix ``seed`` and the stage's (input, output) solutions
    (each planned once per process, ``fresh``: again)."""
    if not fresh and (seed, on) in _RUNS:
        return _RUNS[seed, on]
    calls = []
    real = E.exact

    def spy(ctx, sol):
        out = real(ctx, sol)
        calls.append((ctx, sol, out))
        return out

    monkeypatch.setattr(partition, "EXACT", on)
    monkeypatch.setattr(partition, "exact", spy)
    tables, topo, opts = small_mix(seed)
    out = plan_sharding(tables, topo, 256, opts), calls
    if not fresh:
        _RUNS[seed, on] = out
    return out


def test_a_small_uneven_plan_gets_options_and_ranks_chosen_together(monkeypatch):
    # property mix 160: 4 tables on 12 zionex ranks (3 hosts), one table's column pieces
    # filling the HBM of 9 ranks; the search before ends at 1.28 x the mean
    before, none = _plan(160, monkeypatch, on=False)
    assert not none and before.max_cost > 1.2 * before.mean_cost
    plan, calls = _plan(160, monkeypatch)
    (ctx, sol_in, sol_out), = calls
    assert sol_out is not sol_in
    assert plan.max_cost == pytest.approx(float(sol_out.load.max()))
    assert plan.max_cost < 0.97 * before.max_cost  # 0.961 x
    _check_valid(plan)
    # deterministic: the solver's work is counted, not timed
    again, _ = _plan(160, monkeypatch, fresh=True)
    assert [t.to_dict() for t in again.tables] == [t.to_dict() for t in plan.tables]


def _check_valid(plan):
    """Every table tiled, host-bound groups in one host, every tier within budget, every rank's
    cost its shards'."""
    mf = plan.options.memory_fraction
    for tp in plan.tables:
        check_geometry(tp, plan.topology)
    for r in plan.ranks:
        for tier in ("hbm", "ddr", "ssd"):
            assert r.memory(tier) <= plan.topology.capacity(tier) * mf * (1 + 1e-9), (r.rank, tier)
        assert r.cost == pytest.approx(sum(s.cost for _, s in plan.shards_for_rank(r.rank)))


def test_a_slow_tier_at_another_cache_fraction_is_tried_where_the_plans_own_stays_uneven(
        monkeypatch):
    # property mix 134: 5 tables on 8 dgx-h100 ranks (2 hosts), all in HBM without a cache. The
    # plan's own cache fraction (none) cannot do better than 1.13 x the largest piece (t04's
    # column pieces); t02's columns in DDR with half their rows cached in HBM, on the ranks
    # t04 leaves, can: the slowest rank is then t04's piece alone
    before, _ = _plan(134, monkeypatch, on=False)
    assert {s.tier for t in before.tables for s in t.shards} == {"hbm"}
    plan, calls = _plan(134, monkeypatch)
    lb = plan_lower_bound(plan, coupled=False)
    assert before.max_cost > 1.12 * lb.largest_piece
    assert plan.max_cost == pytest.approx(lb.largest_piece, rel=1e-6)
    t02 = next(t for t in plan.tables if t.name == "t02")
    assert {(s.tier, s.cache_fraction) for s in t02.shards} == {("ddr", 0.5)}
    assert plan.cache_fraction == 0.5  # the plan's: the one its slow-tier table took
    _check_valid(plan)


def test_an_even_plan_or_one_with_too_many_cells_is_left_alone(monkeypatch):
    _, calls = _plan(160, monkeypatch)
    (ctx, sol_in, sol_out), = calls
    monkeypatch.setattr(E, "CELLS", 10)
    assert E.exact(ctx, sol_in) is sol_in  # more (piece, rank) pairs than allowed
    monkeypatch.setattr(E, "CELLS", 40_000)
    monkeypatch.setattr(E, "BALANCE", 1.3)
    assert E.exact(ctx, sol_in) is sol_in  # within the target: nothing to do
    assert float(np.max(sol_out.load)) < float(np.max(sol_in.load))


def test_the_same_model_is_not_solved_twice(monkeypatch, tmp_path):
    """Where the first solve finds nothing below the plan and the other cache fractions add no
    candidate (nothing may spill), the second would hand CP-SAT the same model with the same
    hint: it is not asked again, and the plan is the one asking again gives. The multi-host
    tests' 26 small tables on 3 hosts x 2 ranks (with the solver's full work, 33 s of CPU, half
    of it the repeated solve)."""
    from recscale.config import parse
    from recscale.data.preprocess import load_manifest
    from recscale.runconfig import DLRMConfig, plan_for_run
    from tests.multihost.harness import config
    from tests.multihost.jobs import make_dataset

    manifest = load_manifest(make_dataset(tmp_path, rows=6000))
    cfg = parse(DLRMConfig, config("10.0.0.1:1", 6, 3, tmp_path / "ck"), "")
    monkeypatch.setattr(E, "WORK", 1.0)  # the solver's work: the same model either way
    solves = []
    real_solve = E._solve
    monkeypatch.setattr(E, "_solve", lambda *a: solves.append(1) or real_solve(*a))
    plan = plan_for_run(manifest, cfg)
    assert len(solves) == 1
    real_once = E._once
    monkeypatch.setattr(E, "_once", lambda ctx, sol, caches, unsolved=None: real_once(
        ctx, sol, caches))  # asking every time
    again = plan_for_run(manifest, cfg)
    assert len(solves) == 3
    assert [t.to_dict() for t in again.tables] == [t.to_dict() for t in plan.tables]
