"""Start training workers with torch.distributed.elastic, or run as a rank torchrun started.

``launch(fn, args, cfg)`` returns {rank: fn's return value} for this host's workers. A worker's
exception fails the whole group, and the error raised here carries that worker's traceback.
Collectives time out after ``train.collective_timeout_s``: a hang ends in an error, not a stall.
"""

from __future__ import annotations

import functools
import json
import os
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from recscale.config import Validated, check


@dataclass(frozen=True)
class LaunchConfig(Validated):
    """How many workers, on how many hosts, and the deadlines of their waits (``train.launch``)."""

    world_size: int = 1
    nnodes: int = 1
    rdzv_endpoint: str = "127.0.0.1:0"
    max_restarts: int = 0
    collective_timeout_s: float = 300.0
    exit_timeout_s: float = 60.0

    def validate(self, prefix: str = "train.launch") -> None:
        check(self.world_size >= 1, f"{prefix}.world_size", self.world_size, ">= 1")
        check(self.nnodes >= 1 and self.world_size % self.nnodes == 0, f"{prefix}.nnodes",
              self.nnodes, f"a divisor of {prefix}.world_size={self.world_size}")
        check(":" in self.rdzv_endpoint, f"{prefix}.rdzv_endpoint", self.rdzv_endpoint, "host:port")
        check(self.max_restarts >= 0, f"{prefix}.max_restarts", self.max_restarts, ">= 0")
        check(self.collective_timeout_s > 0, f"{prefix}.collective_timeout_s",
              self.collective_timeout_s, "> 0")
        check(self.exit_timeout_s > 0, f"{prefix}.exit_timeout_s", self.exit_timeout_s, "> 0")


def set_threads(num_threads: int | None, local_world_size: int = 1) -> int:
    n = num_threads or max(1, (os.cpu_count() or 1) // max(1, local_world_size))
    torch.set_num_threads(n)
    return n


def in_torchrun() -> bool:
    """True when this process is already one rank of a group (torchrun / an elastic agent)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ


class WorkerFailedError(RuntimeError):
    """A training worker raised; the message holds the first failing rank's traceback."""


_ERROR_DIR = "RECSCALE_WORKER_ERROR_DIR"
_COMM_ERRORS = ("Connection reset", "Connection closed", "Broken pipe", "gloo/transport",
                "NCCL error", "ProcessGroup")


def worker_entry(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a worker function: an exception is written (rank, time, traceback) where the
    launcher reads it, so the root cause is reported, not the peers' 'connection reset'."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            where = os.environ.get(_ERROR_DIR)
            if where:
                rank = os.environ.get("RANK", "?")
                with open(os.path.join(where, f"rank{rank}.json"), "w") as fh:
                    json.dump({"rank": rank, "time": time.time(), "error": f"{type(exc).__name__}: {exc}",
                               "traceback": traceback.format_exc()}, fh)
            raise

    return wrapper


def _root_cause(error_dir: str) -> str | None:
    reports = []
    for name in os.listdir(error_dir):
        with open(os.path.join(error_dir, name)) as fh:
            reports.append(json.load(fh))
    if not reports:
        return None
    # a peer's failure makes the others fail in their next collective; the root cause is the
    # earliest error that is not such a communication error
    reports.sort(key=lambda r: (any(m in r["error"] for m in _COMM_ERRORS), r["time"]))
    first = reports[0]
    msg = f"worker rank {first['rank']} failed first: {first['error']}\n{first['traceback']}"
    for r in reports[1:]:
        msg += f"\n(then rank {r['rank']}: {r['error'][:300]})"
    return msg


def launch(fn: Callable[..., Any], args: tuple, cfg: LaunchConfig) -> dict[int, Any]:
    if in_torchrun():
        return {int(os.environ["RANK"]): fn(*args)}
    import tempfile

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    lc = LaunchConfig(
        min_nodes=cfg.nnodes,
        max_nodes=cfg.nnodes,
        nproc_per_node=cfg.world_size // cfg.nnodes,
        run_id=f"recscale-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=cfg.rdzv_endpoint,
        max_restarts=cfg.max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
        # error files let a worker's traceback reach the exception raised here
        logs_specs=DefaultLogsSpecs(log_dir=tempfile.mkdtemp(prefix="recscale-elastic-")),
    )
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    error_dir = tempfile.mkdtemp(prefix="recscale-errors-")
    previous = os.environ.get(_ERROR_DIR)
    os.environ[_ERROR_DIR] = error_dir  # spawned workers inherit it
    try:
        return elastic_launch(lc, fn)(*args)
    except ChildFailedError as exc:
        cause = _root_cause(error_dir)
        if cause is None:
            raise
        raise WorkerFailedError(cause) from exc
    finally:
        if previous is None:
            os.environ.pop(_ERROR_DIR, None)
        else:
            os.environ[_ERROR_DIR] = previous


@dataclass
class WorkerContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str
    sparse_group: Any  # process group for the embedding collectives (DDP uses the default one)


def init_worker(cfg: LaunchConfig, device: str = "cpu") -> WorkerContext:
    """Join the process group the launcher prepared (env://) and pick device and backend."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if use_cuda else "gloo"
    timeout = timedelta(seconds=cfg.collective_timeout_s)
    if not dist.is_initialized():
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # The elastic agent's store outlives a restart of the worker group; without a
            # per-attempt prefix the restarted ranks read the dead ranks' gloo addresses
            # ("connectFullMesh ... Connection refused").
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            store = dist.PrefixStore(f"recscale/attempt{attempt}", dist.TCPStore(
                os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                timeout=timeout))
            dist.init_process_group(backend, store=store, rank=int(os.environ["RANK"]),
                                    world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
        else:
            dist.init_process_group(backend, init_method="env://", timeout=timeout)
    sparse_group = dist.new_group(backend=backend, timeout=timeout)
    return WorkerContext(
        rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())),
        device=device, backend=backend, sparse_group=sparse_group,
    )
