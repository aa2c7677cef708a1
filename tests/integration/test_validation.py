"""Validation while training and early stopping: the validation metrics equal scoring the model
on the split (one process and 2 ranks), early stopping stops and hands back the best step's model
bitwise (from its checkpoint, or from memory without checkpoints), and a resumed run goes on with
the same early-stopping state."""


import pytest
import torch

from recscale.config import ConfigError, parse
from recscale.evaluate.metrics import auc_score, log_loss
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.scoring import score_split
from recscale.train import train_dlrm
from tests.distributed.workers import mixed_plan

SMALL = {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}
# a rate high enough that the small train split is overfitted within a few epochs
STOP = {"validation": {"enabled": True, "per_epoch": 4},
        "early_stopping": {"enabled": True, "metric": "auc", "patience": 2},
        "embedding_optimizer": {"name": "exact_rowwise_adagrad", "learning_rate": 0.3},
        "dense_optimizer": {"name": "adam", "learning_rate": 0.01}, "epochs": 6}


def _cfg(**train):
    base = {"batch_size_per_rank": 1500, "progress": "off", "log_every": 5,
            "embedding_optimizer": {"name": "exact_rowwise_adagrad"}}
    base.update(train)
    return parse(TrainConfig, base, "train")


def _train(manifest, plan=None, **train):
    return train_dlrm(manifest, parse(ModelConfig, SMALL, "model"), _cfg(**train), plan=plan)


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    bad = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not bad, f"differ: {bad}"


def _last(history, name):
    return history[f"validation.{name}"][-1]


def test_validation_points_score_the_split_as_evaluation_does(parquet_dataset):
    # (train.unknown_ids.fill changes the model after its last validation point: off here)
    out = _train(parquet_dataset, max_steps=9, unknown_ids={"fill": False},
                 validation={"enabled": True, "per_epoch": 2, "batch_size": 1024})
    h = out.result.history
    # per_epoch 2 of a 38-step epoch: step 19, and the end of training (max_steps 9 cut it first)
    assert [p["step"] for p in h["validation.auc"]] == [9]
    s = score_split(out.model, parquet_dataset, "validation", 4096)
    assert _last(h, "auc")["value"] == pytest.approx(auc_score(s.labels, s.probs), abs=1e-6)
    assert _last(h, "log_loss")["value"] == pytest.approx(log_loss(s.labels, s.probs), abs=1e-6)
    assert out.result.extra["validation_points"] == 1
    assert out.result.extra["best_step"] == 9  # validation alone keeps the last step's model


def test_two_ranks_validate_with_the_same_numbers_as_scoring_the_gathered_model(parquet_dataset):
    plan = mixed_plan(parquet_dataset, ["row_wise", "column_wise", "data_parallel", "table_wise"],
                      750)  # every kind of piece
    out = train_dlrm(parquet_dataset, parse(ModelConfig, SMALL, "model"),
                     _cfg(batch_size_per_rank=750, max_steps=6, launch={"world_size": 2},
                          validation={"enabled": True, "batch_size": 1000},
                          unknown_ids={"fill": False}), plan=plan)
    s = score_split(out.model, parquet_dataset, "validation", 4096)
    h = out.result.history
    assert _last(h, "auc")["step"] == 6
    assert _last(h, "auc")["value"] == pytest.approx(auc_score(s.labels, s.probs), abs=1e-6)
    assert _last(h, "log_loss")["value"] == pytest.approx(log_loss(s.labels, s.probs), abs=1e-6)


