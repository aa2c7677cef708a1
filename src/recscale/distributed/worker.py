"""What runs inside a worker process: join the group, run the work, leave the group safely.

Every worker function is decorated with :func:`worker_entry` (its exception reaches the launcher
with its traceback; the launcher sees when it started and finished) and does its distributed work
through :func:`run_in_group`, which owns the group's whole life::

    @worker_entry
    def my_worker(cfg_dict, data):
        return run_in_group(parse(LaunchConfig, cfg_dict), _work, data)

    def _work(ctx: WorkerContext, data):   # models live and die in here
        ...
        return plain_results               # numbers, arrays, state dicts; never the model

Teardown order (the reason this module exists). A DistributedDataParallel model holds the
process group in C++. If the group is destroyed first and the model freed afterwards, the model's
reducer drops the last reference to ProcessGroupGloo while holding the GIL; the destructor joins
gloo's worker threads, and a worker thread that still has to free a finished collective's
thread-local Python state waits for the GIL: a deadlock (seen in benchmarks/bench_sharded.py;
``benchmarks/repro_teardown_hang.py`` measures how often). ``run_in_group`` therefore frees
everything the work built while the group is alive (the work's frame ends, then a garbage
collection, and a check that no DDP model survived), passes a final barrier with a deadline,
and only then destroys the groups, from Python, which releases the GIL while gloo's threads stop.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import gc
import logging
import os
import signal
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from recscale.distributed import markers
from recscale.distributed.config import LaunchConfig

log = logging.getLogger(__name__)

T = TypeVar("T")
DEVICES = ("auto", "cpu", "cuda")


def in_torchrun() -> bool:
    """True when this process is already one rank of a group (torchrun / an elastic agent)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ


def torchrun_ranks_done(key: str, timeout_s: float) -> bool:
    """Under torchrun, after the group is gone: a barrier on torchrun's store (the agent's, at
    MASTER_ADDR:MASTER_PORT; torch.distributed.elastic's store barrier), so that rank 0 may
    release what every rank was reading. True once every rank has reported ``key`` done. False,
    with a warning naming the ranks that did not report (or why the store cannot be reached),
    when the store is not the agent's (it went with the group) or ``timeout_s`` passed."""
    from torch.distributed.elastic.utils.store import barrier

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        log.warning("torchrun's agent store is not shared with workers: cannot tell when every "
                    "rank is done with %s", key)
        return False
    rank = int(os.environ["RANK"])
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False, timeout=timedelta(seconds=timeout_s))
        barrier(store, int(os.environ["WORLD_SIZE"]), f"recscale/done/{key}", timeout_s,
                rank=rank, trace_timeout=min(10.0, timeout_s))
    except (KeyError, ValueError, RuntimeError, dist.DistStoreError) as exc:
        log.warning("rank %d: not every rank reported %s done on torchrun's store at %s "
                    "within %g s: %s", rank, key, where, timeout_s, exc)
        return False
    return True


