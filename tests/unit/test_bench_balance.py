"""benchmarks/bench_balance.py's mixes: drawn from the seed alone, in their families' ranges; and
a refusal it found, whose message now says where the memory went."""

import sys
from pathlib import Path

import pytest

from recscale.sharding import PlannerError, plan_sharding

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_balance as bb  # noqa: E402


def test_a_mix_is_its_seed_and_the_families_take_turns():
    a, b = bb.draw_mix(17), bb.draw_mix(17)
    assert a["tables"] == b["tables"] and a["topology"] == b["topology"]
    assert [bb.draw_mix(s)["family"] for s in range(4)] == list(bb.FAMILIES)
    for seed in range(12):
        m = bb.draw_mix(seed)
        topo = m["topology"]
        assert 10 <= len(m["tables"]) <= 2000
        assert 1 <= topo.num_hosts <= 16 and topo.world_size % topo.local_world_size == 0
        assert all(t.embedding_dim % 16 == 0 and 1 <= t.pooling_factor <= 200
                   for t in m["tables"][3:])


def test_the_rule_is_judged_against_the_mean_and_the_largest_piece():
    r = bb.run_mix(1)
    assert {"max_over_mean", "max_over_bound", "balance_possible", "seconds"} <= set(r)
    assert r["max_over_bound"] >= 1.0 - 1e-9  # the bound is a bound
    assert r["meets"] == (r["max_over_rule"] <= 1.10 and (not r["balance_possible"]
                                                          or r["max_over_mean"] <= 1.05))


def test_a_refusal_says_how_much_the_lookup_buffers_hold():
    """Seed 222: 158 GB of tables on 128 cpu-local ranks (346 GB usable) refused, because the
    compute tier's lookup buffers are reserved first; the message names them."""
    m = bb.draw_mix(222)
    with pytest.raises(PlannerError, match=r"does not fit: only .* left of 345.60 GB usable "
                                           r"\(ddr, memory_fraction=0.9, 229.73 GB of it held in "
                                           r"ddr for the lookups' input/output buffers"):
        plan_sharding(m["tables"], m["topology"], bb.BATCH, m["options"])
