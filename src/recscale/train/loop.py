"""THE training loop: one rank's epochs, for one process (world size 1) and for every rank of the
sharded runtime alike.

Plugged in: the ``Runtime`` (model, dense optimizer, step, sums over ranks: ``runtime.py``), the
data (``EpochData``: a loader per epoch, the steps every rank takes) and the overlap policy
(``overlap.py``). The loop owns resuming, read-ahead, fault injection, the NaN guard, log points,
checkpoints, validation points, table resets between epochs and the row accounting's counters.

Ranks stay in lockstep: every rank runs the same number of steps per epoch (the largest share
decides), a rank whose rows ran out contributes an empty batch, so no row is dropped and no rank
waits forever in a collective. Step time counts the iteration minus the time spent waiting for the
loader, so it measures the model, not the disk.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torchdata.nodes as tn

from recscale.data.batch import Batch
from recscale.data.loader import empty_like
from recscale.data.work import Work, normalize, remaining, rows, share, split
from recscale.embedding.reset import reset_tables
from recscale.progress import Progress
from recscale.runconfig import TrainConfig
from recscale.train.average import WeightAverage, check_fast_tier, resolve_decay
from recscale.train.checkpoint import Checkpointer, dense_tensors
from recscale.train.faults import maybe_kill, maybe_poison
from recscale.train.overlap import OverlapPolicy
from recscale.train.result import WARMUP_STEPS, RankResult
from recscale.train.runtime import Runtime
from recscale.train.step import NonFiniteLossError
from recscale.train.validation import (
    ValidationData,
    Validator,
    keep_best,
    restore_best,
    validation_point,
)

log = logging.getLogger(__name__)


@dataclass
class EpochData:
    """What the loop reads: ``open()`` returns a fresh iterable of batches over this rank's
    normal share of one epoch (a torchdata Loader, whose ``state_dict``/``load_state_dict`` let
    a checkpoint resume mid-epoch; any iterable otherwise), and every rank takes
    ``steps_per_epoch`` steps per epoch. ``rows`` (the split's rows, positions 0..N-1, shared
    ``rank * N // W`` onwards as ``recscale.data.work.share`` says), ``batch_size`` and
    ``open(work)`` (a loader over those row positions) let a checkpoint of another world size
    resume mid-epoch: without them such a resume is refused."""

    open: Callable[..., Iterable[Batch]]
    steps_per_epoch: int
    rows: int | None = None
    batch_size: int | None = None
    # what a rank trains on once its rows ran out before the others' (a batch of no rows, of the
    # dataset's features); None: one like the last batch it had
    empty: Batch | None = None
    # this rank's share of the validation split (train.validation); None: no validation
    validation: ValidationData | None = None


@dataclass
class _Position:
    epoch: int = 0
    batch: int = 0  # batches of ``epoch`` already trained
    loader_state: Any = None  # loader state right after that batch was read
    rows: int = 0  # rows of this rank's work of ``epoch`` already trained
    work: Work | None = None  # this rank's row positions in ``epoch``; None: its normal share
    steps: int | None = None  # steps of ``epoch``; None: the data's steps_per_epoch


def _work_of(p: dict, rank: int, world_size: int, data: EpochData) -> tuple[Work, int]:
    """A rank's work list in a checkpoint's epoch and the rows of it it had trained (a checkpoint
    written before work lists were recorded: its normal share, batches x batch size)."""
    work = normalize(p["work"]) if "work" in p else share(data.rows, rank, world_size)
    done = int(p["rows"]) if "rows" in p else min(int(p["batches"]) * data.batch_size, rows(work))
    return work, done


def _reshard(path: str, m: dict, rt: Runtime, data: EpochData, res: RankResult) -> _Position:
    """Resume under another world size: the rest of the checkpoint's epoch (what each old rank
    had not trained, in old-rank order) is cut into one contiguous piece per rank; every rank
    takes as many steps as the largest piece needs. Each old rank's row count goes to new rank
    (old rank mod new world size), so the counts of all ranks still add up."""
    old, progress = int(m["world_size"]), m["progress"]
    if data.rows is None or data.batch_size is None:
        raise ValueError(f"checkpoint {path} was written by {old} rank(s), this run has "
                         f"{rt.world_size}: resharding its epoch needs the data's row positions "
                         "(EpochData.rows and batch_size)")
    owned = [_work_of(progress[str(k)], k, old, data) for k in range(old)]
    rest = remaining([w for w, _ in owned], [n for _, n in owned])
    pieces = split(rest, rt.world_size)
    epoch = int(progress["0"]["epoch"])
    res.samples = res.resumed_samples = sum(int(progress[str(k)]["samples"]) for k in range(old)
                                            if k % rt.world_size == rt.rank)
    res.resharded, res.resharded_from = True, old
    res.reshard_step, res.reshard_rows_remaining = int(m["step"]), rows(rest)
    steps = max(math.ceil(rows(p) / data.batch_size) for p in pieces)
    if rt.rank == 0:
        log.warning("checkpoint %s was written by %d rank(s), this run has %d: the model is "
                    "resharded; the %d rows of epoch %d no rank had trained go on over %d "
                    "rank(s) in %d step(s)", path, old, rt.world_size, rows(rest), epoch + 1,
                    rt.world_size, steps)
    if not steps:
        return _Position(epoch + 1)
    return _Position(epoch, work=pieces[rt.rank], steps=steps)


def _targets(rt: Runtime, average: WeightAverage | None, replicated: bool = True) -> list:
    """This rank's table pieces as a checkpoint saves and loads them (with their averages)."""
    shards = rt.model.embeddings.shards(replicated=replicated)
    return average.shards(shards) if average is not None else shards


