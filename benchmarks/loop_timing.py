"""Timing recscale's one training loop (``recscale.train.loop.run_loop``) on in-memory batches:
what every benchmark measures for recscale's side, so a benchmark times the loop users train
with, not a hand-written one. Imported by the benchmark scripts (they run from this folder)."""

from __future__ import annotations

import statistics
import time

from recscale.config import parse
from recscale.runconfig import TrainConfig
from recscale.train.loop import EpochData, RankResult, run_loop


def loop_config(**train) -> TrainConfig:
    """A TrainConfig for timing: no progress output, no checkpoints, one history point per run."""
    base = {"progress": "off", "log_every": 10**9, "checkpoint": {"dir": None}}
    return parse(TrainConfig, {**base, **train}, "train")


def run_steps(rt, batches, steps: int, cfg: TrainConfig, start: int = 0) -> RankResult:
    """``steps`` steps of ``rt`` on ``batches`` (cycled from index ``start``) through run_loop."""
    chosen = [batches[(start + i) % len(batches)] for i in range(steps)]
    return run_loop(rt, EpochData(lambda: iter(chosen), steps), cfg)


def time_loop(rt, batches, steps: int, reps: int, cfg: TrainConfig,
              warmup: int = 3, clock=time.perf_counter) -> tuple[float, list[float]]:
    """-> (median samples/s over ``reps`` runs of ``steps`` steps, every run's samples/s); wall
    time (or ``clock``, e.g. time.process_time) around each run, loop bookkeeping included,
    after ``warmup`` steps."""
    if warmup:
        run_steps(rt, batches, warmup, cfg)
    rates = []
    for r in range(reps):
        t0 = clock()
        res = run_steps(rt, batches, steps, cfg, start=r * steps)
        rates.append(res.samples / (clock() - t0))
    return statistics.median(rates), rates
