"""Does `torch.compile` (inductor) speed up the dense part of a training step on this CPU?

The dense arch (bottom MLP, dot interaction, top MLP: ``recscale.model.dlrm.DenseArch``, the part a
compiled path would cover; the fused embedding kernels stay eager either way) trained one step at
a time (forward, BCE loss, backward, SGD) on random inputs standing for pooled embeddings, eager
against ``torch.compile(arch)``, in interleaved repetitions (eager, compiled, eager, ...), medians
of the repetitions' milliseconds per step. Compile time is the first compiled step's. bf16 runs
under autocast, as ``model.dense_precision: bf16`` does, only where the CPU has bf16 units.

    python benchmarks/bench_compile.py --reps 5 --steps 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from recscale.model.dlrm import DenseArch, ModelConfig
from recscale.model.precision import cpu_bf16_units

# the dense layers of bench_train's kaggle-small and of the default config
CONFIGS = {
    "kaggle-small": ((512, 256, 64, 16), (512, 256, 1)),
    "default": ((128, 64, 16), (128, 64, 1)),
}


def _step_ms(fn, opt, dense, emb, y, steps: int) -> float:
    t = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        F.binary_cross_entropy_with_logits(fn(dense, emb), y).backward()
        opt.step()
    return (time.perf_counter() - t) / steps * 1000


def measure(name: str, precision: str, batch: int, tables: int, reps: int, steps: int) -> dict:
    bottom, top = CONFIGS[name]
    torch.manual_seed(0)
    arch = DenseArch(13, tables, ModelConfig(bottom_mlp=bottom, top_mlp=top,
                                             dense_precision=precision))
    opt = torch.optim.SGD(arch.parameters(), lr=0.01)
    dense = torch.randn(batch, 13)
    emb = torch.randn(batch, tables * 16, requires_grad=True)
    y = torch.randint(0, 2, (batch,)).float()
    compiled = torch.compile(arch)
    t = time.perf_counter()
    _step_ms(compiled, opt, dense, emb, y, 1)
    compile_s = time.perf_counter() - t
    for fn in (arch, compiled):  # warm both
        _step_ms(fn, opt, dense, emb, y, 3)
    eager, comp = [], []
    for _ in range(reps):
        eager.append(_step_ms(arch, opt, dense, emb, y, steps))
        comp.append(_step_ms(compiled, opt, dense, emb, y, steps))
    e, c = statistics.median(eager), statistics.median(comp)
    return {"config": name, "precision": precision, "eager_ms": e, "compiled_ms": c,
            "eager_range": (min(eager), max(eager)), "compiled_range": (min(comp), max(comp)),
            "compile_s": compile_s, "speedup": e / c}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20, help="steps per repetition")
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--tables", type=int, default=8)
    args = ap.parse_args()
    precisions = ["fp32"] + (["bf16"] if cpu_bf16_units()[1] else [])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; precisions {precisions}")
    print("| config | precision | eager ms/step | compiled ms/step | speedup | compile s |")
    print("|---|---|---|---|---|---|")
    for name in args.configs:
        for p in precisions:
            r = measure(name, p, args.batch, args.tables, args.reps, args.steps)
            print(f"| {name} | {p} | {r['eager_ms']:.2f} ({r['eager_range'][0]:.2f}-"
                  f"{r['eager_range'][1]:.2f}) | {r['compiled_ms']:.2f} "
                  f"({r['compiled_range'][0]:.2f}-{r['compiled_range'][1]:.2f}) | "
                  f"{r['speedup']:.2f}x | {r['compile_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
