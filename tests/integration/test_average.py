"""train.average: the run hands back an exponential average of its weights. It is the fp64
reference average of every step's tables and dense weights (normalised, each table row from the
first step that changed it, again from a reinit epoch's reset), training itself is unchanged by it, validation scores it, early stopping keeps
the best step's average bitwise (from a checkpoint and from memory), a checkpoint carries it (a
resume goes on bitwise; a 2-rank checkpoint loads on one process), and tiered tables are refused.
That 2 ranks average as one process does: tests/distributed/test_regularisation_dist.py."""


import pytest
import torch

import recscale.train.loop as loop
from recscale.config import ConfigError, parse
from recscale.evaluate.metrics import auc_score
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.scoring import score_split
from recscale.train import train_dlrm
from recscale.train.step import TrainStep

SMALL = {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}
STEPS = 38  # one epoch: 56,000 train rows / 1,500
DECAY = 0.9


def _cfg(**train):
    base = {"batch_size_per_rank": 1500, "progress": "off", "log_every": 5, "seed": 3,
            "unknown_ids": {"fill": False}, "average": {"decay": DECAY},
            "embedding_optimizer": {"name": "exact_rowwise_adagrad", "learning_rate": 0.2}}
    base.update(train)
    return parse(TrainConfig, base, "train")


def _train(manifest, plan=None, **train):
    return train_dlrm(manifest, parse(ModelConfig, SMALL, "model"), _cfg(**train), plan=plan)


def _weights(model) -> list[torch.Tensor]:
    return ([w.detach().clone() for w in model.embeddings.split_weights()]
            + [p.detach().clone() for p in model.dense.parameters()])


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    bad = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not bad, f"differ: {bad}"


@pytest.fixture
def steps(monkeypatch):
    """Every step's weights right after it, and the steps after which the tables were reset."""
    seen: dict[str, list] = {"weights": [], "resets": []}
    run, reset = TrainStep.run, loop.reset_tables

    def recording(self, batch, started=None):
        out = run(self, batch, started)
        seen["weights"].append(_weights(self.model))
        return out

    def resetting(emb, seed, epoch=None):
        seen["resets"].append(len(seen["weights"]))
        return reset(emb, seed, epoch)

    monkeypatch.setattr(TrainStep, "run", recording)
    monkeypatch.setattr(loop, "reset_tables", resetting)
    return seen


@pytest.mark.parametrize("optimizer", ["exact_rowwise_adagrad", "exact_adagrad", "exact_sgd"])
def test_the_model_is_the_reference_average_of_every_steps_weights(parquet_dataset, steps,
                                                                   optimizer):
    # into epoch 2 with the tables reset: the tables' average restarts there, the dense goes on;
    # a row's first change read from a row-wise, an element-wise or no optimizer state
    out = _train(parquet_dataset, epochs=2, reinit_embeddings=True, max_steps=STEPS + 4,
                 embedding_optimizer={"name": optimizer, "learning_rate": 0.2})
    assert steps["resets"] == [STEPS] and len(steps["weights"]) == STEPS + 4
    n_tables = len(out.model.embeddings.split_weights())
    fresh = _weights(_fresh(parquet_dataset))  # before step 1, and what the reset restores
    ws = steps["weights"]
    avg, late = [], 0
    for i in range(len(fresh)):
        # the reference, in fp64: each row (a dense parameter as a whole) averages the steps
        # from the first that changed it (a table's: since the reset), weighted DECAY ** age
        xs = torch.stack([w[i] for w in ws]).double()
        before = torch.cat([fresh[i].double().unsqueeze(0), xs[:-1]])
        if i < n_tables:
            before[STEPS] = fresh[i].double()  # the reset
            changed = (xs != before).flatten(2).any(2)[STEPS:]  # [steps since the reset, rows]
            begin = torch.where(changed.any(0), changed.float().argmax(0) + STEPS, len(ws))
            late += int(((begin > STEPS) & (begin < len(ws))).sum())
        else:
            begin = torch.zeros(1, dtype=torch.long)
        age = torch.arange(len(ws) - 1, -1, -1, dtype=torch.float64)
        k = torch.arange(len(ws))
        wt = (DECAY ** age).unsqueeze(1) * (k.unsqueeze(1) >= begin.unsqueeze(0))  # [steps, rows]
        ref = torch.einsum("kr,kr...->r...", wt / wt.sum(0).clamp_min(1e-300),
                           xs.reshape(len(ws), begin.numel(), -1)).reshape(xs.shape[1:])
        never = (begin == len(ws)).reshape(-1, *([1] * (xs.dim() - 2)))
        avg.append(torch.where(never, xs[-1], ref))
    assert late > 100  # rows first changed after the epoch's first step: their own window
    got = _weights(out.model)
    for i, (g, a) in enumerate(zip(got, avg, strict=True)):
        torch.testing.assert_close(g.double(), a, rtol=0, atol=2e-6, msg=f"tensor {i}")
    # and it is not the last step's weights: training went on from those
    assert not torch.equal(got[0], steps["weights"][-1][0])


def _fresh(manifest):
    from recscale.runconfig import recipe_for

    return recipe_for(manifest, parse(ModelConfig, SMALL, "model"), _cfg()).build()


