"""Start workers with torch.distributed.elastic, or run as a rank torchrun started.

``launch(fn, args, cfg)`` returns {rank: fn's return value} for this host's workers. A worker's
exception fails the whole group, and the error raised here carries that worker's traceback.
Nothing waits forever: collectives time out after ``collective_timeout_s``, and an exit watch
ends a rank that is still running ``exit_timeout_s`` after the last rank finished (whatever it
is stuck in, GIL held or not) and fails the launch naming it, with its Python stack.

Workers start from multiprocessing's fork server (``start_method: forkserver``, the default on
Linux): one clean process with torch imported, started at the first launch, forks every worker,
so a launch or an elastic restart takes a fraction of a second instead of the seconds a spawned
interpreter needs to import torch. A worker sees the launching process's environment as it is at
launch time (as a spawned one would), with elastic's per-worker variables on top.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from recscale.distributed import markers
from recscale.distributed.config import LaunchConfig
from recscale.distributed.worker import in_torchrun

# errors a rank gets because a peer failed or went away (never the root cause while another is known)
_COMM_ERRORS = ("Connection reset", "Connection closed", "Broken pipe", "gloo/transport",
                "NCCL error", "ProcessGroup", "monitoredBarrier", "LaunchAbortedError")


class WorkerFailedError(RuntimeError):
    """A worker failed; the message holds the first failing rank's traceback."""


class RendezvousFailedError(WorkerFailedError):
    """Hosts did not meet in time, or the rendezvous (the driver's store) went away."""


class RankExitTimeoutError(WorkerFailedError):
    """A rank did not exit within ``exit_timeout_s`` after the last rank finished; the launcher
    ended it. ``ranks`` are the ranks it ended; the message says where each one was."""

    def __init__(self, message: str, ranks: tuple[int, ...] = ()):
        super().__init__(message)
        self.ranks = ranks


def launch(fn: Callable[..., Any], args: tuple, cfg: LaunchConfig, run_id: str | None = None,
           external_store: bool = False) -> dict[int, Any]:
    """Run ``fn(*args)`` on ``cfg.world_size`` ranks (``cfg.nproc_per_node`` on this host);
    under torchrun, run it in this process as the rank torchrun made.

    Several hosts (``cfg.nnodes`` > 1 or a range): every host calls this with the same
    ``run_id``; ``external_store``: the rendezvous store at ``cfg.rdzv_endpoint`` is served by
    someone else (the driver's :class:`recscale.distributed.job_store.JobServer`)."""
    if in_torchrun():
        return {int(os.environ["RANK"]): fn(*args)}
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )
    from torch.distributed.launcher.api import LaunchConfig as ElasticConfig
    from torch.distributed.launcher.api import elastic_launch

    hosts = _HostSettings(cfg, external_store) if cfg.multi_host else None
    lc = ElasticConfig(
        min_nodes=cfg.min_nodes,
        max_nodes=cfg.max_nodes,
        nproc_per_node=cfg.nproc_per_node,
        run_id=run_id or f"recscale-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=cfg.rdzv_endpoint,
        rdzv_configs=hosts.rdzv_configs if hosts else {},
        local_addr=hosts.local_addr if hosts else None,
        max_restarts=cfg.max_restarts,
        monitor_interval=0.1,
        start_method=_start_method(cfg.start_method),
        # error files let a worker's traceback reach the exception raised here
        logs_specs=DefaultLogsSpecs(log_dir=tempfile.mkdtemp(prefix="recscale-elastic-")),
    )
    where = tempfile.mkdtemp(prefix="recscale-launch-")
    saved = {k: os.environ.get(k) for k in (markers.ENV, *_HostSettings.ENV)}
    os.environ[markers.ENV] = where  # workers get it: inherited (spawn) or InLaunchEnvironment
    if hosts:
        hosts.apply_env()
    watch = ExitWatch(where, cfg.exit_timeout_s)
    watch.start()
    entry = fn if lc.start_method == "spawn" else InLaunchEnvironment(fn, dict(os.environ))
    try:
        try:
            results = elastic_launch(lc, entry)(*args)
        except RendezvousTimeoutError:
            raise RendezvousFailedError(
                f"fewer than {cfg.min_nodes} host(s) joined the rendezvous at "
                f"{cfg.rdzv_endpoint} within train.launch.rdzv_timeout_s={cfg.rdzv_timeout_s:g} s"
                f" (train.launch.nnodes={cfg.nnodes!r}): every other host runs `recscale join "
                f"--endpoint {cfg.rdzv_endpoint}`") from None
        except RendezvousConnectionError as exc:
            raise RendezvousFailedError(
                f"lost the rendezvous at {cfg.rdzv_endpoint} (the driver's host): {exc}; the job "
                "cannot go on without it. Rerun the driver's command: the job resumes from its "
                "last checkpoint") from None
        except ChildFailedError as exc:
            failure = _failure(where, watch)
            if failure is None:
                raise
            raise failure from exc
        return results
    finally:
        watch.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(where, ignore_errors=True)