@pytest.fixture(scope="module")
def stopped(parquet_dataset, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("stop")
    return _train(parquet_dataset, checkpoint={"dir": str(ckpt), "every_steps": 10,
                                               "keep_last": 1}, **STOP), ckpt


def test_early_stopping_stops_and_returns_the_best_steps_model_bitwise(parquet_dataset, stopped):
    out, _ = stopped
    ex = out.result.extra
    steps_per_epoch = 38  # 56,000 train rows / 1,500
    assert ex["stopped_early_at"] and ex["stopped_early_at"] < 6 * steps_per_epoch
    assert ex["restored_best"] == 1 and ex["best_step"] < ex["stopped_early_at"]
    auc = out.result.history["validation.auc"]
    best = max(auc, key=lambda p: p["value"])
    assert best["step"] == ex["best_step"]
    # the points after the best did not improve on it, `patience` of them
    assert [p["step"] for p in auc][-2:][0] > best["step"] and auc[-1]["step"] == ex["stopped_early_at"]
    # the same run cut at the best step, validating nothing: bitwise the same model
    ref = _train(parquet_dataset, **{**STOP, "validation": {"enabled": False},
                                     "early_stopping": {"enabled": False}},
                 max_steps=ex["best_step"])
    _same(out.model, ref.model)
    # and the row count is the steps' rows, not the epochs'
    assert out.result.samples == min(ex["stopped_early_at"] * 1500,
                                     (ex["stopped_early_at"] // steps_per_epoch) * 56_000
                                     + (ex["stopped_early_at"] % steps_per_epoch) * 1500)


def test_without_checkpoints_the_best_step_is_kept_in_memory(parquet_dataset, stopped):
    out, _ = stopped
    mem = _train(parquet_dataset, **STOP)
    assert mem.result.extra["best_step"] == out.result.extra["best_step"]
    assert mem.result.extra["restored_best"] == 1
    _same(mem.model, out.model)


def test_the_best_checkpoint_is_kept_from_pruning_and_a_resumed_run_goes_on_counting(
        parquet_dataset, stopped, tmp_path):
    out, _ = stopped
    best = out.result.extra["best_step"]
    # stop the run between its best point and the end, then resume it: the same stop, the same
    # best step, the same model (the best checkpoint was kept although keep_last is 1)
    cut = best + 10 - best % 10
    ckpt = {"dir": str(tmp_path), "every_steps": 10, "keep_last": 1}
    _train(parquet_dataset, checkpoint=ckpt, max_steps=cut, **STOP)
    resumed = _train(parquet_dataset, checkpoint={**ckpt, "resume": "latest"}, **STOP)
    assert resumed.result.extra["resumed"] == 1
    assert resumed.result.extra["best_step"] == best
    assert resumed.result.extra["stopped_early_at"] == out.result.extra["stopped_early_at"]
    _same(resumed.model, out.model)


def test_early_stopping_without_validation_is_refused_naming_both_keys():
    with pytest.raises(ConfigError, match=r"train\.early_stopping\.enabled.*train\.validation\.enabled"):
        _cfg(early_stopping={"enabled": True})
    with pytest.raises(ConfigError, match=r"train\.early_stopping\.metric"):
        _cfg(validation={"enabled": True}, early_stopping={"enabled": True, "metric": "ndcg"})


def test_tables_on_ssd_validate_and_restore_the_best_step_as_in_memory(parquet_dataset, tmp_path):
    """The largest tables planned onto SSD behind a cache: validation points (eval forwards
    through the cache) change nothing of training, give the in-memory run's numbers, and early
    stopping restores the best step into the tiered tables as it does in memory."""
    from recscale.runconfig import DLRMConfig, plan_for_run

    tiers = {"ram_budget_bytes": 2_000_000, "scratch_dir": str(tmp_path), "min_cache_rows": 256}
    train_d = {"batch_size_per_rank": 256, "max_steps": 12, "progress": "off", "seed": 2,
               "embedding_optimizer": {"name": "exact_rowwise_adagrad", "learning_rate": 0.5},
               "validation": {"enabled": True, "every_steps": 2, "max_rows": 3000},
               "early_stopping": {"enabled": True, "patience": 3}}
    plan = plan_for_run(parquet_dataset, parse(DLRMConfig, {
        "sharding": {"topology": "cpu-local"}, "model": SMALL, "train": {**train_d, "tiers": tiers}},
        "")).to_dict()
    assert any(t["shards"][0]["tier"] == "ssd" for t in plan["tables"])
    model = parse(ModelConfig, SMALL, "model")
    tiered = train_dlrm(parquet_dataset, model, parse(TrainConfig, {**train_d, "tiers": tiers},
                                                      "train"), plan)
    memory = train_dlrm(parquet_dataset, model, parse(TrainConfig, train_d, "train"), None)
    assert tiered.result.extra["tiers.lookups"] > 0
    assert tiered.result.history["validation.auc"] == memory.result.history["validation.auc"]
    for k in ("best_step", "stopped_early_at", "restored_best"):
        assert tiered.result.extra[k] == memory.result.extra[k], k
    _same(tiered.model, memory.model)
    # and the validation did not perturb training: the run cut at its best step without it
    ref = train_dlrm(parquet_dataset, model, parse(TrainConfig, {
        **train_d, "max_steps": memory.result.extra["best_step"], "validation": {},
        "early_stopping": {}}, "train"), None)
    _same(ref.model, memory.model)
