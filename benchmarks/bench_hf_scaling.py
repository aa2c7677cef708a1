"""One Hessian-free iteration's time on paper, and checked on namespace hosts.

Model of one data-parallel HF iteration on N nodes at a fixed global batch B (curvature batch C):

    T(N) = t_grad(B/N) + K t_prod(C/N) + E t_eval(B/N)              compute, per node
         + (1 + K) ring(4 P bytes, N) + E ring(4 bytes, N)            all-reduces
    ring(m, N) = 2 (N-1)/N m / bw + 2 (N-1) alpha

K: CG iterations (products) per iteration, E: loss evaluations (CG-iterate backtracking + line
search), P: parameters. t_grad / t_prod / t_eval (a + b x rows) are measured here, one thread;
alpha and the link's effective rate are measured with gloo all-reduces between two namespace hosts.
Efficiency E(N) = T(1) / (N T(N)). Predicted for 4, 16 and 32 nodes at 10 and 100 Gbit/s for the
MNIST network (784-256-128-64-10, B 8000, C 2000) and the DLRM's dense arch (bench_large_batch's
model, 26 tables, B 65536, C 8192; the embeddings are not part of an HF iteration), then checked:
HF iterations with K fixed run on 2 and 3 namespace hosts (root; links shaped with tbf), measured
vs predicted. The hosts share this machine's cores, so compute there is not N independent nodes;
with a shaped link the all-reduces dominate, which is what the check is about.

    python benchmarks/bench_hf_scaling.py                 # calibrate, predict, check (~3 min)
    python benchmarks/bench_hf_scaling.py --rate 100mbit --iters 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.multihost.netns

DLRM_MODEL = {"embedding_dim": 16, "bottom_mlp": [64, 16], "top_mlp": [64, 1]}
NETS = {"mnist": {"batch": 8000, "curvature": 2000}, "dlrm_dense": {"batch": 65536,
                                                                     "curvature": 8192}}


# ------------------------------------------------------------------------ the two networks
class DLRMDense(nn.Module):
    """The DLRM's dense arch on fixed pooled embeddings: what an HF iteration differentiates."""

    def __init__(self):
        super().__init__()
        from recscale.config import parse
        from recscale.model import ModelConfig
        from recscale.model.dlrm import DenseArch

        self.arch = DenseArch(13, 26, parse(ModelConfig, DLRM_MODEL, "model"))

    def forward(self, x):
        return self.arch(x[:, :13], x[:, 13:])


