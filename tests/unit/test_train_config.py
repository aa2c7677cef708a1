"""The one configuration story: configs validate on construction, renamed keys name their new
place, and training refuses a sharding plan made for another batch, world size or precision."""

import dataclasses

import pytest

from recscale.comm import CommsConfig
from recscale.config import ConfigError, parse
from recscale.runconfig import DLRMConfig, TrainConfig, plan_for_run
from recscale.sharding import PlanMismatchError
from recscale.train import train_dlrm

SMALL = {"model": {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]},
         "train": {"batch_size_per_rank": 512, "progress": "off", "max_steps": 2,
                   "checkpoint": {"dir": None}}}


@pytest.mark.parametrize("build, match", [
    (lambda: TrainConfig(batch_size_per_rank=0), r"train\.batch_size_per_rank=0 is not allowed"),
    (lambda: dataclasses.replace(TrainConfig(), epochs=0), r"train\.epochs=0"),
    (lambda: parse(TrainConfig, {"checkpoint": {"keep_last": 0}}, "train"),
     r"train\.checkpoint\.keep_last=0"),
    (lambda: parse(DLRMConfig, {"train": {"launch": {"nnodes": 3, "world_size": 4}}}, ""),
     r"train\.launch\.nnodes=3 is not allowed: expected a divisor of train\.launch\.world_size=4"),
    (lambda: parse(DLRMConfig, {"evaluate": {"split": "dev"}}, ""), r"evaluate\.split='dev'"),
    (lambda: parse(DLRMConfig, {"comms": {"dense_allreduce": "int8"}}, ""),
     r"comms\.dense_allreduce='int8'"),
])
def test_configs_validate_on_construction_naming_the_full_key(build, match):
    with pytest.raises(ConfigError, match=match):
        build()


@pytest.mark.parametrize("old, new", [
    ({"batch_size": 512}, "train.batch_size is not allowed: it is now train.batch_size_per_rank"),
    ({"world_size": 2}, "train.world_size is not allowed: it is now train.launch.world_size"),
    ({"eval_batch_size": 8}, "train.eval_batch_size is not allowed: it is now evaluate.batch_size"),
    ({"comms": {"forward": "fp16"}}, "train.comms is not allowed: it is now comms"),
    ({"tiers": {"cache_load_factor": 0.2}},
     "train.tiers.cache_load_factor is not allowed: it is now train.tiers.cache_fraction"),
])
def test_a_renamed_key_names_its_new_place(old, new):
    with pytest.raises(ConfigError, match=new.replace(".", r"\.")):
        parse(DLRMConfig, {"train": old}, "")


def test_a_plan_made_for_another_run_is_refused_naming_the_field(parquet_dataset):
    cfg = parse(DLRMConfig, SMALL, "")
    plan = plan_for_run(parquet_dataset, cfg)
    assert plan.batch_size_per_rank == 512 and plan.world_size == 1
    with pytest.raises(PlanMismatchError, match=r"batch_size_per_rank=512 but "
                                                r"train\.batch_size_per_rank=256"):
        train_dlrm(parquet_dataset, cfg.model,
                   dataclasses.replace(cfg.train, batch_size_per_rank=256), plan)
    two = dataclasses.replace(cfg.train, launch=dataclasses.replace(cfg.train.launch, world_size=2))
    with pytest.raises(PlanMismatchError, match=r"world_size=1 but train\.launch\.world_size=2"):
        train_dlrm(parquet_dataset, cfg.model, two, plan)
    plan2 = plan_for_run(parquet_dataset, dataclasses.replace(cfg, train=two))
    with pytest.raises(PlanMismatchError, match=r"comms\.forward"):
        train_dlrm(parquet_dataset, cfg.model, two, plan2, comms=CommsConfig(forward="fp16"))
