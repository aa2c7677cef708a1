"""The DLRM training loop (single process here; the sharded runtime runs the same step per rank).

Throughput counts only the time inside ``TrainStep`` (forward, backward with the fused embedding
update, dense optimizer step), never data loading, so it measures the model, not the disk.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from recscale.data.batch import Batch
from recscale.model.dlrm import DLRM
from recscale.progress import Progress
from recscale.train.checkpoint import (
    Checkpointer,
    LocalShard,
    dense_tensors,
    flush_tiers,
)
from recscale.train.config import DenseOptimizerConfig, TrainConfig
from recscale.train.faults import maybe_kill, maybe_poison

log = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; the message names the step and the batch's rows."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device='cuda' is not allowed here: no CUDA device is available")
    return torch.device(name)


def set_threads(num_threads: int | None, local_world_size: int = 1) -> int:
    n = num_threads or max(1, (os.cpu_count() or 1) // max(1, local_world_size))
    torch.set_num_threads(n)
    return n


def make_dense_optimizer(params, cfg: DenseOptimizerConfig) -> torch.optim.Optimizer:
    params = list(params)
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.learning_rate, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay, foreach=True)
    if cfg.name == "adagrad":
        return torch.optim.Adagrad(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                                   foreach=True)
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                                foreach=True)
    raise ValueError(f"train.dense_optimizer.name={cfg.name!r} is not allowed")


class TrainStep:
    """One optimisation step: forward, BCE loss, backward (embeddings update in place), dense step."""

    def __init__(self, model: DLRM, dense_optimizer: torch.optim.Optimizer):
        self.model = model
        self.opt = dense_optimizer
        self.loss_fn = nn.BCEWithLogitsLoss()

    def __call__(self, batch: Batch) -> torch.Tensor:
        logits = self.model(batch.dense, batch.sparse)
        loss = self.loss_fn(logits, batch.labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()


@dataclass
class TrainResult:
    steps: int = 0
    samples: int = 0
    step_seconds: float = 0.0
    wall_seconds: float = 0.0
    final_loss: float = float("nan")
    history: dict[str, list[dict]] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)  # e.g. per-rank time split, bytes
    checkpoints: list[str] = field(default_factory=list)
    resumed_samples: int = 0  # samples trained before the checkpoint this run resumed from

    @property
    def samples_per_s(self) -> float:
        new = self.samples - self.resumed_samples
        return new / self.step_seconds if self.step_seconds > 0 else float("nan")

    def record(self, name: str, step: int, value: float) -> None:
        self.history.setdefault(name, []).append({"step": int(step), "value": float(value)})


def model_shards(model: DLRM) -> list[LocalShard]:
    """A single-process model's tables as whole-table shards (the checkpoint's unit)."""
    emb = model.embeddings
    states = emb.split_optimizer_states() or [[] for _ in emb.rows]
    return [LocalShard(t, 0, 0, w, list(st))
            for t, (w, st) in enumerate(zip(emb.split_weights(), states))]


def _batches(loader: Iterable[Batch], device, prefetch=None, with_state: bool = False):
    """-> (batch on ``device``, loader state right after that batch was read), one batch ahead:
    each next batch's ids go to ``prefetch`` (the embeddings' slow-tier cache loads them while
    the current batch computes) before the current batch is yielded. The state comes from the
    torchdata loader's ``state_dict()`` when it was read, so a checkpoint never skips the batch
    already read ahead."""
    it = iter(loader)
    state_of = getattr(loader, "state_dict", None) if with_state else None

    def fetch():
        b = next(it, None)
        if b is None:
            return None, None
        return b.to(device, non_blocking=True), (state_of() if state_of is not None else None)

    cur, cur_state = fetch()
    while cur is not None:
        nxt, nxt_state = fetch()
        if nxt is not None and prefetch is not None:
            prefetch(nxt.sparse)
        yield cur, cur_state
        cur, cur_state = nxt, nxt_state


def train_epochs(
    model: DLRM,
    batches_per_epoch: Iterable[Batch] | None,
    cfg: TrainConfig,
    make_epoch=None,
    total_steps: int | None = None,
    device: torch.device | None = None,
    run_id: str | None = None,
    fingerprint: dict | None = None,
) -> TrainResult:
    """Train for ``cfg.epochs`` (or ``cfg.max_steps``). ``make_epoch()`` returns a fresh iterable
    of batches for each epoch (a torchdata Loader, for checkpoints that resume mid-epoch);
    ``total_steps`` is only for the progress display. With ``cfg.checkpoint.dir`` and a
    ``run_id``, checkpoints are written and, as ``cfg.checkpoint.resume`` says, resumed."""
    device = device or next(model.dense_parameters()).device
    opt = make_dense_optimizer(model.dense_parameters(), cfg.dense_optimizer)
    step_fn = TrainStep(model, opt)
    res = TrainResult()
    model.train()
    limit = cfg.max_steps
    ckpt = None
    start_epoch, skip, loader_state = 0, 0, None
    if cfg.checkpoint.dir is not None and run_id is not None:
        ckpt = Checkpointer(cfg.checkpoint, run_id, fingerprint=fingerprint)
        got = ckpt.restore(model_shards(model), model._dense(), opt)
        if got is not None:
            path, m = got
            flush_tiers([model.embeddings])  # restored views -> slow tier
            p = m["progress"]["0"]
            res.steps, start_epoch = int(m["step"]), int(p["epoch"])
            res.extra["resumed"] = 1.0
            if m["world_size"] == 1:
                skip, loader_state = int(p["batches"]), m["loader"]["0"]
                res.samples = res.resumed_samples = int(p["samples"])
            else:
                res.extra["resharded"] = 1.0
                log.warning("checkpoint %s was written by %d ranks: the model is resharded into "
                            "one process; epoch %d restarts from its first row", path,
                            m["world_size"], start_epoch + 1)
            log.info("resumed from %s at step %d", path, res.steps)
        elif ckpt.init_from_checkpoint(model_shards(model), model._dense(), opt):
            flush_tiers([model.embeddings])  # restored views -> slow tier
            res.extra["initialised_from_checkpoint"] = 1.0
    total = min(total_steps or limit or 0, limit or total_steps or 0) or None
    interval_loss, interval_n, interval_t, interval_samples = 0.0, 0, 0.0, 0
    t_wall = time.perf_counter()
    epoch_i, batches, batch_state = start_epoch, skip, None
    prefetch = getattr(getattr(model, "embeddings", None), "prefetch", None)  # tiered only
    with Progress(total, "training", unit="step", mode=cfg.progress) as bar:
        for epoch_i in range(start_epoch, cfg.epochs):
            if limit is not None and res.steps >= limit:
                break
            epoch = make_epoch() if make_epoch is not None else batches_per_epoch
            batches = skip if epoch_i == start_epoch else 0
            if batches and loader_state is not None:
                epoch.load_state_dict(loader_state)
            for batch, batch_state in _batches(epoch, device, prefetch, ckpt is not None):
                batches += 1
                maybe_kill(cfg, 0, res.steps + 1)
                batch = maybe_poison(cfg, 0, res.steps + 1, batch)
                t0 = time.perf_counter()
                loss = step_fn(batch)
                loss_v = float(loss)  # syncs, so the step is really over before the timer stops
                dt = time.perf_counter() - t0
                if not math.isfinite(loss_v):
                    rows = batch.row_ids
                    raise NonFiniteLossError(
                        f"loss is {loss_v} at step {res.steps + 1}: batch {batches - 1} of epoch "
                        f"{epoch_i + 1}, rows {int(rows.min())}..{int(rows.max())} "
                        f"({batch.batch_size} rows); the last good checkpoint is kept"
                    )
                res.steps += 1
                res.samples += batch.batch_size
                res.step_seconds += dt
                interval_loss += loss_v
                interval_n += 1
                interval_t += dt
                interval_samples += batch.batch_size
                if res.steps % cfg.log_every == 0:
                    res.record("loss", res.steps, interval_loss / interval_n)
                    res.record("samples_per_s", res.steps, interval_samples / interval_t)
                    interval_loss, interval_n, interval_t, interval_samples = 0.0, 0, 0.0, 0
                bar.update(res.steps, loss=f"{loss_v:.4f}")
                res.final_loss = loss_v
                if ckpt is not None and ckpt.due(res.steps):
                    _save_single(ckpt, model, opt, res, epoch_i, batches, batch_state)
                if limit is not None and res.steps >= limit:
                    break
    if ckpt is not None and ckpt.last_saved_step != res.steps:  # the end, unless just saved
        _save_single(ckpt, model, opt, res, epoch_i, batches, batch_state)
    if ckpt is not None:
        res.extra.update(checkpoints_written=float(len(ckpt.saved)),
                         checkpoint_failures=float(ckpt.failed_writes),
                         checkpoint_seconds=ckpt.save_seconds)
        res.checkpoints = list(ckpt.saved)
    if interval_n:
        res.record("loss", res.steps, interval_loss / interval_n)
        res.record("samples_per_s", res.steps, interval_samples / interval_t)
    res.wall_seconds = time.perf_counter() - t_wall
    tier_stats = getattr(getattr(model, "embeddings", None), "tier_stats", None)
    if tier_stats is not None:  # hit rate, bytes per tier, prefetch time -> MLflow metrics
        res.extra.update({f"tiers.{k}": float(v) for k, v in tier_stats().items()})
    log.info("trained %d steps, %d samples: %.0f samples/s in the step, loss %.4f",
             res.steps, res.samples, res.samples_per_s, res.final_loss)
    return res


def _save_single(ckpt: Checkpointer, model: DLRM, opt, res: TrainResult, epoch: int,
                 batches: int, state) -> None:
    flush_tiers([model.embeddings])
    dense, rest = dense_tensors(model._dense(), opt)
    progress = {"epoch": epoch, "batches": batches, "samples": res.samples,
                "global_samples": res.samples, "steps": res.steps}
    ckpt.save(res.steps, model_shards(model), dense, rest, progress, state)


@torch.no_grad()
def predict(model: DLRM, batches: Iterable[Batch], device: torch.device | None = None):
    """-> (labels, click probabilities, row ids) as numpy arrays, in batch order."""
    import numpy as np

    device = device or next(model.dense_parameters()).device
    model.eval()
    labels, probs, rows = [], [], []
    for batch in batches:
        b = batch.to(device)
        probs.append(torch.sigmoid(model(b.dense, b.sparse)).cpu().numpy())
        labels.append(batch.labels.numpy())
        rows.append(batch.row_ids.numpy())
    model.train()
    if not labels:
        return np.zeros(0), np.zeros(0), np.zeros(0, np.int64)
    return np.concatenate(labels), np.concatenate(probs).astype(np.float64), np.concatenate(rows)
