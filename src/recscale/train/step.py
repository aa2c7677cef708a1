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
from recscale.train.config import DenseOptimizerConfig


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; the message names the step and the batch's rows."""


def make_dense_optimizer(params, cfg: DenseOptimizerConfig) -> torch.optim.Optimizer:
    params = list(params)
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.learning_rate, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay, foreach=True)
    if cfg.name == "adagrad":
        return torch.optim.Adagrad(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                                   foreach=True)
    return torch.optim.Adam(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                            foreach=True)


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
        self.opt.step()
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
        self.opt.step()
        return float(loss_sum.detach()), global_batch

    run = __call__
