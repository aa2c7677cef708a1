"""Re-measure the teardown hang: launches of 2 gloo ranks that each join a group, train a DDP
model a few steps, pass a barrier and leave the group, ``--cycles`` times per launch, in the
order that hung benchmarks/bench_sharded.py (destroy_process_group() first, the DDP model freed
after it) or in the safe order of ``recscale.distributed.run_in_group`` (model freed, final
barrier, destroy).

    python benchmarks/repro_teardown_hang.py                      # unsafe order, 10 x 60 groups
    python benchmarks/repro_teardown_hang.py --order safe
    python benchmarks/repro_teardown_hang.py --kind dlrm --stress 0

The deadlock needs a gloo worker thread to be late freeing a finished all-reduce (its
thread-local state holds a Python object, so it needs the GIL) while the main thread, holding the
GIL, destroys the group from the DDP reducer. Late means not scheduled: ``--stress N`` (default
2) runs N busy-loop processes meanwhile, the machine shared with other jobs as when the hang was
seen. Without them it is rare here, unless ``--pin CPU`` puts both ranks on one CPU: each rank's
gloo thread then waits behind the other rank, and the unsafe order hangs more often than beside
two busy loops (the test suite's way, which costs one core instead of the whole machine).

Every group is bounded: a cycle that takes longer than ``--cycle-timeout`` seconds makes
faulthandler's watchdog (a C thread: it works with the GIL held) dump the rank's Python stacks
and exit it; that is counted as a hang and its innermost frames are printed. In a 2-rank launch
the launcher's exit watch would also end a rank stuck after its peer finished; an alarm of
``--try-timeout`` seconds is the last backstop. Prints the hang rate per launch and per group.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # tests.distributed.teardown_workers, importable by the spawned ranks

from tests.distributed import teardown_workers as TW  # noqa: E402
from torch.distributed.elastic.multiprocessing.api import SignalException  # noqa: E402

from recscale.distributed import LaunchConfig, RankExitTimeoutError, launch  # noqa: E402


class TryTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise TryTimeout()


def _hang_report(hang_dir: str) -> str:
    """'rank r: innermost frames' of the ranks whose cycle deadline fired, or ''."""
    out = []
    for name in sorted(n for n in os.listdir(hang_dir) if n.startswith("hang.")):
        with open(os.path.join(hang_dir, name)) as fh:
            frames = [ln.strip() for ln in fh if ln.strip().startswith("File")]
        if frames:
            out.append(f"{name.split('.')[1]}: " + " <- ".join(frames[:3]))
    return "; ".join(out)


def _groups(hang_dir: str, world: int, cycles: int, hung: bool) -> int:
    """Groups this launch went through: those every rank finished, plus the one that hung."""
    done = []
    for r in range(world):
        try:
            with open(os.path.join(hang_dir, f"groups.rank{r}")) as fh:
                done.append(int(fh.read() or 0))
        except FileNotFoundError:
            done.append(0)
    return cycles if not hung else min(done) + 1


def _busy() -> None:
    while True:
        pass


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tries", type=int, default=10)
    ap.add_argument("--order", choices=["unsafe", "safe"], default="unsafe")
    ap.add_argument("--kind", choices=["dlrm", "mlp"], default="mlp")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--cycles", type=int, default=60, help="groups joined and left per launch")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--exit-timeout", type=float, default=20.0)
    ap.add_argument("--cycle-timeout", type=float, default=30.0)
    ap.add_argument("--try-timeout", type=int, default=180)
    ap.add_argument("--stress", type=int, default=2, help="busy-loop processes meanwhile")
    ap.add_argument("--pin", type=int, default=None, metavar="CPU",
                    help="run the ranks and the busy loops on this one CPU (inherited affinity)")
    ap.add_argument("--start-method", choices=["forkserver", "spawn"], default="forkserver",
                    help="how the launcher starts workers (train.launch.start_method)")
    args = ap.parse_args(argv)
    cfg = LaunchConfig(world_size=args.world_size, exit_timeout_s=args.exit_timeout,
                       start_method=args.start_method)
    fn = TW.unsafe_teardown_worker if args.order == "unsafe" else TW.safe_teardown_worker
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})
    busy = [mp.get_context("spawn").Process(target=_busy, daemon=True) for _ in range(args.stress)]
    for p in busy:
        p.start()
    signal.signal(signal.SIGALRM, _alarm)
    hangs, errors, times, groups = 0, 0, [], 0
    t_all = time.perf_counter()
    try:
        for i in range(args.tries):
            t0 = time.perf_counter()
            hang_dir = tempfile.mkdtemp(prefix="recscale-hang-")
            fargs = (args.kind, args.steps, args.cycles, hang_dir, args.cycle_timeout)
            signal.alarm(args.try_timeout)
            try:
                launch(fn, fargs, cfg)
                outcome = "ok"
            except RankExitTimeoutError as exc:
                hangs += 1
                frames = [ln.strip() for ln in str(exc).splitlines() if ln.strip().startswith("File")]
                outcome = f"HANG (ranks {list(exc.ranks)}): " + " <- ".join(frames[:3])
            except TryTimeout:
                hangs += 1
                outcome = f"HANG not ended by the exit watch: alarm after {args.try_timeout} s"
            except SignalException:  # the script itself was told to stop
                raise
            except Exception as exc:  # noqa: BLE001 - counted and shown, the run goes on
                where = _hang_report(hang_dir)
                if where:
                    hangs += 1
                    outcome = f"HANG (cycle deadline): {where}"
                else:
                    errors += 1
                    outcome = f"error: {type(exc).__name__}: {str(exc)[:300]}"
            finally:
                signal.alarm(0)
            dt = time.perf_counter() - t0
            times.append(dt)
            groups += _groups(hang_dir, args.world_size, args.cycles, outcome.startswith("HANG"))
            shutil.rmtree(hang_dir, ignore_errors=True)
            print(f"try {i + 1}/{args.tries}: {dt:5.1f} s  {outcome}", flush=True)
    finally:
        for p in busy:
            p.terminate()
    n = len(times)
    print(f"\n{args.order} order, {args.world_size} rank(s), {args.kind} worker, {args.cycles} groups "
          f"per launch, {args.steps} steps, stress {args.stress}"
          f"{'' if args.pin is None else f', pinned to CPU {args.pin}'}: "
          f"{hangs}/{n} launches hung ({100.0 * hangs / max(n, 1):.0f}%), {hangs} hangs in {groups:,} "
          f"groups (1 per {groups / hangs if hangs else float('inf'):,.0f}), {errors} other errors; "
          f"{time.perf_counter() - t_all:.0f} s in all\n"
          f"command: python benchmarks/repro_teardown_hang.py {' '.join(sys.argv[1:])}".rstrip())
    return {"hangs": hangs, "tries": n, "groups": groups, "errors": errors}


if __name__ == "__main__":
    main()
