"""A job across 2 namespace hosts x 2 ranks against 1 host x 4 ranks, with the link between the
hosts shaped to 100 Mbit/s and 1 Gbit/s: samples/s and inter-host bytes per step for flat vs
hierarchical exchanges and fp32 / fp16 / fp8 wire precision. Needs root (network namespaces).

    sudo .venv/bin/python benchmarks/bench_multihost.py            # everything (~10 min)
    sudo .venv/bin/python benchmarks/bench_multihost.py --quick    # 100 Mbit/s, dim 128 only

Every job runs the way a user runs one: the driver trains through ``train_dlrm`` (as the Kedro
node does) in host 0 and host 1 runs ``recscale join``. Both hosts are namespaces of this
2-core machine, so 4 ranks share 2 cores whether they are on one host or two: compare ratios,
not absolute rates. The 1-host baseline runs the same variant with nnodes 1 and a one-host plan.

Variants (the same 26 tables of the synthetic Criteo data, dim 16 or 128, 128 rows per rank):
- flat: every table row_wise over all 4 ranks, dense gradients all-reduced in one flat ring;
- hier: every table table_row_wise inside one host (tables alternate between the hosts), the
  two-stage exchange and the hierarchical dense reduction.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repo root: tests.multihost

from tests.multihost import netns as N  # noqa: E402
from tests.multihost.harness import _env, config, drive_cmd, join_cmd  # noqa: E402
from tests.multihost.jobs import finish, make_dataset  # noqa: E402

VARIANTS = {  # name: (plan kinds, dense reduction, forward, backward, dense all-reduce)
    "flat fp32": ("row_wise", "flat", "fp32", "fp32", "fp32"),
    "flat fp16": ("row_wise", "flat", "fp16", "fp16", "fp16"),
    "hier fp32": ("table_row_wise", "hierarchical", "fp32", "fp32", "fp32"),
    "hier fp16": ("table_row_wise", "hierarchical", "fp16", "fp16", "fp16"),
    "hier fp8": ("table_row_wise", "hierarchical", "fp8", "fp8", "fp16"),
}
DIMS = {"d16": dict(embedding_dim=16, bottom_mlp=[512, 256, 64, 16], top_mlp=[512, 256, 1]),
        "d128": dict(embedding_dim=128, bottom_mlp=[512, 256, 128], top_mlp=[512, 256, 1])}
PORT = 29450


def job_config(endpoint, nnodes, ckpt, dim, variant, steps, batch):
    kinds, reduction, fwd, bwd, dense = VARIANTS[variant]
    cfg = config(endpoint, 4, nnodes, ckpt, max_steps=steps, batch_size_per_rank=batch,
                 dense_reduction=reduction if nnodes > 1 else "flat",
                 checkpoint={"every_steps": 0}, log_every=steps)
    cfg["model"] = DIMS[dim]
    cfg["sharding"]["local_world_size"] = 2 if nnodes > 1 else 4
    cfg["comms"] = {"forward": fwd, "backward": bwd, "dense_allreduce": dense}
    return cfg, f"kinds:{kinds}"


def _result(out: Path) -> dict:
    r = json.loads((out / "result.json").read_text())
    e = r["extra"]
    return {"samples_per_s": e["samples_per_s"],
            "inter_host_bytes": e.get("bytes_per_step.inter_host", 0.0),
            "embedding_inter_host_bytes": e.get("bytes_per_step.embedding.inter_host", 0.0)}


def run_two_hosts(hosts, tmp, name, dataset, dim, variant, steps, batch, timeout):
    ep = f"{hosts[0].addr}:{PORT}"
    cfg, plan = job_config(ep, 2, tmp / f"ck-{name}", dim, variant, steps, batch)
    kw = dict(env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    driver = hosts[0].popen(drive_cmd(tmp, name, dataset, cfg, plan), **kw)
    joiner = hosts[1].popen(join_cmd(ep), **kw)
    for who, p in (("driver", driver), ("joining host", joiner)):
        finish(p, f"{name}: the {who}", timeout)
    return _result(tmp / name)


def run_one_host(tmp, name, dataset, dim, variant, steps, batch, timeout):
    cfg, plan = job_config("127.0.0.1:0", 1, tmp / f"ck-{name}", dim, variant, steps, batch)
    res = subprocess.run(drive_cmd(tmp, name, dataset, cfg, plan), env=_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise SystemExit(f"{name} failed:\n{res.stdout[-2000:]}{res.stderr[-4000:]}")
    return _result(tmp / name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"])
    ap.add_argument("--dims", nargs="+", default=list(DIMS), choices=list(DIMS))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=128, help="rows per rank per step")
    ap.add_argument("--reps", type=int, default=1, help="runs per cell (median)")
    ap.add_argument("--quick", action="store_true", help="100mbit, d128, flat fp32 vs hier fp16")
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args(argv)
    if args.quick:
        args.rates, args.dims, args.variants = ["100mbit"], ["d128"], ["flat fp32", "hier fp16"]
    ok, why = N.available()
    if not ok:
        print(f"cannot make namespace hosts here: {why}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-multihost-"))
    atexit.register(shutil.rmtree, tmp, True)  # data, checkpoints, models: gigabytes
    print("making the data ...", flush=True)
    dataset = make_dataset(tmp / "data")
    rows = []
    single: dict[tuple[str, str], float] = {}
    for dim in args.dims:
        for v in args.variants:
            runs = [run_one_host(tmp, f"one-{dim}-{v.replace(' ', '-')}-{k}", dataset, dim, v,
                                 args.steps, args.batch, args.timeout)
                    for k in range(args.reps)]
            single[dim, v] = statistics.median(r["samples_per_s"] for r in runs)
            print(f"1 host x 4, {dim}, {v}: {single[dim, v]:,.0f} samples/s", flush=True)
    for rate in args.rates:
        with N.NamespaceHosts(2, rate=rate, prefix="rsbm") as hosts:
            for dim in args.dims:
                base = None
                for v in args.variants:
                    t0 = time.perf_counter()
                    runs = [run_two_hosts(hosts, tmp, f"two-{rate}-{dim}-{v.replace(' ', '-')}-{k}",
                                          dataset, dim, v, args.steps, args.batch, args.timeout)
                            for k in range(args.reps)]
                    sps = statistics.median(r["samples_per_s"] for r in runs)
                    inter = statistics.median(r["inter_host_bytes"] for r in runs)
                    if v == "flat fp32":
                        base = sps
                    rows.append((rate, dim, v, inter, sps, sps / single[dim, v],
                                 sps / base if base else float("nan")))
                    print(f"2 hosts x 2, {rate}, {dim}, {v}: {sps:,.0f} samples/s, "
                          f"{inter / 1e6:.2f} MB/step across hosts "
                          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    cmd = "python benchmarks/bench_multihost.py " + " ".join(argv or sys.argv[1:])
    print(f"\n`{cmd.strip()}` ({args.steps} steps of {args.batch} rows per rank, "
          f"median of {args.reps})\n")
    print("| link | dim | variant | inter-host MB/step | samples/s | vs 1 host x 4 | "
          "vs flat fp32 |")
    print("|---|---|---|---|---|---|---|")
    for rate, dim, v, inter, sps, vs1, vsflat in rows:
        print(f"| {rate} | {dim} | {v} | {inter / 1e6:.2f} | {sps:,.0f} | {vs1:.2f}x | "
              f"{vsflat:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
