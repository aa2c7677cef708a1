"""train.dense_optimizer: the large-batch recipe's linear warm-up, the polynomial decay, and Shampoo/SOAP from the
optional extra `second_order` (pytorch-optimizer)."""

import pytest
import torch

from recscale.config import parse
from recscale.runconfig import TrainConfig
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


def test_decay_falls_polynomially_to_zero_after_its_start_and_a_resume_continues_it():
    w, opt = _opt(name="adam", learning_rate=0.01, warmup_steps=2, decay_start_step=2,
                  decay_steps=4, decay_power=2.0)
    rates = []
    for i in range(8):
        w.grad = torch.ones(3)
        dense_step(opt)
        rates.append(opt.param_groups[0]["lr"])
        if i == 3:  # a resume: a fresh optimizer from the state dict carries on the schedule
            state = opt.state_dict()
            w2, opt = _opt(name="adam", learning_rate=0.01, warmup_steps=2, decay_start_step=2,
                           decay_steps=4, decay_power=2.0)
            opt.load_state_dict(state)
            w2.data.copy_(w.data)
            w = w2
    assert rates == pytest.approx([0.005, 0.01, 0.01, 0.01 * 0.75 ** 2, 0.01 * 0.5 ** 2,
                                   0.01 * 0.25 ** 2, 0.0, 0.0])
    _, no_warmup = _opt(name="sgd", learning_rate=0.1, decay_steps=2, decay_power=1.0)
    w3 = no_warmup.param_groups[0]["params"][0]
    got = []
    for _ in range(3):
        w3.grad = torch.ones(3)
        dense_step(no_warmup)
        got.append(no_warmup.param_groups[0]["lr"])
    assert got == pytest.approx([0.1, 0.05, 0.0])


def test_decay_settings_are_checked_by_name():
    from recscale.config import ConfigError

    with pytest.raises(ConfigError, match="train.dense_optimizer.decay_steps"):
        _opt(name="adam", decay_steps=-1)
    with pytest.raises(ConfigError, match="train.dense_optimizer.decay_power"):
        _opt(name="adam", decay_steps=3, decay_power=0.0)


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

    from recscale.hf.config import BaselinesConfig, FitConfig, NetConfig
    from recscale.hf.fit import fit_baseline

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    data = {"x_train": x, "y_train": y, "x_validation": x[:16], "y_validation": y[:16]}
    bl = parse(BaselinesConfig, {"optimizers": ["soap"], "soap": {"learning_rate": 0.03}},
               "baselines")
    fit = parse(FitConfig, {"global_batch_size": 16, "epochs": 20, "progress": "off"}, "train")
    r = fit_baseline(data, NetConfig(hidden=(8,)), "soap", bl, fit)
    assert r.summary["best_val_error"] < 0.25  # the sign of x[:, 0], learned
