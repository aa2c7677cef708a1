"""Validation while training and early stopping: the loop's view of the validation split.

``ValidationData`` is what a rank scores: its contiguous share of the split's rows (the first
``train.validation.max_rows`` of them when set), in batches; every rank takes the same number of
forwards (the largest share decides; a rank out of rows runs an empty batch), since the sharded
model's forward is a collective. ``Validator`` decides when a validation point falls, scores the
model in eval mode without gradients, gathers every rank's (row, label, score) and computes the
metrics over all rows in row order, so one process and any number of ranks get the same numbers.
It also keeps the early-stopping state (best value and step, points without improvement), which a
checkpoint carries so a resumed run (after a restart or a lost host) goes on counting.

Keeping the best step's model is the loop's (``loop.py``): with checkpoints on, the checkpoint of
the best step is written (if not already) and kept from pruning, and the end of training loads it
back; without, a copy of every weight and optimizer state in memory.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from recscale.data.batch import Batch
from recscale.evaluate.metrics import auc_score, log_loss
from recscale.runconfig import EarlyStoppingConfig, ValidateConfig

if TYPE_CHECKING:
    from recscale.train.checkpoint import Checkpointer

log = logging.getLogger(__name__)


@dataclass
class ValidationData:
    """``open()``: a fresh iterable of this rank's validation batches; ``steps``: forwards every
    rank takes; ``rows``: rows scored over all ranks; ``empty``: the batch of no rows a rank runs
    once its share ran out."""

    open: Callable[[], Iterable[Batch]]
    steps: int
    rows: int
    empty: Batch
    # the caller's view of each point (a tuner's pruner): ``observer(step, metrics)`` runs on rank
    # 0 only (it need not work in the other ranks' processes, but must pickle to reach rank 0's);
    # True ends training there, on every rank, as early stopping would (``RankResult.pruned_at``)
    observer: Callable[[int, dict[str, float]], bool] | None = None


def validation_metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """AUC, log loss and calibration (mean score / click rate) of one validation pass."""
    ctr = float(labels.mean()) if labels.size else float("nan")
    return {"auc": auc_score(labels, probs), "log_loss": log_loss(labels, probs),
            "calibration": float(probs.mean() / ctr) if ctr > 0 else float("nan")}


class Validator:
    """When to validate, how, and the early-stopping state; see the module docstring."""

    def __init__(self, cfg: ValidateConfig, stop: EarlyStoppingConfig, data: ValidationData):
        self.cfg, self.stop, self.data = cfg, stop, data
        self.best_value: float | None = None
        self.best_step = 0
        self.best_path: str | None = None  # the best step's checkpoint, when checkpoints are on
        self.bad = 0  # validation points since the best one
        self.points = 0
        self.last_step = -1  # the step of the last validation point
        self.seconds = 0.0
        self.pruned = False  # the observer ended training

    # ---------------------------------------------------------------------------- when
    def due(self, global_step: int, batch: int, steps: int) -> bool:
        """Is there a validation point after ``global_step``, the ``batch``-th (1-based) of an
        epoch of ``steps`` steps?"""
        if batch == steps:
            return True
        if self.cfg.every_steps is not None:
            return global_step % self.cfg.every_steps == 0
        n = min(self.cfg.per_epoch, steps)
        return any(batch == (k * steps) // n for k in range(1, n))

    # ---------------------------------------------------------------------------- score
    def score(self, rt) -> dict[str, float]:
        """Scores this rank's share in eval mode (every rank the same number of forwards), then
        the metrics over every rank's rows in row order."""
        model = rt.model
        model.eval()
        parts = []
        try:
            with torch.no_grad():
                it = iter(self.data.open())
                for _ in range(self.data.steps):
                    b = next(it, None)
                    b = (b if b is not None else self.data.empty).to(rt.device)
                    probs = torch.sigmoid(model(b.dense, b.sparse).float())
                    if b.batch_size:
                        parts.append((b.row_ids.cpu().numpy(), b.labels.cpu().numpy(),
                                      probs.cpu().numpy()))
                del it
        finally:
            model.train()
        mine = tuple(np.concatenate(p) for p in zip(*parts)) if parts else (
            np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.float32))
        everyone = rt.all_gather(mine)
        rows, labels, probs = (np.concatenate(p) for p in zip(*everyone))
        if rows.size != self.data.rows:
            raise RuntimeError(f"validation scored {rows.size} rows but its share of the "
                               f"validation split holds {self.data.rows}")
        order = np.argsort(rows, kind="stable")
        return validation_metrics(labels[order].astype(np.float64),
                                  probs[order].astype(np.float64))

    # ---------------------------------------------------------------------------- stop
    def observe(self, step: int, metrics: dict[str, float], counts: bool = True) -> bool:
        """Record one validation point; -> whether it is the best so far. ``counts``: a point
        that does not improve counts towards ``patience`` (a reset epoch's points before its
        end do not: its fresh tables are relearning)."""
        self.points += 1
        value = metrics[self.stop.metric]
        sign = 1.0 if self.stop.maximize else -1.0
        better = math.isfinite(value) and (
            self.best_value is None
            or sign * (value - self.best_value) > self.stop.min_delta)
        if better:
            self.best_value, self.best_step, self.bad = value, step, 0
        elif counts:
            self.bad += 1
        return better

    @property
    def should_stop(self) -> bool:
        return self.stop.enabled and self.bad >= self.stop.patience

    def stops(self, res, rank: int) -> bool:
        """After a validation point: does early stopping (recorded in ``res.stopped_early_at``)
        or the observer (``res.pruned_at``) end training here?"""
        if self.pruned:
            res.pruned_at = res.steps
            if rank == 0:
                log.info("training ended at step %d: pruned by the observer of validation "
                         "points (a tuner's pruner)", res.steps)
            return True
        if not self.should_stop:
            return False
        res.stopped_early_at = res.steps
        if rank == 0:
            log.info("early stopping at step %d: validation %s has not improved on %.4f (step %d) "
                     "for %d points", res.steps, self.stop.metric, self.best_value, self.best_step,
                     self.stop.patience)
        return True

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of it (JSON-able)."""
        return {"best_value": self.best_value, "best_step": self.best_step,
                "best_path": self.best_path, "bad": self.bad, "points": self.points}

    def load_state(self, state: dict[str, Any] | None) -> None:
        if not state:
            return
        self.best_value = state.get("best_value")
        self.best_step = int(state.get("best_step", 0))
        self.best_path = state.get("best_path")
        self.bad = int(state.get("bad", 0))
        self.points = int(state.get("points", 0))


def validation_point(rt, validator: Validator, res, counts: bool = True) -> bool:
    """One validation point after step ``res.steps``: its metrics into the history (curves
    ``validation.auc``, ``validation.log_loss``, ``validation.calibration``); -> whether it is
    the best so far. ``counts``: as ``Validator.observe``."""
    t = time.perf_counter()
    m = validator.score(rt)
    better = validator.observe(res.steps, m, counts)
    validator.seconds += time.perf_counter() - t
    validator.last_step = res.steps
    for k, v in m.items():
        res.history.setdefault(f"validation.{k}", []).append({"step": res.steps, "value": v})
    if validator.data.observer is not None:
        # rank 0 asks; every rank takes its answer (the sharded forward is a collective)
        mine = bool(validator.data.observer(res.steps, dict(m))) if rt.rank == 0 else False
        validator.pruned = bool(rt.all_gather(mine)[0])
    if rt.rank == 0:
        best = " (best)" if better else (f" (best {validator.best_value:.4f} at step "
                                         f"{validator.best_step})")
        log.info("step %d: validation AUC %.4f, log loss %.4f, calibration %.3f on %d rows%s",
                 res.steps, m["auc"], m["log_loss"], m["calibration"], validator.data.rows, best)
    return better


def _snapshot(rt, average=None) -> tuple:
    """A copy in memory of this rank's model and optimizer state, and of ``average`` (a
    ``WeightAverage``) when given (the best step's, when checkpoints are off)."""
    emb = rt.model.embeddings
    emb.flush()
    tables = [(sh.weight.detach().clone(), [x.detach().clone() for x in sh.states])
              for sh in emb.shards()]
    return (tables, copy.deepcopy(rt.model.dense.state_dict()), copy.deepcopy(rt.opt.state_dict()),
            average.snapshot() if average is not None else None)


def _restore_snapshot(rt, snap: tuple, average=None) -> None:
    tables, dense, opt, averages = snap
    if average is not None:
        average.restore(averages)
    emb = rt.model.embeddings
    with torch.no_grad():
        for sh, (w, states) in zip(emb.shards(), tables, strict=True):
            sh.weight.copy_(w)
            for view, x in zip(sh.states, states, strict=True):
                view.copy_(x)
    emb.flush()
    rt.model.dense.load_state_dict(dense)
    rt.opt.load_state_dict(opt)


def keep_best(ckpt: Checkpointer | None, rt, res, save: Callable[[], None],
              validator: Validator, keep: bool, average=None) -> tuple | None:
    """The checkpoint due at this step (``save()`` writes it), and the best step's model when
    ``keep``: its checkpoint (written now if not due, and kept from pruning), or without
    checkpoints a copy in memory (returned; with ``average``'s averages)."""
    if ckpt is None:
        return _snapshot(rt, average) if keep else None
    if not (keep or ckpt.due(res.steps)):
        return None
    if keep:
        validator.best_path = ckpt.path_of(res.steps)
    save()
    if not keep:
        return None
    if ckpt.last_saved_step == res.steps:
        ckpt.pinned = {validator.best_path}
        return None
    validator.best_path = None  # the write failed: keep it in memory instead
    return _snapshot(rt, average)


def restore_best(ckpt: Checkpointer | None, rt, res, validator: Validator,
                 snap: tuple | None, average=None) -> None:
    """End of training: the best validation step's model (and ``average``'s averages) back
    into the runtime."""
    if validator.best_value is None or validator.best_step == res.steps:
        return
    if validator.best_path is not None and ckpt is not None:
        shards = rt.model.embeddings.shards()
        ckpt.load(validator.best_path, average.shards(shards) if average is not None else shards,
                  rt.model.dense, rt.opt, average.dense if average is not None else None)
        rt.model.embeddings.flush()
    elif snap is not None:
        _restore_snapshot(rt, snap, average)
    else:
        if rt.rank == 0:
            log.warning("the best validation step %d cannot be restored (its checkpoint was not "
                        "kept): the model is the last step's (%d)", validator.best_step, res.steps)
        return
    res.restored_best = True
    if rt.rank == 0:
        log.info("the model is the best validation step's: step %d of %d (validation %s %.4f)",
                 validator.best_step, res.steps, validator.stop.metric, validator.best_value)
