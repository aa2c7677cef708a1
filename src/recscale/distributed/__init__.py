"""Starting and joining groups of workers on torch.distributed (used by DLRM and HF training)."""

from recscale.distributed.launch import (
    LaunchConfig,
    WorkerContext,
    WorkerFailedError,
    in_torchrun,
    init_worker,
    launch,
    set_threads,
    worker_entry,
)

__all__ = ["LaunchConfig", "WorkerContext", "WorkerFailedError", "in_torchrun", "init_worker",
           "launch", "set_threads", "worker_entry"]
