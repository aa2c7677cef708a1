"""Re-measure the teardown hang: launches of 2 gloo ranks that train a DDP model a few steps,
pass a barrier and leave the group, in the order that hung benchmarks/bench_sharded.py
(destroy_process_group() first, the DDP model freed after it, when the worker returns) or in
the safe order of ``recscale.distributed.run_in_group`` (model freed, final barrier, destroy).

    python benchmarks/repro_teardown_hang.py --tries 30                 # unsafe order
    python benchmarks/repro_teardown_hang.py --tries 30 --order safe
    python benchmarks/repro_teardown_hang.py --kind mlp --stress 2      # plain DDP, 2 busy cores

Every try is bounded: the launcher's exit watch ends a rank still running ``--exit-timeout``
seconds after its peer finished and raises RankExitTimeoutError naming it (counted as a hang,
with the stuck rank's innermost frames); an alarm of ``--try-timeout`` seconds is the backstop.
``--stress N`` runs N busy-loop processes meanwhile (the machine shared with other jobs, as
when the hang was seen). Prints the hang rate.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
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


def _busy() -> None:
    while True:
        pass


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tries", type=int, default=30)
    ap.add_argument("--order", choices=["unsafe", "safe"], default="unsafe")
    ap.add_argument("--kind", choices=["dlrm", "mlp"], default="dlrm")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--cycles", type=int, default=50, help="groups joined and left per launch")
    ap.add_argument("--no-busy-thread", action="store_true",
                    help="without the Python thread that keeps the GIL busy (a loader's)")
    ap.add_argument("--exit-timeout", type=float, default=20.0)
    ap.add_argument("--try-timeout", type=int, default=180)
    ap.add_argument("--stress", type=int, default=0, help="busy-loop processes meanwhile")
    args = ap.parse_args(argv)
    cfg = LaunchConfig(world_size=2, exit_timeout_s=args.exit_timeout)
    fn = TW.unsafe_teardown_worker if args.order == "unsafe" else TW.safe_teardown_worker
    fargs = (args.kind, args.steps, args.cycles, not args.no_busy_thread)
    busy = [mp.get_context("spawn").Process(target=_busy, daemon=True) for _ in range(args.stress)]
    for p in busy:
        p.start()
    signal.signal(signal.SIGALRM, _alarm)
    hangs, errors, times = 0, 0, []
    t_all = time.perf_counter()
    try:
        for i in range(args.tries):
            t0 = time.perf_counter()
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
                errors += 1
                outcome = f"error: {type(exc).__name__}: {str(exc)[:300]}"
            finally:
                signal.alarm(0)
            dt = time.perf_counter() - t0
            times.append(dt)
            print(f"try {i + 1}/{args.tries}: {dt:5.1f} s  {outcome}", flush=True)
    finally:
        for p in busy:
            p.terminate()
    n = len(times)
    print(f"\n{args.order} order, {args.kind} worker, {args.steps} steps, stress {args.stress}: "
          f"{hangs}/{n} tries hung ({100.0 * hangs / max(n, 1):.0f}%), {errors} other errors; "
          f"{time.perf_counter() - t_all:.0f} s in all\n"
          f"command: python benchmarks/repro_teardown_hang.py {' '.join(sys.argv[1:])}".rstrip())
    return {"hangs": hangs, "tries": n, "errors": errors}


if __name__ == "__main__":
    main()