def test_training_goes_on_from_the_weights_unchanged_by_the_average(parquet_dataset, steps):
    _train(parquet_dataset, max_steps=8, validation={"enabled": True, "every_steps": 3})
    averaged = list(steps["weights"])
    steps["weights"].clear()
    plain = _train(parquet_dataset, max_steps=8, average={"decay": None})
    assert len(averaged) == len(steps["weights"]) == 8
    for a, b in zip(averaged, steps["weights"], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    _same(plain.model, _train(parquet_dataset, max_steps=8, average={"decay": None}).model)


def test_validation_scores_the_average(parquet_dataset):
    val = {"enabled": True, "every_steps": 3, "batch_size": 1024}
    out = _train(parquet_dataset, max_steps=9, validation=val)
    cut = _train(parquet_dataset, max_steps=6)  # the average at step 6, validating nothing
    points = {p["step"]: p["value"] for p in out.result.history["validation.auc"]}
    assert sorted(points) == [3, 6, 9]
    for step, model in ((6, cut.model), (9, out.model)):
        s = score_split(model, parquet_dataset, "validation", 4096)
        assert points[step] == pytest.approx(auc_score(s.labels, s.probs), abs=1e-6), step


STOP = {"validation": {"enabled": True, "per_epoch": 4},
        "early_stopping": {"enabled": True, "metric": "auc", "patience": 2},
        "embedding_optimizer": {"name": "exact_rowwise_adagrad", "learning_rate": 0.3},
        "dense_optimizer": {"name": "adam", "learning_rate": 0.01}, "epochs": 6}


def test_early_stopping_keeps_the_best_steps_average_bitwise(parquet_dataset, tmp_path):
    ckpt = {"dir": str(tmp_path), "every_steps": 10, "keep_last": 1}
    out = _train(parquet_dataset, checkpoint=ckpt, **STOP)
    ex = out.result.extra
    assert ex["restored_best"] == 1 and ex["best_step"] < ex["stopped_early_at"]
    # the same run cut at the best step, validating nothing: the same average, bitwise
    ref = _train(parquet_dataset, **{**STOP, "validation": {"enabled": False},
                                     "early_stopping": {"enabled": False}},
                 max_steps=ex["best_step"])
    _same(out.model, ref.model)
    # without checkpoints, kept in memory: the same
    mem = _train(parquet_dataset, **STOP)
    assert mem.result.extra["best_step"] == ex["best_step"]
    _same(mem.model, out.model)


def test_a_resumed_run_goes_on_with_the_saved_average_bitwise(parquet_dataset, tmp_path):
    whole = _train(parquet_dataset, epochs=2, reinit_embeddings=True)
    ckpt = {"dir": str(tmp_path), "every_steps": 10, "keep_last": 1}
    _train(parquet_dataset, epochs=2, reinit_embeddings=True, checkpoint=ckpt,
           max_steps=STEPS + 12)  # stops in epoch 2, after its reset
    resumed = _train(parquet_dataset, epochs=2, reinit_embeddings=True,
                     checkpoint={**ckpt, "resume": "latest"})
    assert resumed.result.extra["resumed"] == 1
    _same(resumed.model, whole.model)


def test_a_two_rank_checkpoint_carries_its_average_to_one_process(parquet_dataset, tmp_path):
    from tests.distributed.workers import mixed_plan

    plan = mixed_plan(parquet_dataset, ["row_wise", "column_wise", "data_parallel", "table_wise"],
                      750)  # every kind of piece
    ckpt = {"dir": str(tmp_path), "every_steps": 3, "keep_last": 1}
    two = _train(parquet_dataset, plan, batch_size_per_rank=750, max_steps=3, checkpoint=ckpt,
                 launch={"world_size": 2, "collective_timeout_s": 60})
    # one process resumes it with nothing left to train: the model is the checkpoint's average
    one = _train(parquet_dataset, batch_size_per_rank=1500, max_steps=3,
                 checkpoint={**ckpt, "resume": two.result.checkpoints[-1]})
    assert one.result.extra["resumed"] == 1
    _same(one.model, two.model)
    # (that 2 ranks average as one process does: tests/distributed/test_regularisation_dist.py)


def test_auto_decay_is_the_number_of_an_eighth_of_the_epoch_and_is_reported(parquet_dataset):
    from recscale.train.average import auto_decay

    # 20 of the epoch's 38 steps: a horizon of max(2, 20 / 8) steps, 0.6
    auto = _train(parquet_dataset, max_steps=20, average={"decay": "auto"})
    assert auto.result.extra["average_decay"] == pytest.approx(0.6) == auto_decay(STEPS, 20)
    _same(auto.model, _train(parquet_dataset, max_steps=20, average={"decay": 0.6}).model)
    other = _train(parquet_dataset, max_steps=20, average={"decay": 0.9})
    assert other.result.extra["average_decay"] == 0.9
    assert not all(torch.equal(a, b) for a, b in zip(_weights(auto.model), _weights(other.model),
                                                     strict=True))


def test_tables_on_a_slow_tier_and_a_bad_decay_are_refused_naming_the_key(parquet_dataset,
                                                                          tmp_path):
    from recscale.runconfig import DLRMConfig, plan_for_run

    tiers = {"ram_budget_bytes": 2_000_000, "scratch_dir": str(tmp_path), "min_cache_rows": 256}
    train_d = {"batch_size_per_rank": 256, "max_steps": 2, "progress": "off",
               "average": {"decay": 0.99}, "tiers": tiers}
    plan = plan_for_run(parquet_dataset, parse(DLRMConfig, {
        "sharding": {"topology": "cpu-local"}, "model": SMALL, "train": train_d}, "")).to_dict()
    with pytest.raises(ValueError, match=r"train\.average\.decay=0\.99 .*ssd tier"):
        train_dlrm(parquet_dataset, parse(ModelConfig, SMALL, "model"),
                   parse(TrainConfig, train_d, "train"), plan)
    with pytest.raises(ConfigError, match=r"train\.average\.decay=1\.0 .*\(0, 0\.9999\]"):
        _cfg(average={"decay": 1.0})