def _resume(ckpt: Checkpointer, rt: Runtime, data: EpochData, res: RankResult,
            average: WeightAverage | None = None) -> _Position:
    """Restore the newest usable checkpoint (or ``init_from``) into the runtime (and
    ``average``); -> where to start. The one place that reads a checkpoint's progress."""
    emb = rt.model.embeddings
    dense_avg = average.dense if average is not None else None
    got = ckpt.restore(_targets(rt, average), rt.model.dense, rt.opt, dense_avg)
    if got is None:
        res.initialised_from = ckpt.init_from_checkpoint(_targets(rt, average), rt.model.dense,
                                                         rt.opt, dense_avg)
        if res.initialised_from:
            emb.flush()  # restored views -> slow tier
        return _Position()
    path, m = got
    emb.flush()
    progress = m["progress"]
    same_world = m["world_size"] == rt.world_size
    mine = progress[str(rt.rank)] if same_world else progress["0"]
    res.validation_state = mine.get("validation")
    if average is not None:
        average.load_state(mine.get("average"))
    res.steps, res.global_samples = int(m["step"]), int(mine["global_samples"])
    res.resumed_from = path
    if same_world:  # exactly where this rank stopped, loader state and all
        res.samples = res.resumed_samples = int(mine["samples"])
        pos = _Position(int(mine["epoch"]), int(mine["batches"]), m["loader"][str(rt.rank)])
        if data.rows is not None and data.batch_size is not None:
            work, pos.rows = _work_of(mine, rt.rank, rt.world_size, data)
            if work != share(data.rows, rt.rank, rt.world_size):  # an epoch resharded before
                pos.work = work
        if mine.get("epoch_steps") is not None:
            pos.steps = int(mine["epoch_steps"])
    else:  # rows are split differently over another number of ranks
        pos = _reshard(path, m, rt, data, res)
    if rt.rank == 0:
        log.info("resumed from %s at step %d (epoch %d, batch %d)", path, res.steps,
                 pos.epoch + 1, pos.batch)
    if pos.batch >= (pos.steps if pos.steps is not None else data.steps_per_epoch):
        pos = _Position(pos.epoch + 1)
    ckpt.last_saved_step = res.steps
    return pos


