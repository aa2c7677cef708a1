"""Seeded random small mixes, every one planned and checked for validity: the shards of each
table tile it exactly (data-parallel: every rank whole), host-bound types stay in one host, every
rank is in range, no tier of any rank holds more than its usable bytes, and the ranks' memory
is the sum of their shards'. (How evenly they balance is benchmarks/bench_balance.py's.)"""

import math

import numpy as np
import pytest

from recscale.sharding import PlannerError, TableSpec, Topology, plan_sharding
from recscale.sharding.topology import PRESETS

HOST_BOUND = ("table_row_wise", "table_column_wise")


def check_tiling(tp, topo):
    """The shards cover the table's rows x columns exactly once (intervals, not a mask: the
    tables here reach 1e9 rows); data-parallel: every rank holds it whole."""
    ranks = [s.rank for s in tp.shards]
    if tp.sharding_type == "data_parallel":
        assert sorted(ranks) == list(range(topo.world_size))
        assert all(s.row_length == tp.num_embeddings and s.col_length == tp.embedding_dim
                   for s in tp.shards)
        return
    assert len(set(ranks)) == len(ranks), f"shards of {tp.name} share a rank"
    rows = sorted({(s.row_offset, s.row_length) for s in tp.shards})
    cols = sorted({(s.col_offset, s.col_length) for s in tp.shards})
    assert len(rows) * len(cols) == len(tp.shards)  # a grid of row blocks x column blocks
    for spans, size in ((rows, tp.num_embeddings), (cols, tp.embedding_dim)):
        end = 0
        for off, length in spans:
            assert off == end and length > 0
            end += length
        assert end == size
    if tp.sharding_type in HOST_BOUND:
        assert len({topo.host_of(r) for r in ranks}) == 1

SEEDS = range(40)


def small_mix(seed: int):
    rng = np.random.default_rng([seed, 7])
    n = int(rng.integers(3, 60))
    preset = str(rng.choice(sorted(PRESETS)))
    lws = int(rng.integers(1, 5)) if preset == "cpu-local" else 4
    topo = Topology.preset(preset, world_size=lws * int(rng.integers(1, 5)), local_world_size=lws)
    rows = (10 ** rng.uniform(2, 2 + rng.uniform(2, 6), n)).astype(np.int64)
    dims = 16 * rng.integers(1, 17, n)
    pool = np.exp(rng.uniform(0, math.log(200), n))
    wp = 2 if rng.random() < 0.5 else 4
    fast = topo.capacity(topo.compute_tier) * topo.world_size
    scale = rng.uniform(0.05, 1.5) * fast / float((rows * dims * wp).sum())
    rows = np.maximum(10, (rows * scale)).astype(np.int64)
    tables = [TableSpec(f"t{i:02d}", int(r), int(d), float(p))
              for i, (r, d, p) in enumerate(zip(rows, dims, pool))]
    return tables, topo, {"weight_precision": "fp16" if wp == 2 else "fp32"}


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_mix_plans_to_valid_shards_within_every_tier(seed):
    tables, topo, opts = small_mix(seed)
    try:
        plan = plan_sharding(tables, topo, 256, opts)
    except PlannerError as exc:  # a refusal must name a table or what to change
        assert "to fit" in str(exc)
        return
    assert [t.name for t in plan.tables] == [t.name for t in tables]
    mf = plan.options.memory_fraction
    for tp in plan.tables:
        check_tiling(tp, topo)
        assert all(0 <= s.rank < topo.world_size and s.tier in topo.tiers for s in tp.shards)
    for r in plan.ranks:
        for tier in ("hbm", "ddr", "ssd"):
            assert r.memory(tier) <= topo.capacity(tier) * mf * (1 + 1e-9), (r.rank, tier)
        ct = sum(s.compute_tier_bytes + (s.storage_bytes if s.tier == topo.compute_tier else 0)
                 for _, s in plan.shards_for_rank(r.rank))
        assert ct == pytest.approx(r.memory(topo.compute_tier))
    assert plan.max_over_mean >= 1.0
