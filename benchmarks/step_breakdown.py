"""Where a training step's time goes: recscale's loop on bench_train's configs and batches, under
torch's profiler, split into the embedding lookup, the bottom MLP, the interaction (dot, cat or
the DCN cross net) and the top MLP in forward; the embedding backward with its fused optimizer
update, the dense layers' backward and the dense optimizer; and what is left (the loss, the
loop, batch handling, allocation, the framework). Each part is the median over repetitions of
its share of the step, with the step's own time measured without the profiler beside it.

    python benchmarks/step_breakdown.py                          # every config, fp32 (+ bf16)
    python benchmarks/step_breakdown.py --configs kaggle-small --steps 20 --reps 5

Forward parts come from ranges opened around the modules (hooks, here only); backward parts
from the autograd engine's nodes by kind (fbgemm's lookup function; matrix products, ReLU and
gradient accumulation of the dense layers); the dense optimizer from its own profiler range.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler's start/stop lines: not for people

import torch  # noqa: E402
from torch.autograd.profiler import record_function  # noqa: E402

from bench_train import CONFIGS, make_batches, ours  # noqa: E402  (this folder)
from loop_timing import run_steps  # noqa: E402
from recscale.model.precision import bf16_warning  # noqa: E402

PARTS = ("embedding lookup", "bottom MLP", "interaction", "top MLP", "embedding backward + update",
         "dense backward", "dense optimizer", "rest (loop, batches, framework)")


def _ranged(module, name):
    """Open the profiler range ``name`` around ``module``'s forward."""
    state = {}

    def pre(_m, _i):
        state["r"] = record_function(name)
        state["r"].__enter__()

    def post(_m, _i, _o):
        state.pop("r").__exit__(None, None, None)

    return module.register_forward_pre_hook(pre), module.register_forward_hook(post)


def _lookup_ranged(embeddings):
    inner = embeddings.lookup

    def lookup(sparse):
        with record_function("embedding lookup"):
            return inner(sparse)

    embeddings.lookup = lookup


def _backward_kind(name: str) -> str | None:
    if not name.startswith("autograd::engine::evaluate_function: "):
        return None
    node = name.split(": ", 1)[1]
    if "Lookup" in node or "split_embedding" in node or "CppNode" in node:
        return "embedding backward + update"
    return "dense backward"


def breakdown(cfg, precision, steps, reps, ids) -> tuple[dict[str, float], float]:
    """-> (each part's median milliseconds per step, the step's median milliseconds without
    the profiler)."""
    rt, tcfg = ours(cfg, precision)
    model = rt.model
    _lookup_ranged(model.embeddings)
    _ranged(model.bottom, "bottom MLP")
    _ranged(model.top, "top MLP")
    _ranged(model.dense_arch, "dense arch")
    batches = make_batches(cfg, 8, ids=ids)
    run_steps(rt, batches, 3, tcfg)  # warm-up
    plain = []
    for r in range(reps):
        t0 = time.perf_counter()
        run_steps(rt, batches, steps, tcfg, start=r * steps)
        plain.append((time.perf_counter() - t0) / steps * 1e3)
    per_rep = []
    for r in range(reps):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            run_steps(rt, batches, steps, tcfg, start=r * steps)
            total = (time.perf_counter() - t0) * 1e3
        ms = dict.fromkeys(PARTS, 0.0)
        arch = 0.0
        for e in prof.events():
            if e.name == "dense arch":
                arch += e.cpu_time_total / 1e3
            elif e.name in ms:
                ms[e.name] += e.cpu_time_total / 1e3
            elif e.name.startswith("Optimizer.step#") or e.name.startswith("Optimizer.zero_grad#"):
                ms["dense optimizer"] += e.cpu_time_total / 1e3
            else:
                kind = _backward_kind(e.name)
                if kind:
                    ms[kind] += e.cpu_time_total / 1e3
        ms["interaction"] = max(arch - ms["bottom MLP"] - ms["top MLP"], 0.0)
        ms["rest (loop, batches, framework)"] = max(total - sum(ms.values()), 0.0)
        per_rep.append({k: v / steps for k, v in ms.items()})
    parts = {k: statistics.median(p[k] for p in per_rep) for k in PARTS}
    return parts, statistics.median(plain)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--steps", type=int, default=10, help="steps per repetition")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (medians reported)")
    ap.add_argument("--ids", default="zipf", choices=["zipf", "uniform"])
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: all)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    why = bf16_warning("bf16")
    precisions = ["fp32"] + ([] if why else ["bf16"])
    if why:
        print(f"bf16 not measured: {why}")
    for name in args.configs:
        for precision in precisions:
            parts, step_ms = breakdown(CONFIGS[name], precision, args.steps, args.reps, args.ids)
            profiled = sum(parts.values())
            print(f"\n{name}, {precision}: {step_ms:.1f} ms a step without the profiler "
                  f"({CONFIGS[name]['batch'] / step_ms * 1e3:,.0f} samples/s), "
                  f"{profiled:.1f} ms with it")
            for k in PARTS:
                print(f"  {k:34s} {parts[k]:7.2f} ms  {parts[k] / profiled:6.1%}")


if __name__ == "__main__":
    main()