class _HostSettings:
    """What a launch across hosts adds: this host's address (the one that routes to the
    rendezvous), gloo on that interface, the rendezvous' deadlines, and a workers' store that
    is rebuilt every round (the agent store torch shares by default lives in one agent's
    process: a lost host could take it along)."""

    ENV = ("GLOO_SOCKET_IFNAME", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")

    def __init__(self, cfg: LaunchConfig, external_store: bool):
        from recscale.distributed.netaddr import interface_of, route_addr

        try:
            self.local_addr = cfg.local_addr or route_addr(cfg.rdzv_endpoint)
        except OSError as exc:
            raise ConnectionError(f"train.launch.rdzv_endpoint={cfg.rdzv_endpoint!r}: no route "
                                  f"from this host ({exc})") from None
        self.ifname = interface_of(self.local_addr)
        beat = max(1, round(cfg.heartbeat_s))
        self.rdzv_configs = {
            "join_timeout": max(1, round(cfg.rdzv_timeout_s)),
            "last_call_timeout": max(1, round(cfg.last_call_s)),
            "close_timeout": max(1, round(cfg.rdzv_timeout_s)),
            "heartbeat_timeout": 3 * beat,
            "keep_alive_interval": beat,
            "keep_alive_max_attempt": 3,
            "read_timeout": max(1, round(cfg.rdzv_timeout_s)),
        }
        if external_store:
            self.rdzv_configs["is_host"] = False

    def apply_env(self) -> None:
        if self.ifname and "GLOO_SOCKET_IFNAME" not in os.environ:
            os.environ["GLOO_SOCKET_IFNAME"] = self.ifname
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"


# what elastic sets for each worker (torchrun's documented worker environment and the agent's
# own): these keep elastic's values in a worker; every other variable is the launcher's
ELASTIC_VARIABLES = frozenset({
    "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "PYTHON_EXEC"})
# imported by the fork server before it forks a worker: nothing that may initialise CUDA (a forked
# worker could not use it; fbgemm_gpu's import calls torch.cuda.is_available(), so not fbgemm)
FORKSERVER_PRELOAD = ["torch", "torch.distributed.checkpoint", "torch.nn.parallel",
                      "torch.distributed.elastic.multiprocessing.api"]
# ... and with a torch built for neither CUDA nor ROCm, what every worker imports after the fork
# otherwise: DDP's constructor imports torch._dynamo (about 1.5 s a worker on 2 cores), the
# training and HF workers' modules with fbgemm (about 1 s), pyarrow's datasets and pandas
CPU_BUILD_PRELOAD = ["torch._dynamo", "recscale.train", "recscale.hf", "pyarrow.dataset", "pandas"]


def _start_method(name: str) -> str:
    """``forkserver`` (started once, with torch imported) where the platform has it, else spawn."""
    import multiprocessing

    if name != "forkserver" or name not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload(forkserver_preload())  # used when the server starts
    return name


def gpu_build() -> bool:
    """Whether this torch was built for CUDA or ROCm (whatever devices this machine has)."""
    import torch

    return torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None


def forkserver_preload() -> list[str]:
    """The modules the fork server imports once, for every worker it forks."""
    return FORKSERVER_PRELOAD + ([] if gpu_build() else CPU_BUILD_PRELOAD)


class InLaunchEnvironment:
    """A forked worker's entry point: sets the environment the launching process had at launch
    time (the fork server's is from when it started), keeps elastic's per-worker variables, then
    calls ``fn``."""

    def __init__(self, fn: Callable[..., Any], environ: dict[str, str]):
        self.fn, self.environ = fn, environ
        functools.update_wrapper(self, fn)  # elastic names the entry point by fn's names

    def __call__(self, *args: Any) -> Any:
        for k in [k for k in os.environ if k not in self.environ and not _is_elastic(k)]:
            del os.environ[k]
        os.environ.update({k: v for k, v in self.environ.items() if not _is_elastic(k)})
        return self.fn(*args)


def _is_elastic(name: str) -> bool:
    return name in ELASTIC_VARIABLES or name.startswith("TORCHELASTIC_")


def _failure(where: str, watch: ExitWatch) -> WorkerFailedError | None:
    watch.stop()
    cause = root_cause(where)
    if watch.verdict is None:
        return WorkerFailedError(cause) if cause else None
    if cause:  # a worker's own error is the root cause; the stuck rank came after it
        return WorkerFailedError(f"{cause}\n(then the launcher ended a rank: {watch.verdict})")
    return RankExitTimeoutError(watch.verdict, watch.ended)


def root_cause(where: str) -> str | None:
    """The first worker error of a launch, or None. A peer's failure makes the others fail in
    their next collective; the root cause is the earliest error that is not such a
    communication error (restarted workers that found the launch ended do not count)."""
    reports = [r for r in markers.read_all(where, "error") if not r.get("aborted")]
    if not reports:
        return None
    reports.sort(key=lambda r: (any(m in r["error"] for m in _COMM_ERRORS), r["time"]))
    first = reports[0]
    msg = f"worker rank {first['rank']} failed first: {first['error']}\n{first['traceback']}"
    for r in reports[1:]:
        msg += f"\n(then rank {r['rank']}: {r['error'][:300]})"
    return msg


class ExitWatch(threading.Thread):
    """Watches one launch's workers from the launcher process (a thread, so it works whatever
    a worker is stuck in). Once a rank of the current elastic attempt has finished (returned or
    raised), every rank of that attempt must have exited within ``timeout_s`` of the last one
    to finish. A rank still running then is ended: its Python stacks are dumped (SIGUSR1) and it
    is SIGKILLed, which makes the elastic agent stop the group and ``launch`` raise. Ranks still
    inside the worker function are the stuck ones; ranks that finished and only wait for them
    are left to the agent. When every finished rank had returned (the work is done, only a rank
    does not leave), the verdict is also written where restarted workers find it, so the
    agent's restarts end at once instead of running the job again; after an error, the agent
    restarts the group as ``max_restarts`` says."""

    def __init__(self, where: str, timeout_s: float, interval_s: float = 0.2):
        super().__init__(name="recscale-exit-watch", daemon=True)
        self.where, self.timeout_s, self.interval_s = where, timeout_s, interval_s
        self.verdict: str | None = None
        self.ended: tuple[int, ...] = ()
        self._stop_event = threading.Event()
        self._judged: set[int] = set()  # attempts already ended

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=10)

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            try:
                self._check()
            except OSError:  # the launch directory went away: the launch is over
                return

    def _check(self) -> None:
        starts = markers.read_all(self.where, "start")
        if not starts:
            return
        attempt = max(s["attempt"] for s in starts)
        if attempt in self._judged:
            return
        started = {s["rank"]: s for s in starts if s["attempt"] == attempt}
        done = {d["rank"]: d for d in markers.read_all(self.where, "done") if d["attempt"] == attempt}
        if not done:
            return
        last = max(done.values(), key=lambda d: d["time"])
        if time.time() - last["time"] <= self.timeout_s:
            return
        alive = sorted(r for r, s in started.items() if _alive(s["pid"]))
        if not alive:
            return
        stuck = [r for r in alive if r not in done] or alive
        self._judged.add(attempt)
        for r in stuck:
            _signal(started[r]["pid"], signal.SIGUSR1)
        time.sleep(1.0)  # let faulthandler write the stacks
        lines = []
        for r in stuck:
            s = started[r]
            after = "it" if r == last["rank"] else f"rank {last['rank']}"
            state = (f"it had {done[r]['how']} from {s['fn']} but did not exit" if r in done
                     else f"it was still inside {s['fn']}")
            stack = _read_stack(markers.path(self.where, "stack", r, attempt, "txt"))
            lines.append(f"rank {r} did not exit within {self.timeout_s:g} s after {after} "
                         f"{last['how']}: {state} (pid {s['pid']}, elastic attempt {attempt}); "
                         f"ended. Its Python stacks:\n{stack}")
        self.verdict, self.ended = "\n".join(lines), tuple(stuck)
        if all(d["how"] == "returned" for d in done.values()):
            markers.write(os.path.join(self.where, markers.VERDICT), {"message": self.verdict})
        for r in stuck:
            _signal(started[r]["pid"], signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running (not exited, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _read_stack(file: str, limit: int = 4000) -> str:
    try:
        with open(file) as fh:
            text = fh.read().strip()
    except OSError:
        text = ""
    if not text:
        return "  (no stack dump: the process did not answer SIGUSR1)"
    return text if len(text) <= limit else text[:limit] + "\n  ..."
