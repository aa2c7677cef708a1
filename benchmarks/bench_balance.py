"""How evenly the planner balances mixes it was not tuned on: seeded families of table mixes,
each planned, its slowest rank against the mean and against the lower bound.

    .venv/bin/python benchmarks/bench_balance.py [--mixes 300] [--seed 0] [--replay SEED]
        [--jobs N] [--json PATH] [--large K] [--small K]

``--jobs 2`` plans two mixes at a time (for the balance figures; quote planning seconds from
``--jobs 1``, the default, as they share the cores otherwise); ``--json`` writes every mix's row.
``--large K``: K of the draws at 1,000 tables x 128 ranks, each planned 3 times (planning time).
``--small K``: K of the property tests' small mixes (``small_mix``, 3-59 tables on 1-16 ranks)
from ``--seed``: how many meet the rule (exit 1 if any does not).

A mix is drawn from its seed alone (``draw_mix``), so a printed seed replays it (``--replay``).
Families (cycled over the seeds):

- ``power-law``: Pareto row counts spanning 3-7 orders of magnitude;
- ``log-uniform``: row counts log-uniform over 3-7 orders of magnitude;
- ``dominant``: as log-uniform, plus 1-3 tables with 20-100x the rows and lookups of the rest;
- ``pressure``: as log-uniform, scaled so the weights fill 0.3x, 1x or 3x the compute tier
  of all ranks (capped at 80% of every tier together: a mix must fit somewhere).

Every mix: 10-2,000 tables (log-uniform), dims 16-512 (multiples of 16), pooling factors
log-uniform in [1, 200], 1-16 hosts x 1-8 ranks (each preset's own ranks per host where its
memory figures assume it), fp32 or fp16 weights, a topology preset; the other families' sizes
are scaled to 0.05-0.5x the compute tier. Per mix: planning seconds, the slowest rank's cost
over the mean (max/mean) and over the lower bound (``recscale.sharding.bounds``: no plan's
slowest rank is cheaper), and whether the bound allows balance (its largest unsplittable piece
at most the mean rank cost). Printed: per family the median, 95th percentile and worst of each,
the share of mixes meeting the balance rule (max/mean <= 1.05 where balance is possible, and
max <= 1.10 x max(mean, largest piece) everywhere), and the worst mixes' seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext

import numpy as np

from recscale.sharding import PlannerError, TableSpec, Topology, plan_sharding
from recscale.sharding.bounds import plan_lower_bound
from recscale.sharding.topology import PRESETS

FAMILIES = ("power-law", "log-uniform", "dominant", "pressure")
BATCH = 512  # per rank


def draw_mix(seed: int, large: bool = False) -> dict:
    """The mix of ``seed``: its family, tables, topology and planner options. ``large``: the
    same draw with 1,000 tables on 16 zionex hosts x 8 ranks in fp16 (the planning-time case)."""
    rng = np.random.default_rng([seed, 42])
    family = FAMILIES[seed % len(FAMILIES)]
    n = int(round(math.exp(rng.uniform(math.log(10), math.log(2000)))))
    preset = str(rng.choice(sorted(PRESETS)))
    lws = int(rng.integers(1, 9)) if preset == "cpu-local" else PRESETS[preset]["local_world_size"]
    hosts = int(rng.integers(1, 17))
    precision = str(rng.choice(["fp32", "fp16"]))
    if large:
        n, preset, lws, hosts, precision = 1000, "zionex", 8, 16, "fp16"
    topo = Topology.preset(preset, world_size=hosts * lws, local_world_size=lws)
    span = rng.uniform(3, 7)  # orders of magnitude of the row counts
    if family == "power-law":
        alpha = rng.uniform(0.8, 2.0)
        rows = 100 * (rng.pareto(alpha, n) + 1)
        rows = np.minimum(rows, 100 * 10 ** span)
    else:
        rows = 10 ** rng.uniform(2, 2 + span, n)
    dims = 16 * rng.integers(1, 33, n)
    pool = np.exp(rng.uniform(0, math.log(200), n))
    if family == "dominant":
        k = int(rng.integers(1, 4))
        rows[:k] = rows.max() * rng.uniform(20, 100, k)
        pool[:k] = pool.max() * rng.uniform(20, 100, k) / 10
    bytes_per = (2 if precision == "fp16" else 4)
    fast = topo.capacity(topo.compute_tier) * topo.world_size
    everything = sum(topo.capacity(t) for t in topo.tiers) * topo.world_size
    fill = float(rng.choice([0.3, 1.0, 3.0])) if family == "pressure" else rng.uniform(0.05, 0.5)
    target = min(fill * fast, 0.8 * everything)
    rows = rows * target / float((rows * dims * bytes_per).sum())
    rows = np.maximum(rows, 10).astype(np.int64)
    tables = [TableSpec(f"t{i:04d}", int(r), int(d), float(p))
              for i, (r, d, p) in enumerate(zip(rows, dims, pool))]
    return {"seed": seed, "family": family, "tables": tables, "topology": topo,
            "options": {"weight_precision": precision}, "fill": fill}


def small_mix(seed: int):
    """The property tests' mix of ``seed`` (tests/planner/test_sharding_properties.py): 3-59
    tables on 1-16 ranks of any preset, weights 0.05-1.5x the compute tier of all ranks ->
    (tables, topology, planner options); planned at a local batch of 256."""
    rng = np.random.default_rng([seed, 7])
    n = int(rng.integers(3, 60))
    preset = str(rng.choice(sorted(PRESETS)))
    lws = int(rng.integers(1, 5)) if preset == "cpu-local" else 4
    topo = Topology.preset(preset, world_size=lws * int(rng.integers(1, 5)), local_world_size=lws)
    rows = (10 ** rng.uniform(2, 2 + rng.uniform(2, 6), n)).astype(np.int64)
    dims = 16 * rng.integers(1, 17, n)
    pool = np.exp(rng.uniform(0, math.log(200), n))
    wp = 2 if rng.random() < 0.5 else 4
    fast = topo.capacity(topo.compute_tier) * topo.world_size
    scale = rng.uniform(0.05, 1.5) * fast / float((rows * dims * wp).sum())
    rows = np.maximum(10, (rows * scale)).astype(np.int64)
    tables = [TableSpec(f"t{i:02d}", int(r), int(d), float(p))
              for i, (r, d, p) in enumerate(zip(rows, dims, pool))]
    return tables, topo, {"weight_precision": "fp16" if wp == 2 else "fp32"}


def run_mix(seed: int, large: bool = False) -> dict:
    mix = draw_mix(seed, large)
    topo = mix["topology"]
    out = {"seed": seed, "family": mix["family"], "tables": len(mix["tables"]),
           "ranks": topo.world_size, "hosts": topo.num_hosts, "preset": topo.name,
           "fill": mix["fill"],
           "precision": mix["options"]["weight_precision"]}
    t0 = time.perf_counter()
    try:
        plan = plan_sharding(mix["tables"], topo, BATCH, mix["options"])
    except PlannerError as exc:
        out.update(seconds=time.perf_counter() - t0, error=str(exc).splitlines()[0])
        return out
    out["seconds"] = time.perf_counter() - t0
    out.update(balance(plan))
    return out


def balance(plan) -> dict:
    """A plan's balance figures and whether it meets the rule: max/mean <= 1.05 where the
    bound's largest unsplittable piece is at most the mean rank cost (balance is possible), and
    max <= 1.10 x max(mean, largest piece) everywhere. Where memory makes pieces share ranks the
    bound's coupled-pieces term (``sharding/coupled.py``, small mixes) is the least such
    "piece": the least slowest rank any placement of them allows."""
    lb = plan_lower_bound(plan)
    mean, mx = plan.mean_cost, plan.max_cost
    piece = max(lb.largest_piece, lb.coupled)
    out = dict(max_s=mx, mean_s=mean, bound_s=lb.value, piece_s=piece,
               max_over_mean=mx / mean, max_over_bound=mx / lb.value,
               balance_possible=piece <= mean,
               max_over_rule=mx / max(mean, piece))
    out["meets"] = (out["max_over_rule"] <= 1.10
                    and (not out["balance_possible"] or out["max_over_mean"] <= 1.05))
    return out


def _large(first: int, k: int) -> int:
    print("| seed | family | fill | planning s (median of 3) | runs | max/mean | max/bound | "
          "meets the rule |")
    print("|---|---|---|---|---|---|---|---|")
    medians = []
    for seed in range(first, first + k):
        runs = [run_mix(seed, large=True) for _ in range(3)]
        r = runs[0]
        secs = sorted(x["seconds"] for x in runs)
        medians.append(secs[1])
        if "error" in r:
            print(f"| {seed} | {r['family']} | {r['fill']:.2f} | {secs[1]:.2f} | "
                  f"{', '.join(f'{x:.2f}' for x in secs)} | did not fit: {r['error'][:80]} |||")
            continue
        print(f"| {seed} | {r['family']} | {r['fill']:.2f} | {secs[1]:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in secs)} | {r['max_over_mean']:.3f} | "
              f"{r['max_over_bound']:.3f} | {'yes' if r['meets'] else 'no'} |")
    print(f"\nplanning seconds, median of 3 per mix: worst {max(medians):.2f}, "
          f"median {float(np.median(medians)):.2f} over {k} mixes")
    return 0


def _small(first: int, k: int) -> int:
    print(f"property-test mixes {first}..{first + k - 1} (benchmarks' small_mix), local batch 256")
    rows = []
    for seed in range(first, first + k):
        tables, topo, opts = small_mix(seed)
        t0 = time.perf_counter()
        try:
            plan = plan_sharding(tables, topo, 256, opts)
        except PlannerError:
            rows.append({"seed": seed})
            continue
        rows.append({"seed": seed, "seconds": time.perf_counter() - t0, **balance(plan)})
    ok = [r for r in rows if "meets" in r]
    sec = [r["seconds"] for r in ok]
    print(f"{len(ok)} planned ({len(rows) - len(ok)} did not fit), "
          f"{sum(r['meets'] for r in ok)} meet the rule, "
          f"{sum(r['balance_possible'] for r in ok)} with balance possible; planning s median "
          f"{_q(sec, 0.5):.2f}, p95 {_q(sec, 0.95):.2f}, worst {max(sec, default=0):.2f}")
    for r in sorted(ok, key=lambda r: -r["max_over_rule"])[:5]:
        print(f"  seed {r['seed']}: max/mean {r['max_over_mean']:.3f}, over the rule's "
              f"max(mean, piece) {r['max_over_rule']:.3f}, balance possible "
              f"{r['balance_possible']}, {r['seconds']:.2f} s")
    return 0 if all(r["meets"] for r in ok) else 1


def _q(values, q):
    return float(np.quantile(np.asarray(values), q)) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixes", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0, help="the first mix's seed")
    ap.add_argument("--replay", type=int, default=None, help="plan one mix, print it in full")
    ap.add_argument("--worst", type=int, default=10, help="worst mixes to list")
    ap.add_argument("--jobs", type=int, default=1, help="mixes planned at a time")
    ap.add_argument("--json", default=None, help="write every mix's results to this file")
    ap.add_argument("--small", type=int, default=0, metavar="K",
                    help="instead: the property tests' small mixes, K from --seed: how many "
                         "meet the rule")
    ap.add_argument("--large", type=int, default=0, metavar="K",
                    help="instead: K mixes (from --seed) drawn at 1,000 tables x 128 zionex "
                         "ranks, fp16, each planned 3 times: median planning seconds")
    args = ap.parse_args(argv)
    if args.large:
        return _large(args.seed, args.large)
    if args.small:
        return _small(args.seed, args.small)
    if args.replay is not None:
        r = run_mix(args.replay)
        print(r)
        return 0
    results = []
    t0 = time.perf_counter()
    seeds = range(args.seed, args.seed + args.mixes)
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else nullcontext() as pool:
        rows = pool.map(run_mix, seeds) if pool is not None else map(run_mix, seeds)
        for i, r in enumerate(rows):
            results.append(r)
            if (i + 1) % 25 == 0:
                print(f"{i + 1}/{args.mixes} mixes, {time.perf_counter() - t0:.0f} s",
                      file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    ok = [r for r in results if "max_over_mean" in r]
    print(f"{len(results)} mixes (seeds {args.seed}..{args.seed + args.mixes - 1}), local batch "
          f"{BATCH}; {len(results) - len(ok)} did not fit\n")
    print("| family | mixes | balance possible | meets the rule | max/mean median | p95 | worst | "
          "max/bound median | p95 | worst | planning s median | p95 | worst |")
    print("|" + "|".join(["---"] * 13) + "|")
    for fam in (*FAMILIES, "all"):
        rs = [r for r in ok if fam == "all" or r["family"] == fam]
        if not rs:
            continue
        mm = [r["max_over_mean"] for r in rs]
        mb = [r["max_over_bound"] for r in rs]
        sec = [r["seconds"] for r in rs]
        cells = [fam, str(len(rs)), str(sum(r["balance_possible"] for r in rs)),
                 f"{sum(r['meets'] for r in rs)}/{len(rs)}"]
        for vals in (mm, mb, sec):
            cells += [f"{_q(vals, 0.5):.3f}", f"{_q(vals, 0.95):.3f}", f"{max(vals):.3f}"]
        print("| " + " | ".join(cells) + " |")
    print("\nworst mixes by max over max(mean, largest piece) (replay: --replay SEED):")
    for r in sorted(ok, key=lambda r: -r["max_over_rule"])[: args.worst]:
        print(f"  seed {r['seed']}: {r['family']}, {r['tables']} tables x {r['ranks']} ranks "
              f"({r['hosts']} hosts, {r['preset']}), {r['precision']}, fill {r['fill']:.2f}: max/mean "
              f"{r['max_over_mean']:.3f}, max/bound {r['max_over_bound']:.3f}, balance possible "
              f"{r['balance_possible']}, {r['seconds']:.2f} s")
    for r in results:
        if "error" in r:
            print(f"  seed {r['seed']} did not fit: {r['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
