"""How long a launch takes to start its workers: forked from the fork server (the launcher's
default, ``train.launch.start_method: forkserver``) against freshly spawned interpreters.

Each launch starts ``--world-size`` gloo ranks that import the training package, join a process
group, wrap a layer in DDP (as a training worker does: it imports torch._dynamo), pass a barrier
and leave; launches of the two kinds alternate, the first forkserver launch
(which starts the server) is reported apart, and the medians and their ratio are printed.

    python benchmarks/fork_vs_spawn.py --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import time

from recscale.distributed import LaunchConfig, launch, run_in_group, worker_entry


def _barrier(ctx) -> int:
    import torch
    import torch.distributed as dist

    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))  # imports torch._dynamo
    dist.barrier()
    return ctx.rank


@worker_entry
def worker() -> int:
    import recscale.train  # noqa: F401 - what a training worker imports

    return run_in_group(LaunchConfig(collective_timeout_s=60), _barrier)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--world-size", type=int, default=2)
    args = ap.parse_args(argv)
    times: dict[str, list[float]] = {"forkserver": [], "spawn": []}

    def once(method: str) -> float:
        t = time.perf_counter()
        out = launch(worker, (), LaunchConfig(world_size=args.world_size, start_method=method))
        assert sorted(out) == list(range(args.world_size)), out
        return time.perf_counter() - t

    first = once("forkserver")
    for _ in range(args.reps):
        for method in times:
            times[method].append(once(method))
    med = {m: statistics.median(t) for m, t in times.items()}
    print(f"{args.world_size} ranks, median of {args.reps} launches (each: import recscale.train, "
          f"join a gloo group, DDP, barrier, leave)")
    print(f"  first forkserver launch (starts the server): {first:.2f} s")
    for m, t in times.items():
        print(f"  {m:10s} {med[m]:.2f} s   ({', '.join(f'{x:.2f}' for x in t)})")
    print(f"  spawn / forkserver: {med['spawn'] / med['forkserver']:.1f}x")


if __name__ == "__main__":
    main()
