"""Sharded checkpoints on 2 gloo ranks: exact resume, elastic recovery from a killed worker, and
resharding W=2 -> W=1 and W=1 -> W=2 (another plan) by the manifest's offsets."""

from pathlib import Path

import pytest
import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from recscale.config import parse
from recscale.distributed import WorkerFailedError
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.sharding import Topology, plan_sharding
from recscale.sharding.from_data import table_specs_from_manifest as table_specs
from recscale.train import train_dlrm
from recscale.train.checkpoint import list_checkpoints, read_manifest
from tests.distributed.workers import mixed_plan

pytestmark = pytest.mark.dist

SMALL = {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}
STEPS = 10


def _plan(manifest, world, mixed=False):
    if mixed:  # 2 ranks, every kind of piece
        return mixed_plan(manifest, ["row_wise", "column_wise", "data_parallel", "table_wise",
                                     "table_row_wise", "table_column_wise"], 1000)
    return plan_sharding(table_specs(manifest, 16), Topology.preset("cpu-local", world_size=world),
                         1000)


def _train(manifest, world, ckpt_dir, plan=None, **train):
    ckpt = {"dir": str(ckpt_dir), "every_steps": 3, **train.pop("checkpoint", {})}
    launch = {"world_size": world, "collective_timeout_s": 60, **train.pop("launch", {})}
    tcfg = parse(TrainConfig, {"batch_size_per_rank": 1000, "progress": "off", "log_every": 5,
                               "max_steps": STEPS, "launch": launch, "checkpoint": ckpt,
                               **train}, "train")
    if world > 1 and plan is None:
        plan = _plan(manifest, world)
    return train_dlrm(manifest, parse(ModelConfig, SMALL, "model"), tcfg, plan,
                      str(Path(ckpt_dir) / "out"))


def _same(a, b):
    sa, sb = a.model.state_dict(), b.model.state_dict()
    bad = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not bad, f"differ: {bad}"


@pytest.fixture(scope="module")
def clean(parquet_dataset, tmp_path_factory):
    return _train(parquet_dataset, 2, tmp_path_factory.mktemp("clean"))


def test_stopped_and_resumed_equals_the_uninterrupted_run(parquet_dataset, clean, tmp_path):
    with pytest.raises((WorkerFailedError, ChildFailedError)):  # rank 1 dies at step 8
        _train(parquet_dataset, 2, tmp_path, fault_injection={"rank": 1, "step": 8})
    assert [Path(p).name for p in list_checkpoints(str(tmp_path), all_runs=True)] == [
        "step-00000006", "step-00000003"]
    resumed = _train(parquet_dataset, 2, tmp_path, checkpoint={"resume": "latest"})
    assert resumed.result.extra["resumed"] == 1
    assert resumed.result.samples == clean.result.samples  # no row twice, none skipped
    _same(resumed, clean)


def test_a_killed_worker_is_restarted_by_the_elastic_agent_and_the_run_ends_equal(
        parquet_dataset, clean, tmp_path):
    run = _train(parquet_dataset, 2, tmp_path, launch={"max_restarts": 1},
                 fault_injection={"rank": 1, "step": 8, "kind": "kill"})
    assert run.result.extra["resumed"] == 1  # the restarted group resumed from step 6
    assert run.result.steps == STEPS and run.result.samples == clean.result.samples
    _same(run, clean)


def test_a_two_rank_checkpoint_loads_into_one_process(parquet_dataset, clean, tmp_path):
    ckpt = clean.result.checkpoints[-1]
    assert read_manifest(ckpt)["world_size"] == 2
    one = _train(parquet_dataset, 1, tmp_path, checkpoint={"resume": ckpt})  # no steps left
    assert one.result.extra["resumed"] == 1
    _same(one, clean)


def test_a_one_process_checkpoint_loads_into_two_ranks_under_a_mixed_plan(parquet_dataset, tmp_path):
    one = _train(parquet_dataset, 1, tmp_path / "one", max_steps=4)
    ckpt = one.result.checkpoints[-1]
    two = _train(parquet_dataset, 2, tmp_path / "two", plan=_plan(parquet_dataset, 2, mixed=True),
                 max_steps=4, checkpoint={"resume": ckpt})
    assert two.result.extra["resumed"] == 1
    _same(two, one)