def _save(ckpt: Checkpointer, rt: Runtime, res: RankResult, pos: _Position,
          validator: Validator | None = None, average: WeightAverage | None = None) -> None:
    emb = rt.model.embeddings
    emb.flush()  # a slow tier's cache is part of the model: the views must be current
    rank0 = rt.rank == 0
    dense, rest = dense_tensors(rt.model.dense, rt.opt) if rank0 else ({}, {})
    if rank0 and average is not None:
        dense.update(average.dense_tensors())
    # "work", "rows" and "epoch_steps" let a resume under another world size go on with exactly
    # the rows of this epoch that no rank has trained yet
    progress = {"epoch": pos.epoch, "batches": pos.batch, "samples": res.samples,
                "global_samples": res.global_samples, "steps": res.steps, "rows": pos.rows,
                "epoch_steps": pos.steps}
    if pos.work is not None:
        progress["work"] = [list(iv) for iv in pos.work]
    if validator is not None:
        progress["validation"] = validator.state()
    if average is not None:
        progress["average"] = average.state()
    ckpt.save(res.steps, _targets(rt, average, replicated=rank0), dense, rest, progress,
              pos.loader_state)


class _LogPoints:
    """Mean loss and samples/s over the global batch since the last point (one small sum over
    ranks per point, which every rank takes part in)."""

    def __init__(self, rt: Runtime, res: RankResult):
        self.rt, self.res = rt, res
        self.loss, self.rows, self.seconds = 0.0, 0, 0.0  # since the last point (float64 sums)

    def add(self, loss_sum: float, rows: int, seconds: float) -> None:
        self.loss, self.rows, self.seconds = (self.loss + loss_sum, self.rows + rows,
                                              self.seconds + seconds)

    def point(self) -> None:
        if not self.seconds:
            return
        acc = torch.tensor([self.loss, self.rows], dtype=torch.float64)
        self.rt.all_reduce_(acc)
        loss, rows = float(acc[0]), int(acc[1])
        res = self.res
        res.final_loss = loss / max(rows, 1)
        res.history.setdefault("loss", []).append({"step": res.steps, "value": res.final_loss})
        res.history.setdefault("samples_per_s", []).append(
            {"step": res.steps, "value": rows / max(self.seconds, 1e-12)})
        self.loss, self.rows, self.seconds = 0.0, 0, 0.0


