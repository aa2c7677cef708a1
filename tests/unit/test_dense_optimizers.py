"""train.dense_optimizer: the large-batch recipe's linear warm-up, and Shampoo/SOAP from the
optional extra `second_order` (pytorch-optimizer)."""

import pytest
import torch

from recscale.config import parse
from recscale.train import TrainConfig
from recscale.train.step import dense_step, make_dense_optimizer


def _opt(**dense):
    cfg = parse(TrainConfig, {"dense_optimizer": dense}, "train").dense_optimizer
    w = torch.nn.Parameter(torch.ones(3))
    return w, make_dense_optimizer([w], cfg)


def test_warmup_raises_the_rate_linearly_then_holds_it_and_rides_in_the_state_dict():
    w, opt = _opt(name="adam", learning_rate=0.01, warmup_steps=4)
    rates = []
    for _ in range(6):
        w.grad = torch.ones(3)
        dense_step(opt)
        rates.append(opt.param_groups[0]["lr"])
    assert rates == pytest.approx([0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01])
    assert opt.state_dict()["param_groups"][0]["warmup_done"] == 6
    _, plain = _opt(name="adam", learning_rate=0.01)
    assert "warmup_steps" not in plain.param_groups[0]


@pytest.mark.parametrize("name", ["soap", "shampoo"])
def test_second_order_baselines_come_from_pytorch_optimizer(name):
    pytest.importorskip("pytorch_optimizer")  # the optional extra `second_order`
    w, opt = _opt(name=name, learning_rate=0.01)
    assert type(opt).__module__.startswith("pytorch_optimizer")
    for _ in range(2):  # SOAP's first step only sets up its preconditioner
        w.grad = torch.ones(3)
        dense_step(opt)
    assert bool(torch.all(w < 1))


def test_soap_is_a_baseline_of_the_hf_trainer():
    pytest.importorskip("pytorch_optimizer")
    import numpy as np

    from recscale.optim.trainer import BaselinesConfig, FitConfig, NetConfig, fit_baseline

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    data = {"x_train": x, "y_train": y, "x_validation": x[:16], "y_validation": y[:16]}
    bl = parse(BaselinesConfig, {"optimizers": ["soap"], "soap": {"learning_rate": 0.03}},
               "baselines")
    fit = parse(FitConfig, {"global_batch_size": 16, "epochs": 20, "progress": "off"}, "train")
    r = fit_baseline(data, NetConfig(hidden=(8,)), "soap", bl, fit)
    assert r.summary["best_val_error"] < 0.25  # the sign of x[:, 0], learned
