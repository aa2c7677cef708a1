"""One optimisation step, pluggable into the training loop.

``TrainStep`` is the one-process step (mean BCE over the batch). ``ShardedStep`` is one rank's step
of the sharded runtime: its loss is W x (its share of the global-mean BCE), which with DDP's
averaging and the embeddings' 1/W gradient scale gives exactly the gradients of the single-process
mean loss over the global batch. Both return (sum of this rank's per-row losses, rows of the
global batch), which is what the loop's log points reduce.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from recscale.data.batch import Batch
from recscale.embedding import optimizer_config_of, set_learning_rate
from recscale.model.dlrm import DLRM
from recscale.runconfig import DenseOptimizerConfig


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; the message names the step and the batch's rows."""


def make_dense_optimizer(params, cfg: DenseOptimizerConfig,
                         reduce=None) -> torch.optim.Optimizer:
    """The dense arch's optimizer. ``reduce`` (Hessian-free in the sharded runtime): sums a
    tensor over ranks, for the gradient, every curvature product and every loss evaluation."""
    params = list(params)
    if cfg.name == "hessian_free":
        from recscale.optim import HessianFree

        return HessianFree(params, cfg.hf, reduce=reduce)
    if cfg.name == "sgd":
        opt = torch.optim.SGD(params, lr=cfg.learning_rate, momentum=cfg.momentum,
                              weight_decay=cfg.weight_decay, foreach=True)
    elif cfg.name == "adagrad":
        opt = torch.optim.Adagrad(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                                  foreach=True)
    elif cfg.name == "adam":
        opt = torch.optim.Adam(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                               foreach=True)
    else:  # shampoo, soap: the optional extra `second_order`
        opt = _second_order(params, cfg)
    if cfg.warmup_steps or cfg.decay_steps:  # kept in the param group: a checkpoint carries it
        for group in opt.param_groups:
            group["base_lr"], group["warmup_steps"], group["warmup_done"] = (
                cfg.learning_rate, cfg.warmup_steps, 0)
            if cfg.decay_steps:
                group["decay_start_step"], group["decay_steps"], group["decay_power"] = (
                    cfg.decay_start_step, cfg.decay_steps, cfg.decay_power)
                group["schedule"], group["decay_gamma"] = cfg.schedule, cfg.decay_gamma
    return opt


def _second_order(params, cfg: DenseOptimizerConfig) -> torch.optim.Optimizer:
    try:
        import pytorch_optimizer
    except ImportError:
        from recscale.config import ConfigError

        raise ConfigError(f"train.dense_optimizer.name={cfg.name!r} needs pytorch-optimizer: "
                          "pip install 'recscale[second_order]'") from None
    if cfg.name == "shampoo":
        return pytorch_optimizer.Shampoo(params, lr=cfg.learning_rate, momentum=cfg.momentum,
                                         weight_decay=cfg.weight_decay)
    return pytorch_optimizer.SOAP(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)


