"""One optimisation step, pluggable into the training loop.

``TrainStep`` is the one-process step (mean BCE over the batch). ``ShardedStep`` is one rank's step
of the sharded runtime: its loss is W x (its share of the global-mean BCE), which with DDP's
averaging and the embeddings' 1/W gradient scale gives exactly the gradients of the single-process
mean loss over the global batch. Both return (sum of this rank's per-row losses, rows of the
global batch), which is what the loop's log points reduce.
"""

from __future__ import annotations

import torch
from torch import nn

from recscale.data.batch import Batch
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


def dense_step(opt: torch.optim.Optimizer) -> None:
    """``opt.step()`` after the schedule (``train.dense_optimizer``: linear warm-up, polynomial
    decay) set its rate; ``warmup_done`` counts the steps taken under it."""
    for group in opt.param_groups:
        n, d = group.get("warmup_steps", 0), group.get("decay_steps", 0)
        if n or d:
            group["warmup_done"] = done = group["warmup_done"] + 1
            rate = group["base_lr"] * (min(1.0, done / n) if n else 1.0)
            since = done - 1 - group.get("decay_start_step", 0)  # steps since the decay began
            if d and since >= 0:
                rate *= max(0.0, 1.0 - since / d) ** group["decay_power"]
            group["lr"] = rate
    opt.step()


class TrainStep:
    """One process: forward, mean BCE, backward (embeddings update in place), dense step."""

    def __init__(self, model: DLRM, dense_optimizer: torch.optim.Optimizer):
        self.model = model
        self.opt = dense_optimizer
        self.loss_fn = nn.BCEWithLogitsLoss()

    def __call__(self, batch: Batch, started=None) -> torch.Tensor:
        logits = self.model(batch.dense, started if started is not None else batch.sparse)
        loss = self.loss_fn(logits, batch.labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        dense_step(self.opt)
        return loss.detach()

    def run(self, batch: Batch, started=None) -> tuple[float, int]:
        """-> (loss summed over the batch's rows, rows): the loop's view of a step."""
        n = batch.batch_size
        return float(self(batch, started)) * n, n


class ShardedStep:
    """One rank's part of a global-batch step (see the module docstring)."""

    def __init__(self, model: DLRM, opt: torch.optim.Optimizer, world_size: int):
        self.model, self.opt, self.world_size = model, opt, world_size
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="sum")

    def __call__(self, batch: Batch, started=None) -> tuple[float, int]:
        """``started``: the batch's input distribution, if already started (pipelining)."""
        logits = self.model(batch.dense, started if started is not None else batch.sparse)
        global_batch = sum(self.model.embeddings.last_batch_sizes)
        loss_sum = self.loss_fn(logits, batch.labels)
        self.opt.zero_grad(set_to_none=True)
        (loss_sum * (self.world_size / global_batch)).backward()
        dense_step(self.opt)
        return float(loss_sum.detach()), global_batch

    run = __call__