def set_threads(num_threads: int | None, local_world_size: int = 1) -> int:
    """Intra-op threads of this process: ``num_threads``, or the cores shared among the
    ``local_world_size`` processes of this host. Returns the number set. Every process that
    trains or measures calls it first, so it also keeps freed memory in the process
    (``keep_freed_memory``)."""
    n = num_threads or max(1, (os.cpu_count() or 1) // max(1, local_world_size))
    torch.set_num_threads(n)
    keep_freed_memory()
    return n


@contextlib.contextmanager
def threads_for_run(num_threads: int | None, local_world_size: int = 1) -> Iterator[int]:
    """:func:`set_threads` for one run inside a process that outlives it (training or
    calibrating in the user's Kedro or notebook process): afterwards the process has its
    thread count back, and, where the run was what kept freed memory, the memory the run freed
    goes back to the OS (:func:`release_freed_memory`). Yields the number of threads set."""
    threads, kept = torch.get_num_threads(), _KEEP["done"]
    try:
        yield set_threads(num_threads, local_world_size)
    finally:
        torch.set_num_threads(threads)
        if not kept:
            release_freed_memory()


# glibc's mallopt parameters (malloc.h) and their values when a process starts
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_GLIBC_DEFAULT_THRESHOLD = 128 * 1024
_KEEP = {"done": False}


def _glibc_malloc():
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Keep memory that a step frees for the next step, instead of handing it back to the OS.

    With glibc's defaults, blocks above a dynamic threshold (at most 32 MiB) are fresh ``mmap``s
    and a free heap top above twice that is trimmed, so the activations a training step frees
    and allocates again every step come back as zeroed pages, each a page fault. Measured on
    the 2-vCPU machines: 3,600-7,000 minor faults per dense forward + backward + Adam step at
    dim 128 and batch 1,024, 33-43 ms a step where the same step takes 23-25 ms with freed
    memory kept (and no faults), and the time depended on the process's allocation history, so
    calibration and training measured the same work 1.5x apart. Blocks up to 1 GiB now come
    from the heap and the heap is never trimmed: a process keeps its peak (PyTorch's CUDA
    allocator keeps GPU memory the same way). Once per process; False where the C library is
    not glibc (nothing changes there)."""
    if _KEEP["done"]:
        return True
    libc = _glibc_malloc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    # the mmap threshold first: setting either one ends glibc's dynamic adjustment of both
    ok = bool(mallopt(_M_MMAP_THRESHOLD, 1 << 30) or mallopt(_M_MMAP_THRESHOLD, 32 << 20))
    ok = bool(mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1)) and ok
    _KEEP["done"] = ok
    return ok


def release_freed_memory() -> bool:
    """Undo :func:`keep_freed_memory`: glibc's starting thresholds again (128 KiB each; fixed,
    where glibc's own would have moved with the process's frees) and the heap's free memory
    handed back to the OS now (``malloc_trim``). False where nothing was kept."""
    libc = _glibc_malloc()
    if not _KEEP["done"] or libc is None:
        return False
    libc.mallopt(_M_MMAP_THRESHOLD, _GLIBC_DEFAULT_THRESHOLD)
    libc.mallopt(_M_TRIM_THRESHOLD, _GLIBC_DEFAULT_THRESHOLD)
    libc.malloc_trim(0)
    _KEEP["done"] = False
    return True


class LaunchAbortedError(RuntimeError):
    """A restarted worker found that its launcher had already ended the launch."""


class WorkerTeardownError(RuntimeError):
    """A DDP model outlived the work of :func:`run_in_group`; freeing it after the group is
    destroyed can deadlock, so the worker fails instead."""


# ------------------------------------------------------------------------------ worker entry
_stack_files: list[Any] = []  # keeps the faulthandler dump files open for the process's life


def worker_entry(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorate a worker function started by :func:`recscale.distributed.launch`.

    Started by ``launch``, it records (in the launch's directory) this rank's pid when ``fn`` is
    entered, when it returned or raised, and an exception's traceback, so the launcher reports
    the root cause rather than the peers' 'connection reset', and can name a rank that does not
    exit. A SIGUSR1 dumps the process's Python stacks where the launcher reads them. Outside a
    launch (torchrun, a plain call) it just calls ``fn``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        where = markers.launch_dir()
        if where is None:
            return fn(*args, **kwargs)
        rank, attempt = markers.rank(), markers.attempt()
        _register_stack_dump(markers.path(where, "stack", rank, attempt, "txt"))
        markers.write(markers.path(where, "start", rank, attempt),
                      {"rank": rank, "attempt": attempt, "pid": os.getpid(),
                       "fn": getattr(fn, "__qualname__", repr(fn)), "time": markers.now()})
        try:
            verdict = markers.read(os.path.join(where, markers.VERDICT))
            if verdict is not None:
                raise LaunchAbortedError(f"the launcher ended this launch: {verdict['message']}")
            result = fn(*args, **kwargs)
        except BaseException as exc:
            t = markers.now()
            markers.write(markers.path(where, "error", rank, attempt),
                          {"rank": rank, "attempt": attempt, "time": t,
                           "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc(),
                           "aborted": isinstance(exc, LaunchAbortedError)})
            markers.write(markers.path(where, "done", rank, attempt),
                          {"rank": rank, "attempt": attempt, "how": "raised", "time": t})
            raise
        markers.write(markers.path(where, "done", rank, attempt),
                      {"rank": rank, "attempt": attempt, "how": "returned", "time": markers.now()})
        return result

    return wrapper


def _register_stack_dump(file: str) -> None:
    fh = open(file, "w")  # noqa: SIM115 - stays open: faulthandler writes to it from a signal
    _stack_files.append(fh)
    faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True, chain=False)


# ------------------------------------------------------------------------------- the group
@dataclass
class WorkerContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str
    sparse_group: Any  # process group for the embedding collectives (DDP uses the default one)
    collective_timeout_s: float | None = None  # the deadline the groups were made with


_groups_joined = 0  # init_worker calls in this process: each joins under its own store prefix


def resolve_device(device: str) -> torch.device:
    """``train.device`` (auto | cpu | cuda) -> this process's device: auto takes CUDA when there
    is one; a rank takes the GPU of its local rank."""
    if device not in DEVICES:
        raise ValueError(f"train.device={device!r} is not allowed: expected one of "
                         + ", ".join(repr(d) for d in DEVICES))
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device='cuda' is not allowed here: no CUDA device is available")
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
    return torch.device("cpu")


def init_worker(cfg: LaunchConfig, device: str = "cpu") -> WorkerContext:
    """Join the process group the launcher prepared and pick device and backend (gloo on CPU,
    NCCL on CUDA; ``device`` auto | cpu | cuda). Collectives time out after
    ``cfg.collective_timeout_s``. Prefer :func:`run_in_group`, which also leaves the group."""
    global _groups_joined
    dev = resolve_device(device)
    use_cuda = dev.type == "cuda"
    if use_cuda:
        torch.cuda.set_device(dev)
    backend = "nccl" if use_cuda else "gloo"
    timeout = timedelta(seconds=cfg.collective_timeout_s)
    if not dist.is_initialized():
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # The elastic agent's store outlives a restart of the worker group; without a
            # per-attempt prefix the restarted ranks read the dead ranks' gloo addresses
            # ("connectFullMesh ... Connection refused"). The group count lets one process
            # join, leave and join again.
            prefix = f"recscale/attempt{markers.attempt()}"
            if _groups_joined:
                prefix += f"/group{_groups_joined}"
            store = dist.PrefixStore(prefix, dist.TCPStore(
                os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                timeout=timeout))
            dist.init_process_group(backend, store=store, rank=int(os.environ["RANK"]),
                                    world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
        else:
            dist.init_process_group(backend, init_method="env://", timeout=timeout)
        _groups_joined += 1
    sparse_group = dist.new_group(backend=backend, timeout=timeout)
    return WorkerContext(
        rank=dist.get_rank(), world_size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())),
        device=dev, backend=backend, sparse_group=sparse_group,
        collective_timeout_s=float(cfg.collective_timeout_s),
    )


def run_in_group(cfg: LaunchConfig, work: Callable[..., T], *args: Any, device: str = "cpu",
                 **kwargs: Any) -> T:
    """``work(ctx, *args, **kwargs)`` inside the process group, then a safe teardown.

    Join (:func:`init_worker`); run the work; free what it built while the group is alive
    (its frame is gone when it returns; a garbage collection frees cycles); fail with
    :class:`WorkerTeardownError` if a DistributedDataParallel model is still alive (the work
    returned it, or stored it globally); pass a final barrier (``collective_timeout_s``; on gloo
    a monitored barrier that names the ranks that did not arrive); destroy the embedding group,
    then the default group. ``work`` must return plain results, not models.

    If the work raises, its frames' locals are cleared and collected (so its models are freed
    before the group goes), the groups are destroyed without a barrier (peers may never reach
    one), and the exception propagates with its traceback intact."""
    ctx = init_worker(cfg, device)
    try:
        result = work(ctx, *args, **kwargs)
    except BaseException as exc:
        _release_frames(exc)
        gc.collect()
        try:
            _destroy(ctx)
        except Exception:  # the work's own error is the one to report
            log.warning("rank %d: destroying the process group after an error failed too",
                        ctx.rank, exc_info=True)
        raise
    gc.collect()
    alive = _ddp_models_alive()
    _final_barrier(ctx, cfg.collective_timeout_s)
    if alive:
        # leave the group standing: destroying it now is what makes freeing the model hang
        raise WorkerTeardownError(
            f"rank {ctx.rank}: {alive} DistributedDataParallel model(s) still alive after "
            f"{getattr(work, '__qualname__', 'the work')} returned; return plain results and "
            "keep models inside the work function, so they are freed before the group is destroyed")
    _destroy(ctx)
    return result


def _release_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames an exception's traceback (and its context)
    holds; the traceback text is unaffected."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


def _ddp_models_alive() -> int:
    import warnings

    from torch.nn.parallel import DistributedDataParallel as DDP

    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated reduce_op warns
        warnings.simplefilter("ignore", FutureWarning)
        return sum(1 for o in gc.get_objects() if isinstance(o, DDP))


def _final_barrier(ctx: WorkerContext, timeout_s: float) -> None:
    if ctx.backend == "gloo":
        # rank 0 hears from every rank and names those that did not arrive in time
        dist.monitored_barrier(timeout=timedelta(seconds=timeout_s), wait_all_ranks=True)
    else:  # NCCL: the group's own timeout bounds it
        dist.barrier(device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)


def _destroy(ctx: WorkerContext) -> None:
    if not dist.is_initialized():
        return
    if ctx.sparse_group is not None:
        dist.destroy_process_group(ctx.sparse_group)
        ctx.sparse_group = None
    dist.destroy_process_group()
