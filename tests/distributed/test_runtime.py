"""The sharded runtime end to end: launch, determinism, failures, memory estimate (2 gloo ranks)."""

import dataclasses
import time

import pytest
import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from recscale.config import parse
from recscale.distributed import LaunchConfig, WorkerFailedError, launch
from recscale.distributed.launch import CPU_BUILD_PRELOAD, forkserver_preload, gpu_build
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.scoring import evaluate_dlrm
from recscale.sharding import TableSpec, Topology, plan_sharding
from recscale.sharding.from_data import table_specs_from_manifest as table_specs
from recscale.train import train_dlrm
from tests.distributed import workers as W

pytestmark = pytest.mark.dist

SMALL = {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}


def _specs(manifest):
    """The data's tables, the three smallest replicated (the planner, costing a replica as the
    runtime runs it, would replicate none here): a plan mixing replicas with sharded tables."""
    specs = table_specs(manifest, 16)
    small = sorted(range(len(specs)), key=lambda i: specs[i].num_embeddings)[:3]
    return [dataclasses.replace(t, constraints={"sharding_types": ["data_parallel"]})
            if i in small else t for i, t in enumerate(specs)]


def _train(manifest, world, out_dir, **train):
    tcfg = parse(TrainConfig, {"batch_size_per_rank": 1000, "progress": "off", "log_every": 5,
                               "launch": {"world_size": world, "collective_timeout_s": 60},
                               **train}, "train")
    plan = plan_sharding(_specs(manifest), Topology.preset("cpu-local", world_size=world),
                         tcfg.batch_size_per_rank) if world > 1 else None
    return train_dlrm(manifest, parse(ModelConfig, SMALL, "model"), tcfg, plan,
                      None if out_dir is None else str(out_dir))


def test_same_seed_same_world_size_gives_bitwise_identical_weights(parquet_dataset, tmp_path):
    a = _train(parquet_dataset, 2, tmp_path / "a")
    b = _train(parquet_dataset, 2, tmp_path / "b")
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # every train row was consumed exactly once across the two ranks, none dropped
    assert a.result.samples == parquet_dataset["splits"]["train"]["rows"]
    assert a.result.extra["rank0.comm_ms"] > 0 and a.result.extra["bytes_per_step"] > 0
    # the gathered, unsharded model evaluates like any other
    m = evaluate_dlrm(a.model, parquet_dataset, "test", 4096)
    assert 0.55 < m["auc"] <= 1.0


def test_pipelined_and_plain_training_give_identical_weights(parquet_dataset, tmp_path,
                                                            monkeypatch):
    import tempfile

    a = _train(parquet_dataset, 2, tmp_path / "a", pipeline=True, max_steps=12)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    b = _train(parquet_dataset, 2, None, pipeline=False, max_steps=12)
    # without an output directory the run's own scratch (rank 0's model state) is removed
    assert [p.name for p in scratch.iterdir() if p.name.startswith("recscale-train-")] == []
    # the replicated tables' traffic is what the plan's estimate says: output-gradient rows
    # exactly (12 full batches), ids within the data's pooling (the estimate uses its mean)
    from recscale.sharding.traffic import estimate_comm_bytes

    plan = plan_sharding(_specs(parquet_dataset), Topology.preset("cpu-local"), 1000)
    assert sum(t.sharding_type == "data_parallel" for t in plan.tables) == 3
    est = estimate_comm_bytes(plan, lengths_bytes=8)
    for key, rel in (("dp_output_grad", 1e-12), ("dp_input", 0.05)):
        got = sum(r.result.extra[f"rank{k}.bytes_per_step.{key}"] for r in (a,) for k in (0, 1))
        assert got == pytest.approx(est[key], rel=rel), key
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a.result.steps == b.result.steps == 12
    assert a.result.extra["bytes_per_step"] == b.result.extra["bytes_per_step"]


def test_a_worker_sees_the_launchers_environment_at_launch_time(monkeypatch):
    """Forked from a fork server started at an earlier launch, a worker still sees what the
    launching process set or removed since, and elastic's own per-worker values; a spawned
    worker (start_method: spawn) sees the same."""
    names = ["RECSCALE_TEST_SET", "RECSCALE_TEST_REMOVED", "RANK", "WORLD_SIZE"]
    cfg = LaunchConfig(world_size=2)
    assert cfg.start_method == "forkserver"
    monkeypatch.setenv("RECSCALE_TEST_REMOVED", "before")
    monkeypatch.setenv("RANK", "7")  # the launcher's own: elastic's value wins in a worker
    first = launch(W.environment_worker, (names,), cfg)
    assert [first[r]["RECSCALE_TEST_REMOVED"] for r in (0, 1)] == ["before", "before"]
    monkeypatch.setenv("RECSCALE_TEST_SET", "after")
    monkeypatch.delenv("RECSCALE_TEST_REMOVED")
    want = {r: {"RECSCALE_TEST_SET": "after", "RECSCALE_TEST_REMOVED": None, "RANK": str(r),
                "WORLD_SIZE": "2"} for r in (0, 1)}
    assert launch(W.environment_worker, (names,), cfg) == want
    spawned = LaunchConfig(world_size=2, start_method="spawn")
    assert launch(W.environment_worker, (names,), spawned) == want


def test_a_forked_worker_starts_with_what_every_worker_imports_already_imported():
    """The fork server imports them once (on a torch built for neither CUDA nor ROCm, DDP's
    torch._dynamo and the training modules with fbgemm too), so a launch or an elastic restart
    does not import them again in every worker: a name multiprocessing cannot import it skips
    without a word, and a worker would import it itself."""
    names = forkserver_preload()
    if not gpu_build():
        assert set(CPU_BUILD_PRELOAD) <= set(names)
    assert launch(W.modules_loaded, (names,), LaunchConfig(world_size=2)) == {0: names, 1: names}


def test_a_worker_exception_fails_the_run_with_its_traceback():
    cfg = LaunchConfig(world_size=2)
    with pytest.raises(WorkerFailedError) as err:
        launch(W.failing_worker, (), cfg)
    msg = str(err.value)
    assert msg.startswith("worker rank 1 failed first: ValueError: boom from rank 1")
    assert 'workers.py", line' in msg and "raise ValueError" in msg  # the worker's own traceback


def test_a_hung_collective_ends_in_an_error_not_a_stall():
    cfg = LaunchConfig(world_size=2, collective_timeout_s=3)
    t0 = time.perf_counter()
    with pytest.raises((WorkerFailedError, ChildFailedError)) as err:
        launch(W.hanging_worker, (), cfg)
    assert "rank 0" in str(err.value)
    assert time.perf_counter() - t0 < 60


def test_embedding_memory_after_construction_is_within_10pct_of_the_plan():
    tables = [TableSpec(f"t{i}", 100_000, 16, feature_names=(f"f{i}",)) for i in range(8)]
    plan = plan_sharding(tables, Topology.preset("cpu-local", world_size=2), 2048)
    cfg = LaunchConfig(world_size=2)
    res = launch(W.memory_worker, (plan.to_dict(),), cfg)
    for rank, r in res.items():
        assert abs(r["measured"] - r["planned"]) <= 0.10 * r["planned"], (rank, r)
