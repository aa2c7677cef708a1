"""The planner's exact stage (``sharding.exact``): a small plan still above 1.05 x its mean has
every table's option and every piece's rank chosen again at once by CP-SAT; the result is a
valid plan with a lower slowest rank, the same on every run; even or large plans are left
alone."""

import numpy as np
import pytest

from recscale.sharding import exact as E
from recscale.sharding import partition, plan_sharding
from tests.unit.test_sharding import check_geometry
from tests.unit.test_sharding_properties import small_mix


def _plan(seed, monkeypatch, on=True):
    """The balanced plan of property mix ``seed`` and the stage's (input, output) solutions."""
    calls = []
    real = E.exact

    def spy(ctx, sol):
        out = real(ctx, sol)
        calls.append((ctx, sol, out))
        return out

    monkeypatch.setattr(partition, "EXACT", on)
    monkeypatch.setattr(partition, "exact", spy)
    tables, topo, opts = small_mix(seed)
    return plan_sharding(tables, topo, 256, opts), calls


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
    # a valid plan: every table tiled, host-bound groups in one host, every tier within budget
    mf = plan.options.memory_fraction
    for tp in plan.tables:
        check_geometry(tp, plan.topology)
    for r in plan.ranks:
        for tier in ("hbm", "ddr", "ssd"):
            assert r.memory(tier) <= plan.topology.capacity(tier) * mf * (1 + 1e-9), (r.rank, tier)
        assert r.cost == pytest.approx(sum(s.cost for _, s in plan.shards_for_rank(r.rank)))
    # deterministic: the solver's work is counted, not timed
    again, _ = _plan(160, monkeypatch)
    assert [t.to_dict() for t in again.tables] == [t.to_dict() for t in plan.tables]


def test_an_even_plan_or_one_with_too_many_cells_is_left_alone(monkeypatch):
    _, calls = _plan(160, monkeypatch)
    (ctx, sol_in, sol_out), = calls
    monkeypatch.setattr(E, "CELLS", 10)
    assert E.exact(ctx, sol_in) is sol_in  # more (piece, rank) pairs than allowed
    monkeypatch.setattr(E, "CELLS", 40_000)
    monkeypatch.setattr(E, "BALANCE", 1.3)
    assert E.exact(ctx, sol_in) is sol_in  # within the target: nothing to do
    assert float(np.max(sol_out.load)) < float(np.max(sol_in.load))