def build(net: str, rows: int, seed: int = 0):
    """-> (model, inputs, targets, loss) with ``rows`` random rows (timing only)."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if net == "mnist":
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                              nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
        x = torch.rand(rows, 784, generator=g)
        y = torch.randint(0, 10, (rows,), generator=g)
        return model, x, y, lambda z, t: F.cross_entropy(z, t, reduction="sum")
    model = DLRMDense()
    x = torch.randn(rows, 13 + 26 * 16, generator=g)
    y = torch.randint(0, 2, (rows,), generator=g).float()
    return model, x, y, lambda z, t: F.binary_cross_entropy_with_logits(z, t, reduction="sum")


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------- calibration
def _median_time(fn, reps: int) -> float:
    fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def compute_costs(net: str, rows: int, reps: int = 5) -> dict[str, float]:
    """Seconds of a gradient, one Gauss-Newton product and a loss evaluation on ``rows`` rows."""
    from recscale.optim.curvature import gauss_newton_operator

    model, x, y, loss_fn = build(net, rows)
    params = list(model.parameters())

    def grad():
        torch.autograd.grad(loss_fn(model(x), y), params)

    out = model(x)
    op = gauss_newton_operator(loss_fn(out, y), out, params)
    v = torch.randn(n_params(model))

    def evaluate():
        with torch.no_grad():
            loss_fn(model(x), y)

    return {"grad": _median_time(grad, reps), "prod": _median_time(lambda: op(v), reps),
            "eval": _median_time(evaluate, reps)}


def calibrate(net: str, reps: int) -> dict[str, tuple[float, float]]:
    """a + b x rows per kind, from two sizes."""
    r1, r2 = 500, 4000
    c1, c2 = compute_costs(net, r1, reps), compute_costs(net, r2, reps)
    out = {}
    for k in c1:
        b = max((c2[k] - c1[k]) / (r2 - r1), 0.0)
        out[k] = (max(c1[k] - b * r1, 0.0), b)
    return out


def predict(cal, P: int, B: int, C: int, N: int, K: float, E: float, bw_bytes: float,
            alpha: float) -> dict[str, float]:
    def t(kind, rows):
        a, b = cal[kind]
        return a + b * rows

    compute = t("grad", B / N) + K * t("prod", C / N) + E * t("eval", B / N)

    def ring(m):
        return 0.0 if N == 1 else 2 * (N - 1) / N * m / bw_bytes + 2 * (N - 1) * alpha

    comm = (1 + K) * ring(4 * P) + E * ring(4)
    return {"compute_s": compute, "comm_s": comm, "total_s": compute + comm}


# --------------------------------------------------------------- workers on namespace hosts
def worker(a) -> int:
    """One rank: HF iterations with K CG iterations each on its B/N rows; prints JSON."""
    import torch.distributed as dist

    from recscale.optim import HessianFree, all_reduce_sum

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank,
                            world_size=a.world, timeout=timedelta(seconds=120))
    try:
        spec = NETS[a.net]
        rows, crow = spec["batch"] // a.world, spec["curvature"] // a.world
        model, x, y, loss_fn = build(a.net, rows, seed=1 + a.rank)
        params = list(model.parameters())
        for p in params:  # identical start
            dist.broadcast(p.data, 0)
        B, C = spec["batch"], spec["curvature"]
        opt = HessianFree(params, reduce=all_reduce_sum(), damping=1.0, cg_max_iters=a.k,
                          cg_min_iters=a.k, cg_tol=1e-30, cg_residual_tol=0.0,
                          backtracking=False, warm_start_decay=0.0)

        def closure():
            out = model(x)
            return loss_fn(out, y) / B, out

        def curvature():
            out = model(x[:crow])
            return loss_fn(out, y[:crow]) / C, out

        times, evals, iters = [], [], []
        for _ in range(a.iters + 1):
            dist.barrier()
            t = time.perf_counter()
            opt.step(closure, curvature)
            times.append(time.perf_counter() - t)
            evals.append(opt.last_step.loss_evals)
            iters.append(opt.last_step.cg_iters)
        # allreduce calibration: a P-float vector and one float
        v, s = torch.zeros(n_params(model)), torch.zeros(1)
        big = [_timed_allreduce(v) for _ in range(5)]
        small = [_timed_allreduce(s) for _ in range(20)]
        if a.rank == 0:
            print(json.dumps({"step_s": statistics.median(times[1:]), "evals": evals[1:],
                              "cg_iters": iters[1:], "allreduce_P_s": statistics.median(big),
                              "allreduce_1_s": statistics.median(small),
                              "P": n_params(model)}), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


def _timed_allreduce(t: torch.Tensor) -> float:
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(t)
    return time.perf_counter() - t0


def run_on_hosts(n: int, rate: str | None, net: str, k: int, iters: int) -> dict:
    from tests.multihost import netns as N

    with N.NamespaceHosts(n, prefix="rshf", rate=rate) as hosts:
        master = f"{hosts[0].addr}:29611"
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
        procs = [h.popen([sys.executable, __file__, "worker", "--rank", str(i), "--world",
                          str(n), "--master", master, "--net", net, "--k", str(k), "--iters",
                          str(iters)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True) for i, h in enumerate(hosts)]
        outs = []
        for i, p in enumerate(procs):
            try:
                o, e = p.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise RuntimeError(f"rank {i} on namespace host {i} did not finish in 300 s") from None
            if p.returncode:
                raise RuntimeError(f"rank {i} on namespace host {i} failed: {e[-2000:]}")
            outs.append(o)
    return json.loads([line for line in outs[0].splitlines() if line.startswith("{")][-1])


# ------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    for name, tp in (("--rank", int), ("--world", int), ("--master", str), ("--net", str),
                     ("--k", int), ("--iters", int)):
        w.add_argument(name, type=tp, required=True)
    ap.add_argument("--rate", default="100mbit", help="tbf rate of the namespace links")
    ap.add_argument("--k", type=int, default=10, help="CG iterations per HF iteration")
    ap.add_argument("--iters", type=int, default=3, help="HF iterations measured per run")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hosts", type=int, nargs="*", default=[2, 3])
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.cmd == "worker":
        return worker(a)
    torch.set_num_threads(1)
    from tests.multihost import netns as N

    ok, why = N.available()
    report = {"rate": a.rate, "k": a.k, "nets": {}}
    for net, spec in NETS.items():
        cal = calibrate(net, a.reps)
        P = n_params(build(net, 1)[0])
        B, C = spec["batch"], spec["curvature"]
        print(f"\n{net}: {P:,} parameters, global batch {B}, curvature batch {C}, K = {a.k} "
              "CG iterations per HF iteration; compute per rows (1 thread): "
              + ", ".join(f"{k} {1e3 * c[0]:.2f} ms + {1e6 * c[1]:.2f} us/row"
                          for k, c in cal.items()), flush=True)
        entry = {"P": P, "calibration": cal, "measured": {}, "predicted": {}}
        # the check on namespace hosts: measured per-iteration time vs the model
        meas = {}
        if ok:
            for n in a.hosts:
                meas[n] = run_on_hosts(n, a.rate, net, a.k, a.iters)
        else:
            print(f"  namespace hosts: skipped ({why})")
        E = statistics.mean(meas[min(meas)]["evals"]) if meas else 2.0
        alpha = meas[2]["allreduce_1_s"] / 2 if 2 in meas else 50e-6  # 2 (N-1) = 2 rounds
        rate_b = N.parse_rate(a.rate) / 8 if a.rate else 1e9
        eff_bw = (4 * P / meas[2]["allreduce_P_s"]) if 2 in meas else rate_b
        print(f"  links {a.rate}: all-reduce of 1 float {1e3 * 2 * alpha:.2f} ms (alpha "
              f"{1e6 * alpha:.0f} us), of {4 * P / 1e6:.2f} MB {1e3 * meas[2]['allreduce_P_s']:.1f} "
              f"ms on 2 hosts ({eff_bw / rate_b:.2f} x the tbf rate)" if 2 in meas else "")
        print("  | hosts | link | measured s / iteration | predicted | compute | all-reduce |")
        print("  |---|---|---|---|---|---|")
        for n, m in sorted(meas.items()):
            p = predict(cal, P, B, C, n, a.k, statistics.mean(m["evals"]), eff_bw, alpha)
            # the hosts share 2 cores: compute measured with n processes on them
            p_shared = dict(p, compute_s=p["compute_s"] * max(1.0, n / 2))
            p_shared["total_s"] = p_shared["compute_s"] + p["comm_s"]
            entry["measured"][n] = {**m, "predicted": p, "predicted_shared_cores": p_shared}
            print(f"  | {n} | {a.rate} | {m['step_s']:.3f} | {p_shared['total_s']:.3f} "
                  f"({p_shared['total_s'] / m['step_s']:.2f}x) | {p_shared['compute_s']:.3f} | "
                  f"{p['comm_s']:.3f} |")
        t1 = predict(cal, P, B, C, 1, a.k, E, 1.0, 0.0)["total_s"]
        print(f"  predicted efficiency T(1) / (N T(N)), T(1) = {t1:.3f} s, alpha 20 us "
              "(a datacenter network's all-reduce step), the link's full rate:")
        print("  | nodes | 10 Gbit/s: s / iteration | efficiency | 100 Gbit/s: s / iteration | "
              "efficiency |")
        print("  |---|---|---|---|---|")
        for n in (4, 16, 32):
            row = []
            for gbit in (10, 100):
                p = predict(cal, P, B, C, n, a.k, E, gbit * 1e9 / 8, 20e-6)
                eff = t1 / (n * p["total_s"])
                entry["predicted"][f"{n}@{gbit}"] = {**p, "efficiency": eff}
                row += [f"{p['total_s']:.4f}", f"{100 * eff:.0f}%"]
            print(f"  | {n} | " + " | ".join(row) + " |")
        report["nets"][net] = entry
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