def scheduled_rate(base_lr: float, step: int, *, warmup_steps: int = 0,
                   schedule: str = "polynomial", decay_start_step: int = 0,
                   decay_steps: int = 0, decay_power: float = 2.0,
                   decay_gamma: float = 0.1) -> float:
    """The learning rate of step ``step`` (1 for the first) under a schedule (the keys of
    ``train.dense_optimizer`` and ``train.embedding_optimizer``): ``base_lr * step /
    warmup_steps`` during the warm-up, then, ``t`` steps after ``decay_start_step`` (t = 0 at
    step decay_start_step + 1), times ``(1 - t / decay_steps) ** decay_power`` (polynomial),
    ``1 - t / decay_steps`` (linear), ``(1 + cos(pi t / decay_steps)) / 2`` (cosine; these three
    reach 0 at t = decay_steps and stay there) or ``decay_gamma ** (t // decay_steps)`` (step);
    ``constant`` or ``decay_steps`` 0: no decay."""
    rate = base_lr * (min(1.0, step / warmup_steps) if warmup_steps else 1.0)
    since = step - 1 - decay_start_step  # steps since the decay began
    if not decay_steps or since < 0 or schedule == "constant":
        return rate
    frac = min(1.0, since / decay_steps)
    if schedule == "polynomial":
        return rate * (1.0 - frac) ** decay_power
    if schedule == "linear":
        return rate * (1.0 - frac)
    if schedule == "cosine":
        return rate * 0.5 * (1.0 + math.cos(math.pi * frac))
    if schedule == "step":
        return rate * decay_gamma ** (since // decay_steps)
    raise ValueError(f"unknown learning-rate schedule {schedule!r}")


def dense_step(opt: torch.optim.Optimizer) -> None:
    """``opt.step()`` after the schedule (``train.dense_optimizer``: warm-up, then decay; see
    ``scheduled_rate``) set its rate; ``warmup_done`` counts the steps taken under it."""
    for group in opt.param_groups:
        n, d = group.get("warmup_steps", 0), group.get("decay_steps", 0)
        if n or d:
            group["warmup_done"] = done = group["warmup_done"] + 1
            group["lr"] = scheduled_rate(
                group["base_lr"], done, warmup_steps=n,
                schedule=group.get("schedule", "polynomial"),
                decay_start_step=group.get("decay_start_step", 0), decay_steps=d,
                decay_power=group.get("decay_power", 2.0),
                decay_gamma=group.get("decay_gamma", 0.1))
    opt.step()


class EmbeddingSchedule:
    """Sets the embedding optimizer's rate before each step's backward (where fbgemm's fused
    update runs), as ``train.embedding_optimizer``'s schedule says for that step. The count of
    steps taken is kept in the dense optimizer's first param group (``embedding_step``), which
    checkpoints save and a resume restores, so a resumed run goes on at the right rate. Does
    nothing when the embedding rate is constant."""

    KEY = "embedding_step"

    def __init__(self, model: DLRM, opt: torch.optim.Optimizer):
        self.embeddings, self.opt = model.embeddings, opt
        cfg = optimizer_config_of(model.embeddings)
        self.cfg = cfg if cfg is not None and cfg.scheduled else None
        if self.cfg is not None:
            opt.param_groups[0].setdefault(self.KEY, 0)

    def before_backward(self) -> None:
        """Set the rate of the step about to be taken (call before the backward)."""
        if self.cfg is None:
            return
        c = self.cfg
        step = int(self.opt.param_groups[0].get(self.KEY, 0)) + 1
        set_learning_rate(self.embeddings, scheduled_rate(
            c.learning_rate, step, warmup_steps=c.warmup_steps, schedule=c.schedule,
            decay_start_step=c.decay_start_step, decay_steps=c.decay_steps,
            decay_power=c.decay_power, decay_gamma=c.decay_gamma))

    def after_step(self) -> None:
        if self.cfg is not None:
            group = self.opt.param_groups[0]
            group[self.KEY] = int(group.get(self.KEY, 0)) + 1


class DropoutSeed:
    """Dropout's masks drawn from (``train.seed``, rank, step) alone: the global generator is
    seeded before each step's forward, so a run draws the same masks whatever ran before it in
    the process (a tuner's earlier trials, a notebook) and a resumed run the masks of an
    uninterrupted one. The step count rides in the dense optimizer's first param group
    (``dropout_step``), which checkpoints save. Does nothing when the model has no dropout."""

    KEY = "dropout_step"

    def __init__(self, model: DLRM, opt: torch.optim.Optimizer, seed: int, rank: int):
        self.opt, self.on = opt, model.cfg.dropout.any
        self.base = (int(seed) * 1_000_003 + int(rank)) * 1_000_033

    def before_forward(self) -> None:
        if not self.on:
            return
        group = self.opt.param_groups[0]
        step = int(group.get(self.KEY, 0))
        group[self.KEY] = step + 1
        torch.manual_seed((self.base + step) % (2**63))


class TrainStep:
    """One process: forward, mean BCE, backward (embeddings update in place), dense step."""

    def __init__(self, model: DLRM, dense_optimizer: torch.optim.Optimizer, seed: int = 0):
        self.model = model
        self.opt = dense_optimizer
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.embedding_schedule = EmbeddingSchedule(model, dense_optimizer)
        self.dropout_seed = DropoutSeed(model, dense_optimizer, seed, 0)

    def __call__(self, batch: Batch, started=None) -> torch.Tensor:
        self.embedding_schedule.before_backward()
        self.dropout_seed.before_forward()
        logits = self.model(batch.dense, started if started is not None else batch.sparse)
        loss = self.loss_fn(logits, batch.labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        dense_step(self.opt)
        self.embedding_schedule.after_step()
        return loss.detach()

    def run(self, batch: Batch, started=None) -> tuple[float, int]:
        """-> (loss summed over the batch's rows, rows): the loop's view of a step."""
        n = batch.batch_size
        return float(self(batch, started)) * n, n


class ShardedStep:
    """One rank's part of a global-batch step (see the module docstring)."""

    def __init__(self, model: DLRM, opt: torch.optim.Optimizer, world_size: int, seed: int = 0,
                 rank: int = 0):
        self.model, self.opt, self.world_size = model, opt, world_size
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
        self.embedding_schedule = EmbeddingSchedule(model, opt)
        self.dropout_seed = DropoutSeed(model, opt, seed, rank)

    def __call__(self, batch: Batch, started=None) -> tuple[float, int]:
        """``started``: the batch's input distribution, if already started (pipelining)."""
        self.embedding_schedule.before_backward()
        self.dropout_seed.before_forward()
        logits = self.model(batch.dense, started if started is not None else batch.sparse)
        global_batch = sum(self.model.embeddings.last_batch_sizes)
        loss_sum = self.loss_fn(logits, batch.labels)
        self.opt.zero_grad(set_to_none=True)
        (loss_sum * (self.world_size / global_batch)).backward()
        dense_step(self.opt)
        self.embedding_schedule.after_step()
        return float(loss_sum.detach()), global_batch

    run = __call__
