"""Predicted vs measured step time, before and after calibration, for (config, plan) pairs run
through recscale's training entry (``train_dlrm``: the loader, the one loop, the pipelined
policy) on this machine.

    nice -n 5 python benchmarks/bench_costmodel.py                 # 9 pairs, ~3 min on 2 cores
    nice -n 5 python benchmarks/bench_costmodel.py --steps 10 --reps 2 --only 2r

One calibration (``recscale.measure.calibrate``, what ``recscale calibrate`` runs) measures this
machine; every config is planned once on the calibrated topology and trained ``--reps`` times.
"before" costs the same plan on the preset (``cpu-local``, as ``plan_for_run`` budgets it),
"after" on the calibrated topology; both through ``recscale.sharding.step_time.predict_step``
(dense part and overlap included). Measured: the slowest rank's mean step time of a run after
its first 2 steps (warm-up; loader waits excluded), median over the reps. Goal: after
calibration every prediction within 20% of the measured median, and the configs ranked in the
same order as measured (pairs in the same order, out of all pairs, printed; each pair out of
order with its runs' ranges, which overlap where the measurement itself cannot order them).

This machine's speed drifts for longer than a calibration takes (a 2-vCPU VM: one core at half
the other's matmul rate for seconds, whole runs 20% apart minutes apart). So each round of
repetitions also calibrates again (one sweep per layout), merged with the ones before as
``recscale calibrate --merge`` merges them (``merge_calibrations``: the fit of the median of the
kept calibrations' points), and "after (merged)" costs the same plans on the last merge: what a
user who calibrates at different times (or before every run) plans on. "after" is the one
calibration a user runs before training. ``--no-merge`` skips the extra calibrations.

On a CPU the DDR tier is the compute tier (the in-memory tier); ``ssd`` configs give the run a RAM
budget so the planner spills the large tables to the SSD-backed cache. Calibration runs once per
layout (1 rank; 2 ranks measuring at the same time), with the threads per rank training uses
(``--threads``, default 1).

``--hosts 2`` (root: network namespaces) adds jobs across 2 namespace hosts x 1 rank whose link is
shaped to ``--rate``: the link is calibrated by ``recscale calibrate --link-endpoint`` run in both
hosts with the jobs' batch and dense arch (its rate and CPU cost fitted on training steps run
across the link; the rest of the topology is the 2-rank calibration: the same 2 cores), each job
runs as a user runs one (the driver in host 0 plans on the calibrated file, host 1 runs
``recscale join``), and "before" is the preset with 1 rank per host.

    sudo nice -n 5 .venv/bin/python benchmarks/bench_costmodel.py --hosts 2 --rate 1gbit
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from recscale.config import parse
from recscale.data.schema import FittedSchema
from recscale.measure import calibrate, config_for_run
from recscale.measure.history import merge_calibrations
from recscale.model import ModelConfig, dense_spec
from recscale.runconfig import DLRMConfig, plan_for_run
from recscale.sharding import Topology
from recscale.sharding.step_time import predict_step
from recscale.train import train_dlrm

ROOT = Path(__file__).resolve().parents[1]
# across namespace hosts, 1 rank each: name: (dim, comms precision)
HOST_CONFIGS = {"2h-d16-fp32": (16, "fp32"), "2h-d128-fp32": (128, "fp32"),
                "2h-d16-fp16": (16, "fp16"), "2h-d128-fp16": (128, "fp16")}
HOST_PORT = 29630

# name: (ranks, dim, tier, comms precision)
CONFIGS = {
    "1r-d16-mem": (1, 16, "memory", "fp32"),
    "1r-d128-mem": (1, 128, "memory", "fp32"),
    "1r-d16-ssd": (1, 16, "ssd", "fp32"),
    "1r-d128-ssd": (1, 128, "ssd", "fp32"),
    "2r-d16-mem-fp32": (2, 16, "memory", "fp32"),
    "2r-d128-mem-fp32": (2, 128, "memory", "fp32"),
    "2r-d128-mem-fp16": (2, 128, "memory", "fp16"),
    "2r-d16-ssd-fp16": (2, 16, "ssd", "fp16"),
    "2r-d128-ssd-fp32": (2, 128, "ssd", "fp32"),
}


def make_data(root: Path, rows: int) -> dict:
    from recscale.data.preprocess import PreprocessConfig, load_manifest, preprocess_criteo
    from recscale.data.synthetic import SyntheticConfig, generate_criteo_tsv

    scfg = SyntheticConfig(num_rows=rows, seed=0, cardinality_scale=0.01,
                           keep_cardinality_below=1000)
    rep = generate_criteo_tsv(scfg, root / "day_00.tsv")
    out = root / "parquet"
    preprocess_criteo([rep.path], out, PreprocessConfig(row_group_size=8192, workers=1,
                                                        max_table_size=200_000), rep.cardinalities)
    return load_manifest(out)


def prepare_config(name, spec, manifest, cal_topo, args, scratch) -> dict:
    """One config: its run config, its plan on the calibrated topology and the predictions."""
    ranks, dim, tier, prec = spec
    # the ssd configs: RAM for this share of the tables' bytes (weights + row-wise state)
    budget = int(args.ram_share * sum(manifest["table_sizes"]) * (dim * 4 + 4) / ranks)
    train = {"batch_size_per_rank": args.batch, "max_steps": args.steps, "progress": "off",
             "num_threads": args.threads, "checkpoint": {"dir": None}, "log_every": 1000,
             "launch": {"world_size": ranks},
             "embedding_optimizer": {"name": "exact_rowwise_adagrad"},
             "tiers": {"scratch_dir": scratch, "ram_budget_bytes": budget if tier == "ssd" else None}}
    cfg = parse(DLRMConfig, {"model": {"embedding_dim": dim, "bottom_mlp": [128, 64, dim],
                                       "top_mlp": [128, 64, 1]},
                             "comms": {"forward": prec, "backward": prec},
                             "sharding": {"topology": "cpu-local"}, "train": train}, "")
    plan = plan_for_run(manifest, cfg, measured=cal_topo)
    dense = dense_spec(cfg.model, len(manifest["table_sizes"]), FittedSchema.of(manifest).num_dense)
    preset = cfg.train.tiers.budgeted(cfg.sharding.topology_for(ranks))
    before = predict_step(plan, dense, cfg.train.pipeline, topology=preset)
    after = predict_step(plan, dense, cfg.train.pipeline)
    tiers = sorted({s.tier for t in plan.tables for s in t.shards})
    return {"name": name, "cfg": cfg, "plan": plan, "ranks": ranks, "before": before,
            "after": after, "after_merged": after, "dense": dense, "pipeline": cfg.train.pipeline,
            "tiers": "+".join(tiers), "steps": [], "comps": [], "comms": []}


def train_once(prep: dict, manifest) -> None:
    """One training run of a prepared config; its slowest rank's step, compute and comm."""
    cfg = prep["cfg"]
    out = train_dlrm(manifest, cfg.model, cfg.train, plan=prep["plan"], comms=cfg.comms)
    record(prep, out.result.extra)