def run_loop(rt: Runtime, data: EpochData, cfg: TrainConfig,
             ckpt: Checkpointer | None = None,
             on_step: Callable[[RankResult, int], None] | None = None) -> RankResult:
    """Train ``rt`` for ``cfg.epochs`` (or ``cfg.max_steps``) on ``data``; checkpoints as
    ``ckpt`` is configured, resuming first as ``train.checkpoint.resume`` says. ``on_step(res,
    global_batch)`` is called after every step (a job's progress record)."""
    res = RankResult(rank=rt.rank, planned_bytes=rt.planned_bytes)
    t_wall = time.perf_counter()
    emb = rt.model.embeddings
    decay = resolve_decay(cfg.average.decay, data.steps_per_epoch, cfg.max_steps)
    check_fast_tier(emb, rt.all_gather, cfg.average.decay)
    average = WeightAverage(rt.model, decay) if decay else None
    res.average_decay = decay or 0.0
    if rt.rank == 0 and cfg.average.decay == "auto":
        log.info("train.average.decay: auto = %.4f, the weights averaged over ~%.0f steps "
                 "(an epoch: %s steps)", decay, 1 / (1 - decay), data.steps_per_epoch or "unknown")
    start = _resume(ckpt, rt, data, res, average) if ckpt is not None else _Position()
    pos = start
    policy = OverlapPolicy(cfg.pipeline)
    limit = cfg.max_steps
    points = _LogPoints(rt, res)
    stats = rt.stats
    stats.reset()
    done = limit is not None and res.steps >= limit
    left = 0
    if start.epoch < cfg.epochs:
        first_steps = start.steps if start.steps is not None else data.steps_per_epoch
        left = (max(0, first_steps - start.batch)
                + data.steps_per_epoch * (cfg.epochs - start.epoch - 1))
    total = res.steps + left
    total = min(total, limit) if limit else total
    bar = Progress(total, "training", unit="step", mode=cfg.progress if rt.rank == 0 else "off")
    validator = None
    if cfg.validation.enabled and data.validation is not None and data.validation.rows:
        validator = Validator(cfg.validation, cfg.early_stopping, data.validation)
        validator.load_state(res.validation_state)
        if validator.best_path and ckpt is not None:
            ckpt.pinned = {validator.best_path}
    keeping = (validator is not None and cfg.early_stopping.enabled
               and cfg.early_stopping.restore_best)
    snap = None

    def scored():
        """What a validation point scores: the average (train.average), else the weights."""
        return average.applied() if average is not None else contextlib.nullcontext()

    rt.model.train()
    last: list[Batch | None] = [None]  # the batch fetched last (an empty one copies its features)
    for epoch in range(start.epoch, cfg.epochs):
        if done:
            break
        steps, work = data.steps_per_epoch, None
        if data.rows is not None:
            work = share(data.rows, rt.rank, rt.world_size)
        if epoch == start.epoch and start.work is not None:  # the rest of a resharded epoch
            work, loader = start.work, data.open(start.work)
        else:
            loader = data.open()
        if epoch == start.epoch and start.steps is not None:
            steps = start.steps
        first = start.batch if epoch == start.epoch else 0
        epoch_rows = start.rows if epoch == start.epoch else 0
        if cfg.reinit_embeddings and epoch > 0 and (epoch != start.epoch or (
                first == 0 and start.work is None)):  # not in a resumed or resharded epoch
            reset_tables(emb, cfg.seed, epoch=epoch + 1 if rt.rank == 0 else None)
            if average is not None:
                average.restart_tables()
        if first and start.loader_state is not None:
            loader.load_state_dict(start.loader_state)
        it = iter(loader)
        state_of = getattr(loader, "state_dict", None) if ckpt is not None else None

        def fetch(it=it, state_of=state_of, last=last):
            t = time.perf_counter()
            b = next(it, None)
            if b is None:  # rows ran out: an empty batch
                b = data.empty if data.empty is not None else empty_like(last[0])
            last[0] = b
            state = state_of() if state_of is not None else None
            res.data_wait_seconds += time.perf_counter() - t
            return b.to(rt.device, non_blocking=True), state

        batch, batch_state = fetch()
        batch = maybe_poison(cfg, rt.rank, res.steps + 1, batch)
        started = policy.begin(emb, batch)
        for i in range(first, steps):
            maybe_kill(cfg, rt.rank, res.steps + 1)
            comm0, wait0 = stats.total_seconds, res.data_wait_seconds
            t0 = time.perf_counter()
            nxt = nxt_started = nxt_state = None
            # a validation point after this step: the next batch starts after it (its forwards
            # are collectives and touch the caches, which must not interleave with a started one)
            val_due = validator is not None and validator.due(res.steps + 1, i + 1, steps)
            if i + 1 < steps and (limit is None or res.steps + 1 < limit) and not val_due:
                nxt, nxt_state = fetch()
                nxt = maybe_poison(cfg, rt.rank, res.steps + 2, nxt)
                nxt_started = policy.ahead(emb, nxt)  # batch i+1 moves while batch i computes
            loss_sum, global_batch = rt.step.run(batch, started)
            dt = time.perf_counter() - t0 - (res.data_wait_seconds - wait0)
            if not math.isfinite(loss_sum):  # the peers then fail in their next collective
                rows = batch.row_ids
                where = f" on rank {rt.rank}" if rt.world_size > 1 else ""
                raise NonFiniteLossError(
                    f"loss is {loss_sum} at step {res.steps + 1}{where}: batch {i} of epoch "
                    f"{epoch + 1}, rows {int(rows.min())}..{int(rows.max())} ({batch.batch_size} "
                    "rows); the last good checkpoint is kept")
            if average is not None:
                average.update()
            res.steps += 1
            res.samples += batch.batch_size
            epoch_rows += batch.batch_size
            res.global_samples += global_batch
            res.step_seconds += dt
            res.comm_seconds += stats.total_seconds - comm0
            if res.warmup_steps < WARMUP_STEPS:
                res.warmup_steps += 1
                res.warmup_seconds += dt
                res.warmup_comm_seconds += stats.total_seconds - comm0
            points.add(loss_sum, batch.batch_size, dt)
            if on_step is not None:
                on_step(res, global_batch)
            if res.steps % cfg.log_every == 0:
                points.point()
            bar.update(res.steps, loss=f"{loss_sum / max(batch.batch_size, 1):.4f}")
            pos = _Position(epoch, i + 1, batch_state, epoch_rows, work, steps)
            # a reset epoch's points before its end (fresh tables relearning) stop nothing and
            # count nothing towards the patience
            judged = not (cfg.reinit_embeddings and epoch > 0 and i + 1 < steps)
            better = False
            if val_due:
                with scored():
                    better = validation_point(rt, validator, res, counts=judged)
            kept = keep_best(ckpt, rt, res,
                             lambda pos=pos: _save(ckpt, rt, res, pos, validator, average),
                             validator, keeping and better, average) if validator is not None else None
            if kept is not None:
                snap = kept
            elif ckpt is not None and validator is None and ckpt.due(res.steps):
                _save(ckpt, rt, res, pos, average=average)
            if (val_due and judged and validator.stops(res, rt.rank)) or (limit and res.steps >= limit):
                done = True
                break
            if val_due and i + 1 < steps:  # the next batch, held back for the validation
                nxt, nxt_state = fetch()
                nxt = maybe_poison(cfg, rt.rank, res.steps + 1, nxt)
                nxt_started = policy.begin(emb, nxt)
            batch, started, batch_state = nxt, nxt_started, nxt_state
        # the epoch's loader ends here, on this thread (freed on one of its reader threads it
        # cannot join itself: torchdata's "cannot join current thread"); only a threaded one
        # (a collection takes 70-90 ms with torch loaded, a fifth of a 15-step benchmark)
        threaded = isinstance(loader, tn.Loader)
        del fetch, it, state_of, loader
        if threaded:
            gc.collect()
    points.point()  # every rank takes part: it is a collective
    if validator is not None and validator.last_step != res.steps and res.steps:
        with scored():
            better = validation_point(rt, validator, res)
        if better and keeping and ckpt is not None:  # max_steps ended it
            validator.best_path = ckpt.path_of(res.steps)
    if ckpt is not None and ckpt.last_saved_step != res.steps:  # the end, unless just saved
        _save(ckpt, rt, res, pos, validator, average)
    if validator is not None:
        if keeping:
            restore_best(ckpt, rt, res, validator, snap, average)
        res.best_step = validator.best_step
        res.best_value = validator.best_value if validator.best_value is not None else float("nan")
        res.validation_points, res.validation_seconds = validator.points, validator.seconds
    if average is not None:  # the run hands back the average (the best step's, when kept)
        average.finish()
    bar.close()
    emb.flush()
    res.wall_seconds = time.perf_counter() - t_wall
    snap = stats.snapshot()
    res.bytes_per_step = {k: v["bytes"] / max(res.steps, 1) for k, v in snap.items()}
    for key in ("intra_host", "inter_host"):
        res.bytes_per_step[key] = sum(v[key] for v in snap.values()) / max(res.steps, 1)
        # what the planner's traffic estimate covers: the embedding exchanges' payload (not the
        # dense layers' gradient reduction, not the per-batch count messages)
        res.bytes_per_step[f"embedding.{key}"] = sum(
            v[key] for k, v in snap.items()
            if not k.startswith("dense_") and not k.endswith("_counts")) / max(res.steps, 1)
    res.embedding_bytes = int(emb.memory_bytes().get("fast", 0))
    res.tier_stats = emb.tier_stats()
    summary = getattr(rt.step, "summary", None)
    res.dense_optimizer = summary() if summary is not None else {}
    if ckpt is not None:
        res.checkpoints = list(ckpt.saved)
        res.checkpoint_failures = ckpt.failed_writes
        res.checkpoint_seconds = ckpt.save_seconds
    return res
