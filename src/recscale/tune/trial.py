"""One trial: a DLRM config trained on a preprocessed dataset through the run's own code
(``train_dlrm``), reporting each validation point to the study's pruner, then the model it
returns scored on the validation split (the trial's value) and, for the record, the test split."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from recscale.runconfig import DLRMConfig, plan_for_run
from recscale.scoring import evaluate_dlrm
from recscale.train import train_dlrm


@dataclass
class TrialOutcome:
    """``value``: the study's metric on the validation split, of the model the trial returns
    (None when the pruner stopped it at validation point ``pruned_at_point``)."""

    value: float | None
    validation: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] = field(default_factory=dict)
    history: dict[str, list[dict]] = field(default_factory=dict)
    steps: int = 0
    best_step: int = 0
    pruned_at: int = 0  # the training step the pruner ended it at (0: not pruned)
    seconds: float = 0.0


# a trial's training logs its validation points and steps at INFO: in a study of many trials the
# study's line per trial says it (warnings still show)
QUIET = ("recscale.train", "recscale.embedding", "recscale.model", "recscale.scoring")


@contextlib.contextmanager
def quiet(names=QUIET) -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def run_trial(cfg: DLRMConfig, manifest: dict, metric: str,
              observer: Callable[[int, dict[str, float]], bool] | None = None,
              oracle: np.ndarray | None = None, test: bool = True) -> TrialOutcome:
    """Train ``cfg`` on ``manifest``'s train split (sharded when ``train.launch.world_size`` > 1,
    on a plan made for it) and score what it returns; see the module docstring."""
    start = time.perf_counter()
    plan = plan_for_run(manifest, cfg) if cfg.train.world_size > 1 else None
    with quiet():
        out = train_dlrm(manifest, cfg.model, cfg.train, plan=plan, comms=cfg.comms,
                         sharding=cfg.sharding, observer=observer)
    ex = out.result.extra or {}
    res = TrialOutcome(None, history=out.result.history or {}, steps=out.result.steps,
                       best_step=int(ex.get("best_step") or 0),
                       pruned_at=int(ex.get("pruned_at") or 0))
    if not res.pruned_at:
        batch = cfg.evaluate.batch_size
        res.validation = evaluate_dlrm(out.model, manifest, "validation", batch, oracle)
        res.value = float(res.validation[metric])
        if test and manifest["splits"].get("test", {}).get("rows"):
            res.test = evaluate_dlrm(out.model, manifest, "test", batch, oracle)
    res.seconds = time.perf_counter() - start
    return res
