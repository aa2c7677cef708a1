"""The tuner's study on toy data: seeded trials repeat exactly, the pruner ends a trial's training
at a validation point (one process and 2 ranks), a failing trial is recorded with its reason and
the study goes on, an interrupted study resumes to its count, and two processes share one study."""

import multiprocessing as mp
import time

import optuna
import pytest
import torch

from recscale.config import parse
from recscale.model import ModelConfig
from recscale.runconfig import DLRMConfig, TrainConfig
from recscale.sharding import Topology, plan_sharding
from recscale.sharding.from_data import table_specs_from_manifest as table_specs
from recscale.train import train_dlrm
from recscale.tune import TrialOutcome, TuneConfig, apply, parse_space, run_study, run_trial

SMALL = {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}
PARAMS = {"model": SMALL,
          "train": {"batch_size_per_rank": 2048, "epochs": 1, "progress": "off",
                    "checkpoint": {"dir": None},
                    "validation": {"enabled": True, "per_epoch": 4},
                    "embedding_optimizer": {"name": "exact_rowwise_adagrad"}}}
SPACE = parse_space({"train.embedding_optimizer.learning_rate": {"log_uniform": [0.01, 0.3]},
                     "train.dense_optimizer.learning_rate": {"log_uniform": [0.001, 0.01]}})
S = optuna.trial.TrialState


def _tune(**kw) -> TuneConfig:
    return parse(TuneConfig, {"study": "t", "trials": 4, "startup_trials": 2, **kw}, "tune")


def _trials(study):
    return [(t.number, t.state, t.params, t.value) for t in study.trials]


class PruneAt:
    """An observer that ends training at its ``point``-th validation point (it pickles)."""

    def __init__(self, point: int):
        self.point, self.steps = point, []

    def __call__(self, step, metrics) -> bool:
        assert set(metrics) == {"auc", "log_loss", "calibration"}
        self.steps.append(step)
        return len(self.steps) >= self.point


def test_seeded_studies_draw_and_score_the_same_trials(parquet_dataset, tmp_path):
    def run_one(number, values, observer):
        cfg = parse(DLRMConfig, apply(PARAMS, values), "")
        return run_trial(cfg, parquet_dataset, "auc", observer, test=False)

    a = run_study(_tune(), SPACE, run_one, f"sqlite:///{tmp_path}/a.db", progress="off").study
    b = run_study(_tune(), SPACE, run_one, f"sqlite:///{tmp_path}/b.db", progress="off").study
    assert len(a.trials) == 4 and _trials(a) == _trials(b)  # params, states and values, exactly
    done = [t for t in a.trials if t.state == S.COMPLETE]
    assert done and all(0.5 < t.value < 1 for t in done)
    # every trial reported its validation points to the pruner, one step per point
    assert all(sorted(t.intermediate_values) == list(range(1, len(t.intermediate_values) + 1))
               and t.intermediate_values for t in a.trials)
    other = run_study(_tune(seed=1), SPACE, run_one, f"sqlite:///{tmp_path}/c.db",
                      progress="off").study
    assert [t.params for t in other.trials] != [t.params for t in a.trials]


def test_the_pruner_ends_training_at_a_validation_point(parquet_dataset):
    watch = PruneAt(2)
    out = train_dlrm(parquet_dataset, parse(ModelConfig, SMALL, "model"),
                     parse(TrainConfig, PARAMS["train"], "train"), observer=watch)
    # 56,000 train rows / 2048 = 28 steps; 4 points an epoch: steps 7, 14, 21, 28
    assert watch.steps == [7, 14]
    assert out.result.extra["pruned_at"] == 14 and out.result.steps == 14
    assert out.result.samples == 14 * 2048  # the rows of the steps it took, no more
    assert [p["step"] for p in out.result.history["validation.auc"]] == [7, 14]


def test_two_ranks_stop_together_when_rank_0s_observer_prunes(parquet_dataset):
    plan = plan_sharding(table_specs(parquet_dataset, 16),
                         Topology.preset("cpu-local", world_size=2), 1024)
    train = parse(TrainConfig, {**PARAMS["train"], "batch_size_per_rank": 1024,
                                "launch": {"world_size": 2}}, "train")
    out = train_dlrm(parquet_dataset, parse(ModelConfig, SMALL, "model"), train, plan=plan,
                     observer=PruneAt(1))
    assert out.result.extra["pruned_at"] == 7 and out.result.steps == 7
    assert out.result.samples == 7 * 2048  # both ranks stopped at rank 0's answer


