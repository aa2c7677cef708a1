"""Distributed runtime shared by DLRM and Hessian-free training: launch workers, join the group,
leave it safely.

Uses torch.distributed and torch.distributed.elastic only; imports no other recscale package
but ``recscale.config``. ``launch`` starts ``LaunchConfig.world_size`` workers (or runs as the
rank torchrun made); a worker function is decorated with ``worker_entry`` and runs its work
through ``run_in_group`` (join, work, free models, final barrier, destroy: the order that cannot
deadlock); every wait has a deadline and ends in an error naming the rank that did not answer.
"""

from recscale.distributed.config import LaunchConfig
from recscale.distributed.launch import RankExitTimeoutError, WorkerFailedError, launch, root_cause
from recscale.distributed.worker import (
    LaunchAbortedError,
    WorkerContext,
    WorkerTeardownError,
    in_torchrun,
    init_worker,
    keep_freed_memory,
    release_freed_memory,
    resolve_device,
    run_in_group,
    set_threads,
    threads_for_run,
    torchrun_ranks_done,
    worker_entry,
)

__all__ = [
    "LaunchAbortedError",
    "LaunchConfig",
    "RankExitTimeoutError",
    "WorkerContext",
    "WorkerFailedError",
    "WorkerTeardownError",
    "in_torchrun",
    "init_worker",
    "keep_freed_memory",
    "launch",
    "release_freed_memory",
    "resolve_device",
    "root_cause",
    "run_in_group",
    "set_threads",
    "threads_for_run",
    "torchrun_ranks_done",
    "worker_entry",
]
