"""Every rank trains rank 0's sharding plan: a job's ranks replan each on its own when hosts come
and go, and hosts of different CPUs can round the planner's costs otherwise (numpy's AVX-512 and
AVX2 kernels differ in the last bit). 2 ranks on gloo, rank 1 handed another plan of the same
tables: the run ends bitwise equal to the run where both ranks hold rank 0's."""

import json
from pathlib import Path

import pytest
import torch

import recscale.train.entry as entry
from recscale.config import parse
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.sharding import Topology, plan_sharding
from recscale.sharding.from_data import table_specs_from_manifest as table_specs
from recscale.train import train_dlrm
from tests.distributed.workers import plan_diverging_train_worker

pytestmark = pytest.mark.dist

SMALL = {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}
BATCH = 250


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from recscale.data.preprocess import PreprocessConfig, load_manifest, preprocess_criteo
    from recscale.data.synthetic import SyntheticConfig, generate_criteo_tsv

    d = tmp_path_factory.mktemp("agree-data")
    rep = generate_criteo_tsv(SyntheticConfig(num_rows=5_000, seed=11, cardinality_scale=0.0005,
                                              keep_cardinality_below=200), d / "day_00.tsv")
    preprocess_criteo([rep.path], d / "parquet", PreprocessConfig(row_group_size=1000),
                      rep.cardinalities)
    return load_manifest(d / "parquet")


def _plan(manifest, strategy):
    return plan_sharding(table_specs(manifest, 16),
                         Topology.preset("cpu-local", world_size=2, local_world_size=2), BATCH,
                         {"strategy": strategy})


def _train(manifest, plan, out: Path):
    tcfg = parse(TrainConfig, {"batch_size_per_rank": BATCH, "progress": "off", "epochs": 1,
                               "max_steps": 6, "seed": 5, "checkpoint": {"dir": None},
                               "validation": {"enabled": False},
                               "launch": {"world_size": 2, "collective_timeout_s": 60}}, "train")
    return train_dlrm(manifest, parse(ModelConfig, SMALL, "model"), tcfg, plan, str(out))


def test_a_rank_handed_another_plan_trains_rank_0s_and_the_run_is_unchanged(dataset, tmp_path,
                                                                            monkeypatch):
    ours, other = _plan(dataset, "balanced"), _plan(dataset, "round_robin")
    place = lambda p: sorted((t.name, s.rank, s.row_offset, s.col_offset)  # noqa: E731
                             for t in p.tables for s in t.shards)
    assert place(ours) != place(other)  # the two plans put tables on other ranks
    same = _train(dataset, ours, tmp_path / "same")
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "other_plan.json").write_text(json.dumps(other.to_dict()))
    monkeypatch.setattr(entry, "sharded_train_worker", plan_diverging_train_worker)
    mixed = _train(dataset, ours, tmp_path / "mixed")
    sa, sb = same.model.state_dict(), mixed.model.state_dict()
    assert [k for k in sa if not torch.equal(sa[k], sb[k])] == []
    assert mixed.result.steps == same.result.steps == 6