def _fake(fail_at=None, interrupt_at=None, sleep=0.0):
    def run_one(number, values, observer):
        time.sleep(sleep)
        if number == fail_at:
            raise MemoryError("the trial ran out of memory")
        if number == interrupt_at:
            raise KeyboardInterrupt
        lr = values["train.embedding_optimizer.learning_rate"]
        return TrialOutcome(value=1.0 - (lr - 0.1) ** 2, steps=1)
    return run_one


def test_a_failing_trial_is_recorded_with_its_reason_and_the_study_goes_on(tmp_path):
    study = run_study(_tune(), SPACE, _fake(fail_at=1), f"sqlite:///{tmp_path}/s.db",
                      progress="off").study
    assert [t.state for t in study.trials] == [S.COMPLETE, S.FAIL, S.COMPLETE, S.COMPLETE]
    assert study.trials[1].user_attrs["fail_reason"] == "MemoryError: the trial ran out of memory"


def test_an_interrupted_study_resumes_to_its_count(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    with pytest.raises(KeyboardInterrupt):
        run_study(_tune(), SPACE, _fake(interrupt_at=2), storage, progress="off")
    first = optuna.load_study(study_name="t", storage=storage)
    assert [t.state for t in first.trials] == [S.COMPLETE, S.COMPLETE, S.FAIL]
    assert "fail_reason" not in first.trials[2].user_attrs  # interrupted, not failed: redone
    again = run_study(_tune(), SPACE, _fake(), storage, progress="off")
    assert again.ran == 2
    assert [t.state for t in again.study.trials] == [S.COMPLETE, S.COMPLETE, S.FAIL,
                                                     S.COMPLETE, S.COMPLETE]
    assert run_study(_tune(), SPACE, _fake(), storage, progress="off").ran == 0  # done


def _share(storage: str) -> int:
    return run_study(_tune(trials=6), SPACE, _fake(sleep=0.3), storage, progress="off").ran


def test_two_processes_share_one_study(tmp_path):
    storage = f"sqlite:///{tmp_path}/shared.db"
    optuna.create_study(study_name="t", storage=storage, direction="maximize")
    with mp.get_context("spawn").Pool(2) as pool:
        ran = pool.map_async(_share, [storage, storage]).get(timeout=120)
    study = optuna.load_study(study_name="t", storage=storage)
    numbers = [t.number for t in study.trials]
    assert all(r >= 1 for r in ran), ran  # both processes ran trials of the one study
    assert sum(ran) == len(numbers) and sorted(numbers) == list(range(len(numbers)))
    # each stops once the study holds tune.trials; one may have started a trial just before
    assert 6 <= len(numbers) <= 7 and all(t.state == S.COMPLETE for t in study.trials)


def test_dropout_draws_the_same_masks_whatever_ran_before_in_the_process(parquet_dataset):
    """Trials share a process: a trial with dropout must train what a fresh run trains (the
    best trial's env reproduces it), however much of the global generator earlier trials used."""
    model = parse(ModelConfig, {**SMALL, "dropout": {"bottom": 0.2, "top": 0.3}}, "model")
    train = parse(TrainConfig, {**PARAMS["train"], "max_steps": 6}, "train")
    first = train_dlrm(parquet_dataset, model, train).model.state_dict()
    torch.rand(12345)  # what another trial's draws would have left behind
    second = train_dlrm(parquet_dataset, model, train).model.state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)
    other = train_dlrm(parquet_dataset, model, parse(TrainConfig, {**PARAMS["train"], "max_steps": 6,
                                                                    "seed": 1}, "train"))
    assert not all(torch.equal(first[k], v) for k, v in other.model.state_dict().items())


def test_a_pickled_observer_reports_to_its_trial_through_the_storage(tmp_path):
    """What a sharded trial's rank 0 gets: a copy without the trial, which it finds again in the
    storage by the study's name and the trial's number."""
    import pickle

    from recscale.tune import TrialObserver, open_study

    storage = f"sqlite:///{tmp_path}/s.db"
    study = open_study(_tune(), storage)
    study.ask()  # another trial first: the numbers and the ids need not agree
    trial = study.ask()
    copy = pickle.loads(pickle.dumps(TrialObserver(trial, _tune(), storage)))
    assert copy._trial is None
    assert copy(7, {"auc": 0.61, "log_loss": 0.5, "calibration": 1.0}) is False
    assert copy(14, {"auc": 0.65, "log_loss": 0.5, "calibration": 1.0}) is False
    reported = optuna.load_study(study_name="t", storage=storage).trials[1].intermediate_values
    assert reported == {1: 0.61, 2: 0.65}
