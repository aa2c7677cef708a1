"""``train.fault_injection``: deliberate failures for tests and drills (a worker killed with
SIGKILL at a chosen step, a NaN in a chosen batch). Each fires only in the chosen elastic attempt,
so the restarted group runs through."""

from __future__ import annotations

import logging
import os

from recscale.data.batch import Batch
from recscale.runconfig import TrainConfig

log = logging.getLogger(__name__)


def _fault_now(cfg: TrainConfig, rank: int, step: int, kind: str) -> bool:
    fi = cfg.fault_injection
    return (fi is not None and fi.kind == kind and fi.rank == rank and fi.step == step
            and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == fi.attempt)


def maybe_kill(cfg: TrainConfig, rank: int, step: int) -> None:
    """``train.fault_injection`` kind kill: SIGKILL this worker as step ``step`` begins."""
    if _fault_now(cfg, rank, step, "kill"):
        import signal

        log.warning("fault injection: rank %d kills itself at step %d", rank, step)
        os.kill(os.getpid(), signal.SIGKILL)


def maybe_poison(cfg: TrainConfig, rank: int, step: int, batch: Batch) -> Batch:
    """``train.fault_injection`` kind nan: a NaN dense feature in this rank's batch of ``step``."""
    if not _fault_now(cfg, rank, step, "nan"):
        return batch
    dense = batch.dense.clone()
    if dense.numel():
        dense[0, 0] = float("nan")
    return Batch(dense=dense, sparse=batch.sparse, labels=batch.labels, row_ids=batch.row_ids)
