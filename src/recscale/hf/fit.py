"""Train a fully connected classifier with Hessian-free or a first-order baseline, on arrays.

``fit_hessian_free`` and ``fit_baseline`` take the split dict of ``recscale.data.idx.prepare_mnist``
/ ``recscale.data.frames.prepare_speech_frames`` and return a :class:`FitResult` whose history
records training loss, validation loss and error against passes over the training data and wall
time (evaluation time excluded), and, for HF, CG iterations, damping, reduction ratio and
negative-curvature events per step. ``FitConfig.launch.world_size > 1`` runs HF data-parallel on
that many workers started by ``recscale.distributed.launch`` (torch.distributed.elastic, gloo on
CPU), the launcher DLRM training uses, with the same ``LaunchConfig``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recscale.config import check_choice
from recscale.distributed import launch, threads_for_run
from recscale.hf.config import BASELINES, BaselinesConfig, FitConfig, NetConfig
from recscale.hf.loop import (
    Clock,
    FitResult,
    Recorder,
    batches,
    build_mlp,
    data_dims,
    hf_loop,
    n_steps,
    progress_bar,
    summarize_fit,
    train_tensors,
)
from recscale.hf.workers import hf_fit_worker
from recscale.optim import HessianFreeConfig

log = logging.getLogger(__name__)


def fit_hessian_free(data: dict, net: NetConfig, hf: HessianFreeConfig, cfg: FitConfig,
                     on_step: Callable[[int, nn.Module, Any], None] | None = None) -> FitResult:
    """Train with HessianFree; ``cfg.launch.world_size > 1`` launches that many data-parallel
    workers. ``on_step(step, model, step_info)`` is called after every step (single process only)."""
    if cfg.launch.world_size > 1:
        if on_step is not None:
            raise ValueError("on_step is only supported with train.launch.world_size=1")
        return _launch_hf(data, net, hf, cfg)
    with threads_for_run(cfg.num_threads):
        return hf_loop(data, net, hf, cfg, rank=0, world_size=1, reduce=None, on_step=on_step)


def _launch_hf(data: dict, net: NetConfig, hf: HessianFreeConfig, cfg: FitConfig) -> FitResult:
    plain = {k: np.asarray(v) for k, v in data.items() if k.startswith(("x_", "y_"))}
    return launch(hf_fit_worker, (plain, net, hf, cfg), cfg.launch)[0]


# --------------------------------------------------------------------- first-order baselines
def fit_baseline(data: dict, net: NetConfig, name: str, baselines: BaselinesConfig,
                 cfg: FitConfig) -> FitResult:
    """SGD with momentum, Adam or SOAP on the same network, data order and evaluation schedule."""
    check_choice("baselines.optimizers", name, BASELINES)
    with threads_for_run(cfg.num_threads):
        return _fit_baseline(data, net, name, baselines, cfg)


def _fit_baseline(data: dict, net: NetConfig, name: str, baselines: BaselinesConfig,
                  cfg: FitConfig) -> FitResult:
    dtype = getattr(torch, cfg.dtype)
    x, y = train_tensors(data, dtype)
    n = len(x)
    in_dim, classes = data_dims(data)
    model = build_mlp(in_dim, classes, net, cfg.seed, dtype)
    if name == "sgd":
        s = baselines.sgd
        opt = torch.optim.SGD(model.parameters(), lr=s.learning_rate, momentum=s.momentum,
                              nesterov=s.nesterov and s.momentum > 0, weight_decay=s.weight_decay)
    elif name == "soap":
        try:
            from pytorch_optimizer import SOAP
        except ImportError:
            raise ValueError("baselines.optimizers: soap needs pytorch-optimizer: pip install "
                             "'recscale[second_order]'") from None
        opt = SOAP(model.parameters(), lr=baselines.soap.learning_rate,
                   weight_decay=baselines.soap.weight_decay)
    else:
        a = baselines.adam
        opt = torch.optim.Adam(model.parameters(), lr=a.learning_rate, weight_decay=a.weight_decay)
    batch = min(baselines.global_batch_size or cfg.global_batch_size, n)
    epochs = baselines.epochs or cfg.epochs
    steps = n_steps(n, batch, epochs, None)
    clock = Clock()
    rec = Recorder(model, data, n, cfg.eval_every, clock)
    rec.maybe(0, 0, force=True)
    clock.start()
    seen = 0
    rows = []
    with progress_bar(cfg, steps, name) as bar:
        for step, idx in enumerate(batches(n, batch, steps, cfg.seed), start=1):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            seen += len(idx)
            lv = float(loss.detach())
            rec.batch_loss(lv)
            rec.maybe(step, seen, force=step == steps)
            bar.update(step, loss=f"{lv:.4f}", val_err=f"{rec.history[-1]['val_error']:.4f}")
            if not math.isfinite(lv):
                log.warning("%s: non-finite loss at step %d; stopping", name, step)
                break
    clock.stop()
    summary = summarize_fit(rec.history, clock.elapsed, step)
    summary["step_s_mean"] = clock.elapsed / max(step, 1)
    return FitResult(name, batch, {k: v.detach().clone() for k, v in model.state_dict().items()},
                     rec.history, rows, summary)


def load_model(result: FitResult | dict, data: dict, net: NetConfig) -> nn.Module:
    """Rebuild the trained network from a FitResult (or its state dict)."""
    state = result.state_dict if isinstance(result, FitResult) else result
    in_dim, classes = data_dims(data)
    dtype = next(iter(state.values())).dtype
    model = build_mlp(in_dim, classes, net, 0, dtype)
    model.load_state_dict(state)
    return model.eval()
