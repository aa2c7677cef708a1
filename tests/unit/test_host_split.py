"""Bytes split into intra-host and inter-host: the plan's host size survives a round trip, the
traffic estimate splits every key, and the run summary exposes the split."""

import dataclasses

import pytest

from recscale.report import summarize
from recscale.sharding import ShardingPlan, TableSpec, Topology, plan_sharding
from recscale.sharding.traffic import estimate_comm_bytes
from recscale.train.result import RankResult


def _plan(world: int, local: int) -> ShardingPlan:
    tables = [TableSpec(f"t{i}", 1000 * (i + 1), 16, pooling_factor=2.0) for i in range(6)]
    return plan_sharding(tables, Topology.preset("cpu-local", world_size=world,
                                                 local_world_size=local), 32)


def test_the_plan_keeps_its_host_size_and_old_plans_load_as_one_host():
    plan = _plan(4, 2)
    assert ShardingPlan.from_dict(plan.to_dict()).local_world_size == 2
    old = plan.to_dict()
    del old["topology"]["local_world_size"]
    assert ShardingPlan.from_dict(old).local_world_size == 4


@pytest.mark.parametrize("world,local", [(2, 2), (4, 2), (8, 2)])
def test_the_estimate_splits_every_key(world, local):
    est = estimate_comm_bytes(_plan(world, local))
    for key in ("input", "output", "output_grad", "dp_input", "dp_output_grad"):
        assert est[f"{key}.intra_host"] + est[f"{key}.inter_host"] == pytest.approx(est[key])
    assert est["intra_host"] + est["inter_host"] == pytest.approx(est["total"])
    if world == local:
        assert est["inter_host"] == 0 and est["intra_host"] == pytest.approx(est["total"])
    else:
        assert est["inter_host"] > 0


def test_host_bound_types_estimate_fewer_inter_host_bytes_than_flat_ones():
    base = _plan(4, 2)
    t = base.tables[0]
    shard = t.shards[0]

    def as_kind(kind, ranks, rows):
        shards = tuple(dataclasses.replace(shard, rank=r, row_offset=i * rows, row_length=rows,
                                           col_offset=0, col_length=t.embedding_dim)
                       for i, r in enumerate(ranks))
        return dataclasses.replace(base, tables=(dataclasses.replace(
            t, sharding_type=kind, shards=shards),))

    flat = estimate_comm_bytes(as_kind("row_wise", (0, 1, 2, 3), t.num_embeddings // 4))
    hier = estimate_comm_bytes(as_kind("table_row_wise", (2, 3), t.num_embeddings // 2))
    assert hier["inter_host"] < flat["inter_host"]


def test_the_summary_exposes_the_split_per_rank_and_in_total():
    ranks = {}
    for r in range(2):
        res = RankResult(rank=r, steps=2, samples=10)
        res.bytes_per_step = {"input": 100.0, "output": 50.0, "intra_host": 60.0 + r,
                              "inter_host": 90.0 - r}
        ranks[r] = dataclasses.asdict(res)
    extra = summarize(ranks).extra
    assert extra["bytes_per_step"] == 300.0  # the split is not counted twice
    assert extra["rank1.bytes_sent_per_step"] == 150.0
    assert extra["bytes_per_step.intra_host"] == 121.0
    assert extra["bytes_per_step.inter_host"] == 179.0
    assert extra["rank0.bytes_per_step.inter_host"] == 90.0


def test_the_step_time_split_leaves_out_the_warmup_steps():
    """rank<r>.step_ms / comm_ms / compute_ms are the step a rank runs: its mean after the first
    WARMUP_STEPS (buffers allocated, connections opened, DDP's buckets rebuilt), where the run
    took more; the warm-up's own mean is rank<r>.warmup_ms."""
    from recscale.train.result import WARMUP_STEPS

    assert WARMUP_STEPS == 2
    res = RankResult(rank=0, steps=10, samples=100, step_seconds=1.0 + 8 * 0.05,
                     comm_seconds=0.2 + 8 * 0.01, warmup_steps=2, warmup_seconds=1.0,
                     warmup_comm_seconds=0.2)
    run = summarize({0: dataclasses.asdict(res)})
    extra = run.extra
    # the run's own seconds (its throughput) still count every step
    assert run.step_seconds == res.step_seconds and extra["step_seconds"] == res.step_seconds
    assert extra["rank0.step_ms"] == pytest.approx(50.0)
    assert extra["rank0.comm_ms"] == pytest.approx(10.0)
    assert extra["rank0.compute_ms"] == pytest.approx(40.0)
    assert extra["rank0.warmup_ms"] == pytest.approx(500.0)
    short = RankResult(rank=0, steps=2, samples=20, step_seconds=1.0, comm_seconds=0.2,
                       warmup_steps=2, warmup_seconds=1.0, warmup_comm_seconds=0.2)
    extra = summarize({0: dataclasses.asdict(short)}).extra
    assert extra["rank0.step_ms"] == pytest.approx(500.0)  # nothing after the warm-up: all
    assert extra["rank0.comm_ms"] == pytest.approx(100.0)