def record(prep: dict, ex: dict) -> None:
    slow = max(range(prep["ranks"]), key=lambda r: ex[f"rank{r}.step_ms"])
    prep["steps"].append(ex[f"rank{slow}.step_ms"])
    prep["comps"].append(ex[f"rank{slow}.compute_ms"])
    prep["comms"].append(ex[f"rank{slow}.comm_ms"])


def result_row(prep: dict, name: str | None = None) -> dict:
    after, steps = prep["after"], prep["steps"]
    slow_pred = max(range(prep["ranks"]), key=lambda r: after.compute[r])
    return {"name": name or prep["name"], "tiers": prep["tiers"],
            "measured": statistics.median(steps),
            "measured_compute": statistics.median(prep["comps"]),
            "measured_comm": statistics.median(prep["comms"]),
            "before": prep["before"].step * 1e3, "after": after.step * 1e3,
            "after_merged": prep["after_merged"].step * 1e3,
            "after_compute": after.compute[slow_pred] * 1e3,
            "after_comm": after.comm[slow_pred] * 1e3, "spread": (min(steps), max(steps))}


def run_hosts(args, root: Path, manifest, cal2, merged2: Topology) -> list[dict]:
    """The ``--hosts`` part (see the module docstring): one row per HOST_CONFIGS entry."""
    import json
    import subprocess

    sys.path.insert(0, str(ROOT))
    from tests.multihost import netns as N
    from tests.multihost.harness import _env, config, start_job
    from tests.multihost.jobs import finish

    ok, why = N.available()
    if not ok:
        raise SystemExit(f"--hosts: cannot make namespace hosts here: {why}")
    kw = dict(env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rows = []
    rate = None if args.rate == "none" else args.rate
    with N.NamespaceHosts(args.hosts, rate=rate, prefix="rscm") as hosts:
        # the 2-rank calibration (this machine's cores shared by 2 ranks), 1 rank per host, and
        # the link measured between the hosts
        base = cal2.topology.for_world(args.hosts, 1)
        base_file = base.save(root / "hosts-base.yml")
        topo_file = root / "hosts-calibrated.yml"
        ep = f"{hosts[0].addr}:{HOST_PORT}"
        cmd = [sys.executable, "-m", "recscale", "calibrate", "--link-endpoint", ep,
               "--link-hosts", str(args.hosts), "--base", str(base_file), "--out", str(topo_file),
               "--batch", str(args.batch), "--bottom-mlp", "128,64,16", "--top-mlp", "128,64,1"]
        procs = [h.popen(cmd + ["--link-rank", str(i)], **kw) for i, h in enumerate(hosts)]
        outs = [finish(p, f"link calibration on host {i}", 120) for i, p in enumerate(procs)]
        print("\n".join("  " + line for line in outs[0].strip().splitlines()
                         if line.startswith(("link across", "  the training step",
                                             "  the link's rate"))), flush=True)
        cal_topo = Topology.load(topo_file)
        preps = {}
        for n, (name, (dim, prec)) in enumerate(HOST_CONFIGS.items()):
            if args.only and not any(o in name for o in args.only.split(",")):
                continue
            cfg = config(f"{hosts[0].addr}:{HOST_PORT}", args.hosts, args.hosts,
                         root / f"ck-{name}", max_steps=args.steps,
                         batch_size_per_rank=args.batch, num_threads=args.threads,
                         log_every=1000, checkpoint={"every_steps": 0})
            cfg["model"] = {"embedding_dim": dim, "bottom_mlp": [128, 64, dim],
                            "top_mlp": [128, 64, 1]}
            cfg["sharding"] = {"local_world_size": 1, "topology": str(topo_file)}
            cfg["comms"] = {"forward": prec, "backward": prec}
            cfg["train"]["embedding_optimizer"] = {"name": "exact_rowwise_adagrad"}
            dcfg = parse(DLRMConfig, cfg, "")
            plan = plan_for_run(manifest, dcfg)  # what the driver plans (deterministic)
            dense = dense_spec(dcfg.model, len(manifest["table_sizes"]),
                               FittedSchema.of(manifest).num_dense)
            preset = Topology.preset("cpu-local", world_size=args.hosts, local_world_size=1)
            preps[name] = {
                "n": n, "cfg": cfg, "ranks": args.hosts, "tiers": "ddr",
                "before": predict_step(plan, dense, dcfg.train.pipeline, topology=preset),
                "after": predict_step(plan, dense, dcfg.train.pipeline,
                                      topology=cal_topo.for_world(args.hosts, 1)),
                # the merged calibrations' host, with the link as measured
                "after_merged": predict_step(plan, dense, dcfg.train.pipeline, topology=replace(
                    merged2.for_world(args.hosts, 1), inter_node_lat_s=cal_topo.inter_node_lat_s,
                    inter_node_bw=cal_topo.inter_node_bw,
                    inter_node_cpu_bw=cal_topo.inter_node_cpu_bw,
                    inter_node_cpu_s=cal_topo.inter_node_cpu_s,
                    inter_node_burst_bytes=cal_topo.inter_node_burst_bytes)),
                "steps": [], "comps": [], "comms": []}
        # the repetitions in rounds over the configs: a slow spell of the machine hits them alike
        for rep in range(args.reps):
            for name, prep in preps.items():
                cfg = prep["cfg"]
                port = HOST_PORT + 1 + prep["n"] * args.reps + rep
                cfg["train"]["launch"]["rdzv_endpoint"] = f"{hosts[0].addr}:{port}"
                cfg["train"]["checkpoint"]["dir"] = str(root / f"ck-{name}-{rep}")
                out = root / f"job-{name}-{rep}"
                driver, joiners = start_job(hosts, root, out.name, root / "parquet", cfg)
                finish(driver, f"{name}: the driver", 300)
                for i, j in enumerate(joiners, 1):
                    finish(j, f"{name}: host {i}", 60)
                record(prep, json.loads((out / "result.json").read_text())["extra"])
        for name, prep in preps.items():
            rows.append(result_row(prep, f"{name}-{args.rate}"))
            r = rows[-1]
            print(f"  {name}: measured {r['measured']:.2f} ms, before {r['before']:.2f}, after "
                  f"{r['after']:.2f}, after (merged) {r['after_merged']:.2f}", flush=True)
    return rows


def concordant(rows, key, separated: bool = False) -> tuple[int, int]:
    """Pairs whose predictions (``key``) are in the order of their measured medians, out of all
    pairs; ``separated``: only the pairs the measurement itself orders (their runs' [min, max]
    ranges do not overlap: a pair whose ranges overlap swaps order between runs)."""
    ok = n = 0
    for a, b in itertools.combinations(rows, 2):
        if separated and not (a["spread"][1] < b["spread"][0] or b["spread"][1] < a["spread"][0]):
            continue
        n += 1
        ok += (a["measured"] - b["measured"]) * (a[key] - b[key]) > 0
    return ok, n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--batch", type=int, default=1024, help="per-rank batch")
    p.add_argument("--rows", type=int, default=60_000)
    p.add_argument("--ram-share", type=float, default=0.5,
                   help="the ssd configs' RAM per rank for embeddings: this share of the "
                   "tables' bytes over the ranks")
    p.add_argument("--threads", type=int, default=1, help="threads per rank, in calibration "
                   "and training alike (default 1: 2 ranks x 1 on 2 cores)")
    p.add_argument("--only", default="", help="run the configs whose name contains one of "
                   "these (comma-separated)")
    p.add_argument("--hosts", type=int, default=0, help="also run HOST_CONFIGS across this many "
                   "namespace hosts, 1 rank each (root; 0: not)")
    p.add_argument("--no-merge", dest="merge", action="store_false", help="skip the "
                   "calibration before each round (the 'after (merged)' column)")
    p.add_argument("--cal-seconds", type=float, default=20.0, help="the calibration's "
                   "minimum time per layout (recscale calibrate's --min-seconds; default "
                   "%(default)s, as its default)")
    p.add_argument("--rate", default="1gbit", help="the namespace hosts' links (tc tbf rate; "
                   "none: unshaped veth)")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-costmodel-"))
    try:  # its data, SSD files and the host jobs' outputs: gigabytes, removed at the end
        return _run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(args, root: Path) -> int:
    scratch = str(root / "tiers")
    t0 = time.perf_counter()
    manifest = make_data(root, args.rows)
    print(f"data: {args.rows} rows, {len(manifest['table_sizes'])} tables "
          f"(largest {max(manifest['table_sizes']):,} rows) in {time.perf_counter() - t0:.0f} s",
          flush=True)
    # calibrate each layout a config runs: 1 rank using both cores, 2 ranks sharing them
    # the configs' dense arch (the dim varies; calibration measures it at each of its dims), as
    # the sharding pipeline's calibrate node passes the run's model
    model = ModelConfig(embedding_dim=16, bottom_mlp=(128, 64, 16), top_mlp=(128, 64, 1))
    T = len(manifest["table_sizes"])
    layouts = sorted({spec[0] for spec in CONFIGS.values()})

    def cal_cfg(rounds, min_seconds=0.0):  # the in-memory tier on the data's tables, as the
        # sharding pipeline's calibrate node measures it
        return config_for_run(args.batch, manifest["table_sizes"], scratch_dir=scratch,
                              num_threads=args.threads, rounds=rounds, min_seconds=min_seconds)

    def base(ws):
        return Topology.preset("cpu-local", world_size=ws)

    cals = {ws: calibrate(base(ws), cal_cfg(3, args.cal_seconds), model, T, progress_mode="off")
            for ws in layouts}
    from recscale.measure.cli import format_calibration

    for ws, c in cals.items():
        print(f"calibration, {ws} rank(s) per host, {c.seconds:.1f} s, {c.sweeps} sweeps:\n"
              f"{format_calibration(c)}",
              flush=True)
    preps = [prepare_config(name, spec, manifest, cals[spec[0]].topology, args, scratch)
             for name, spec in CONFIGS.items()
             if not args.only or any(o in name for o in args.only.split(","))]
    # the repetitions in rounds over the configs: a slow spell of the machine hits them alike.
    # Each round also calibrates again (one sweep per layout), merged with the calibrations
    # before it as `recscale calibrate --merge` does: "after (merged)" costs the same plans on
    # the last merge, where "after" is the one calibration a user runs before training
    kept = {ws: str(root / f"calibrations-{ws}.points.json") for ws in layouts}
    merged = {ws: merge_calibrations(base(ws), cals[ws], kept[ws], cal_cfg(1), T)[0]
              for ws in layouts}
    for _ in range(args.reps):
        if args.merge:
            for ws in layouts:
                merged[ws] = merge_calibrations(base(ws), calibrate(
                    base(ws), cal_cfg(1), model, T, progress_mode="off"), kept[ws], cal_cfg(1),
                    T)[0]
        for prep in preps:
            train_once(prep, manifest)
    for prep in preps:
        prep["after_merged"] = predict_step(prep["plan"], prep["dense"], prep["pipeline"],
                                            topology=merged[prep["ranks"]].topology)
    rows = [result_row(p) for p in preps]
    for r in rows:
        print(f"  {r['name']}: measured {r['measured']:.2f} ms, before {r['before']:.2f}, after "
              f"{r['after']:.2f}, after (merged) {r['after_merged']:.2f}", flush=True)
    if args.hosts:
        rows += run_hosts(args, root, manifest, cals[2], merged[2].topology)
    print(f"\nper-step time (ms), measured median of {args.reps} runs x {args.steps} steps, "
          f"batch {args.batch}/rank; predicted before (preset cpu-local) / after calibration")
    head = (f"{'config':<18} {'tiers':<8} {'measured':>9} {'[min-max]':>13} {'before':>8} "
            f"{'ratio':>6} {'after':>8} {'ratio':>6} {'merged':>8} {'ratio':>6} {'meas c/m':>13} "
            f"{'pred c/m':>13}")
    print(head)
    for r in rows:
        print(f"{r['name']:<18} {r['tiers']:<8} {r['measured']:>9.2f} "
              f"{r['spread'][0]:>6.1f}-{r['spread'][1]:<6.1f} {r['before']:>8.2f} "
              f"{r['measured'] / r['before']:>6.2f} {r['after']:>8.2f} "
              f"{r['measured'] / r['after']:>6.2f} {r['after_merged']:>8.2f} "
              f"{r['measured'] / r['after_merged']:>6.2f} "
              f"{r['measured_compute']:>6.1f}/{r['measured_comm']:<6.1f} "
              f"{r['after_compute']:>6.1f}/{r['after_comm']:<6.1f}")
    keys = ("before", "after", "after_merged") if args.merge else ("before", "after")
    print()
    for k in keys:
        within = sum(abs(r["measured"] / r[k] - 1) <= 0.2 for r in rows)
        err = statistics.median(abs(r["measured"] / r[k] - 1) for r in rows)
        c, n = concordant(rows, k)
        sc, m = concordant(rows, k, separated=True)
        print(f"{k:<13} within 20% of measured {within}/{len(rows)}, median |measured / "
              f"predicted - 1| {err:.2f}, pairs ranked as measured {c}/{n}, of the pairs whose "
              f"runs' ranges do not overlap {sc}/{m}")
        for a, b in itertools.combinations(rows, 2):
            if k != "before" and (a["measured"] - b["measured"]) * (a[k] - b[k]) <= 0:
                overlap = not (a["spread"][1] < b["spread"][0] or b["spread"][1] < a["spread"][0])
                print(f"  out of order: {a['name']} {a['measured']:.1f} vs {b['name']} "
                      f"{b['measured']:.1f} measured ({abs(a['measured'] / b['measured'] - 1):.0%}"
                      f" apart; runs {a['spread'][0]:.1f}-{a['spread'][1]:.1f} vs "
                      f"{b['spread'][0]:.1f}-{b['spread'][1]:.1f}, "
                      f"{'overlapping' if overlap else 'separated'}), predicted {a[k]:.1f} vs "
                      f"{b[k]:.1f}")
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
