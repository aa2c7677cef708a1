"""Workers for the teardown and exit-watch tests, and for benchmarks/repro_teardown_hang.py.

``unsafe_teardown_worker`` is the order that hung benchmarks/bench_sharded.py: a DDP model (with a
Python communication hook, as the sharded runtime registers), a few steps, a barrier,
``destroy_process_group()``, then the model freed. ``safe_teardown_worker`` does the same work
through ``run_in_group``. Both repeat it for many groups in one process, each bounded.
"""

from __future__ import annotations

import os
import time

import torch

from recscale.distributed import (
    LaunchConfig,
    WorkerContext,
    init_worker,
    run_in_group,
    worker_entry,
)

CFG = LaunchConfig(collective_timeout_s=60)


def build(ctx: WorkerContext, kind: str):
    """(step function, model) for ``kind``: ``mlp`` = DDP over a small MLP with a Python comm hook;
    ``dlrm`` = the sharded DLRM (embeddings all-to-all on the embedding group, DDP dense arch)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    if kind == "mlp":
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                        torch.nn.Linear(64, 1)))
        model.register_comm_hook(None, lambda pg, bucket: default_hooks.allreduce_hook(pg, bucket))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(ctx.rank)
        xs = [torch.randn(32, 16, generator=g) for _ in range(4)]

        def step(i):
            opt.zero_grad()
            loss = model(xs[i % len(xs)]).square().mean()
            loss.backward()
            opt.step()
            return float(loss)

        return step, model
    from recscale.comm.collectives import CommStats
    from recscale.config import parse
    from recscale.model import ModelConfig
    from recscale.runconfig import TrainConfig
    from recscale.train.runtime import build_sharded_model
    from recscale.train.step import ShardedStep, make_dense_optimizer
    from tests.distributed import workers as W

    tcfg = parse(TrainConfig, {"embedding_optimizer": {"name": "exact_sgd", "learning_rate": 0.1},
                               "dense_optimizer": {"name": "sgd", "learning_rate": 0.1}}, "train")
    model = build_sharded_model(ctx, W.make_plan(["table_wise", "row_wise", "column_wise",
                                                  "data_parallel"]),
                                parse(ModelConfig, W.MODEL, "model"), tcfg, CommStats(),
                                feature_names=W.FEATURES, num_dense=W.NUM_DENSE)
    sstep = ShardedStep(model, make_dense_optimizer(model.dense_parameters(),
                                                    tcfg.dense_optimizer), ctx.world_size)
    batches = [W.to_batch(parts[ctx.rank]) for parts in W.make_global_batches(4)]
    return (lambda i: sstep(batches[i % len(batches)])[0]), model


def _work(ctx: WorkerContext, kind: str, steps: int) -> list[float]:
    import torch.distributed as dist

    step, _model = build(ctx, kind)
    losses = [step(i) for i in range(steps)]
    dist.barrier()
    return losses


def _unsafe_cycle(kind: str, steps: int) -> list[float]:
    import torch.distributed as dist

    ctx = init_worker(CFG)
    step, model = build(ctx, kind)
    losses = [step(i) for i in range(steps)]
    dist.barrier()
    dist.destroy_process_group()
    del step, model  # the model freed after the group (ctx, holding the embedding group, lives on)
    return losses


class CycleDeadline:
    """Per group: if a cycle takes longer than ``seconds``, faulthandler's C watchdog thread
    (it needs no GIL) dumps this process's Python stacks to ``hang_dir/hang.rank<r>.txt`` and
    exits it, so a deadlocked cycle ends and says where it was. Off when ``hang_dir`` is None."""

    def __init__(self, hang_dir: str | None, seconds: float):
        self.seconds, self.hang_dir, self.done = seconds, hang_dir, 0
        self.rank = os.environ.get("RANK", "0")
        self.fh = None
        if hang_dir is not None:
            self.fh = open(os.path.join(hang_dir, f"hang.rank{self.rank}.txt"),  # noqa: SIM115
                           "w")  # open for the process's life: the watchdog writes to it

    def run(self, fn, *args):
        import faulthandler

        if self.fh is None:
            return fn(*args)
        faulthandler.dump_traceback_later(self.seconds, exit=True, file=self.fh)
        try:
            out = fn(*args)
        finally:
            faulthandler.cancel_dump_traceback_later()
        self.done += 1
        with open(os.path.join(self.hang_dir, f"groups.rank{self.rank}"), "w") as fh:
            fh.write(str(self.done))
        return out


@worker_entry
def unsafe_teardown_worker(kind: str, steps: int, cycles: int = 1, hang_dir: str | None = None,
                           cycle_s: float = 30.0) -> list[list[float]]:
    """``cycles`` times in this process: join a group, DDP + steps + barrier,
    destroy_process_group(), and the model freed after it."""
    torch.set_num_threads(1)
    deadline = CycleDeadline(hang_dir, cycle_s)
    return [deadline.run(_unsafe_cycle, kind, steps) for _ in range(cycles)]


@worker_entry
def safe_teardown_worker(kind: str, steps: int, cycles: int = 1, hang_dir: str | None = None,
                         cycle_s: float = 30.0) -> list[list[float]]:
    """The same work through run_in_group, ``cycles`` groups one after another."""
    torch.set_num_threads(1)
    deadline = CycleDeadline(hang_dir, cycle_s)
    return [deadline.run(run_in_group, CFG, _work, kind, steps) for _ in range(cycles)]


# ------------------------------------------------------------------------------ exit watch
def _hold_the_gil_forever() -> None:
    """Block in C while holding the GIL (what a deadlocked destructor does): a PyDLL call
    does not release it, so no Python code of this process runs again."""
    import ctypes

    libc = ctypes.PyDLL(None)
    while True:
        libc.sleep(3600)


def _barrier_only(ctx: WorkerContext) -> int:
    import torch.distributed as dist

    dist.barrier()
    return ctx.rank


@worker_entry
def stuck_worker(where: str, log_dir: str) -> int:
    """Rank 0 gets stuck; rank 1 returns. ``where``: ``inside`` = rank 0 blocks with the GIL
    held before returning from the worker function; ``exit`` = rank 0 returns its result and
    blocks with the GIL held while its process exits. Each entry is logged in ``log_dir``
    (``entered.rank*``), and rank 1's return time (``returned.rank1``)."""
    rank = int(os.environ["RANK"])
    with open(os.path.join(log_dir, f"entered.rank{rank}"), "a") as fh:
        fh.write(f"{time.time()}\n")
    out = run_in_group(LaunchConfig(collective_timeout_s=30), _barrier_only)
    if rank == 0 and where == "inside":
        _hold_the_gil_forever()
    if rank == 0 and where == "exit":
        import multiprocessing.util

        # runs in the process's exit path, after the result went to the launcher
        multiprocessing.util.Finalize(None, _hold_the_gil_forever, exitpriority=100)
    if rank == 1:
        with open(os.path.join(log_dir, "returned.rank1"), "w") as fh:
            fh.write(f"{time.time()}\n")
    return out


_KEPT: list = []  # a model stored beyond its work: what run_in_group refuses to tear down under


def _leaky(ctx: WorkerContext) -> int:
    from torch.nn.parallel import DistributedDataParallel as DDP

    _KEPT.append(DDP(torch.nn.Linear(4, 1)))
    return ctx.rank


@worker_entry
def leaky_worker() -> int:
    return run_in_group(LaunchConfig(collective_timeout_s=30), _leaky)
