"""Golden outputs of the sharding planner: plan many inputs and compare with a saved run.

    PYTHONPATH=src .venv/bin/python benchmarks/planner_golden.py            # compare
    PYTHONPATH=src .venv/bin/python benchmarks/planner_golden.py --write    # record anew
    ... --out /tmp/planner_golden.json.gz --only rand  # full outputs of the matching cases

    ... --fast                   # the cases under 0.5 s when recorded (tests/planner runs these)

A refactor of ``recscale.sharding`` that must not change any plan is checked with this script:
every case's output (``plan.to_dict()`` without ``planning_seconds``, the text report, the
traffic estimate; or, for a failing input, the exception's type, message and attributes) is
serialised to canonical JSON and hashed; ``benchmarks/planner_golden.sha256.json`` holds the
hashes of the last recorded run and the script exits 1 naming every case that differs. To see
what differs, write the full outputs of the old and new code with ``--out`` and diff them, or
compare the plans' slowest ranks with ``--compare OLD`` (outputs the old code wrote with
``--out``): every case whose plan changed, with the old and new max and their ratio, and a
verdict on the one-host plans (exit 1 if any of their maxima rose). A case whose plan is
the same and only its report differs (say, a tighter bound) is counted apart.

The cases: the inputs of tests/planner/test_sharding.py and tests/unit/test_sharding_node.py, the mixes of
benchmarks/bench_planner.py (and benchmarks/criteo_kaggle_tables.yaml) under all three strategies,
seeded random mixes (10..1000 tables, dims 16..256, pooling 1..50, constraints, small topologies
that spill to DDR/SSD with caches, world sizes 1..128, option variations) and bad inputs.

The plan field ``batch_size`` was renamed ``batch_size_per_rank``; outputs are written with the new
name whatever the code under test calls it, so hashes recorded before the rename still apply.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import os
import sys
import time
from pathlib import Path

# The same float results on every x86-64 machine of the project (AVX2-only or AVX-512 with or
# without AMX): numpy's exp, log and power differ in the last bit between its AVX-512 and AVX2
# kernels (116 of the fast cases' outputs changed), so the cases are planned with numpy on its
# AVX2 (x86-64-v3) kernels and OpenBLAS on its Haswell ones; the script starts itself again
# with them when they are not set (they must be before numpy loads).
PINNED = {"NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
          "OPENBLAS_CORETYPE": "Haswell"}
if __name__ == "__main__" and any(os.environ.get(k) != v for k, v in PINNED.items()):
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **PINNED})

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from recscale.sharding import PlannerError, TableSpec, Topology, plan_sharding  # noqa: E402
from recscale.sharding.from_data import table_specs_from_manifest  # noqa: E402
from recscale.sharding.traffic import estimate_comm_bytes  # noqa: E402

HERE = Path(__file__).resolve().parent
HASHES = HERE / "planner_golden.sha256.json"
# the cases that planned in under FAST_S seconds when the hashes were last written (all of them):
# tests/planner/test_planner_golden.py runs these (--fast), this script all
FAST = HERE / "planner_golden.fast.txt"
FAST_S = 0.5
sys.path.insert(0, str(HERE))
import bench_planner as bench  # noqa: E402

TYPES = ("data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise",
         "table_column_wise")


# --- inputs of tests/planner/test_sharding.py -------------------------------------------------------
def zionex(ws=16):
    return Topology.preset("zionex", world_size=ws)


def mix(n=40, seed=0):
    rng = np.random.default_rng(seed)
    rows = (1000 * (rng.pareto(1.2, n) + 1)).astype(int)
    dims = rng.choice([16, 32, 64, 128], n)
    pool = np.exp(rng.uniform(0, np.log(50), n))
    return [TableSpec(f"t{i:03d}", int(r), int(d), float(p))
            for i, (r, d, p) in enumerate(zip(rows, dims, pool))]


def forced(kind, rows=1_000_003, dim=128, pool=5.0):
    return TableSpec("forced", rows, dim, pool, constraints={"sharding_types": [kind]})


def small_tiers(ws=4):
    return Topology(world_size=ws, local_world_size=2, hbm_bytes=2e8, ddr_bytes=1e9,
                    ssd_bytes=1e10, hbm_bw=1e12, ddr_bw=2e10, ssd_bw=2e9,
                    intra_node_bw=1e11, inter_node_bw=1e10, name="tiny")


def twelve_t_tables():
    rng = np.random.default_rng(0)
    n = 1000
    dims = rng.choice([64, 128, 256], n)
    w = rng.lognormal(0.0, 1.5, n)
    rows = np.maximum(1000, (w / (w * dims).sum() * 12e12).astype(np.int64))
    return [TableSpec(f"t{i}", int(r), int(d), 4.0) for i, (r, d) in enumerate(zip(rows, dims))]


def test_cases():
    c = {}
    for kind in TYPES:
        c[f"test/each_type/{kind}"] = lambda kind=kind: plan_sharding(
            [forced(kind)] + mix(10), zionex(16), 256)
    c["test/geometry_granularity"] = lambda: plan_sharding(
        mix(60), zionex(32), 512, column_granularity=8, min_column_width=16)
    c["test/comms_dict"] = lambda: plan_sharding(
        mix(8), zionex(8), 128,
        comms={"forward": "fp16", "backward": "bf16", "dense_allreduce": "bf16"})
    spill = [TableSpec(f"s{i}", 1_000_000, 64, float(1 + i)) for i in range(10)]
    c["test/spill"] = lambda: plan_sharding(spill, small_tiers(), 256)
    c["test/spill_no_cache"] = lambda: plan_sharding(spill, small_tiers(), 256, cache_fraction=0.0)
    c["test/cpu_local"] = lambda: plan_sharding(
        mix(12) + [forced("row_wise")], Topology.preset("cpu-local"), 128)
    c["test/pinned_ddr"] = lambda: plan_sharding(
        [TableSpec("p", 10_000, 32, constraints={"tier": "ddr"})] + mix(5), zionex(8), 128)
    topo = zionex(128)
    no_ssd = Topology(**{**topo.to_dict(), "ssd_bytes": 0.0})
    c["test/12T_fp32_no_ssd_error"] = lambda: plan_sharding(twelve_t_tables(), no_ssd, 512)
    c["test/12T_fp16"] = lambda: plan_sharding(twelve_t_tables(), topo, 512,
                                               weight_precision="fp16")
    c["test/same_input"] = lambda: plan_sharding(mix(50), zionex(16), 512)
    c["test/round_trip"] = lambda: plan_sharding(
        mix(30) + [forced("table_row_wise")], small_tiers(8), 512, comms={"forward": "fp16"})
    c["test/accessors"] = lambda: plan_sharding(mix(20), zionex(16), 512)
    c["test/report"] = lambda: plan_sharding(mix(20), small_tiers(8), 512)
    for s in ("balanced", "greedy", "round_robin"):
        c[f"test/baselines/{s}"] = lambda s=s: plan_sharding(mix(120, seed=3), zionex(32), 512,
                                                             strategy=s)
    uni = [TableSpec(f"u{i}", 100_000, 128, 20.0) for i in range(20)]
    c["test/uniform/balanced"] = lambda: plan_sharding(uni, zionex(8), 512)
    c["test/uniform/greedy"] = lambda: plan_sharding(uni, zionex(8), 512, strategy="greedy")
    c["test/infeasible_huge"] = lambda: plan_sharding(
        [TableSpec("huge", 1_000_000_000, 128)] + mix(3), Topology.preset("cpu-local"), 128)
    c["test/pinned_missing_tier"] = lambda: plan_sharding(
        [TableSpec("p", 1000, 16, constraints={"tier": "hbm"})], Topology.preset("cpu-local"), 128)
    rows = int(0.6 * 12e9 * 0.9 / (16 * 4 + 4))
    w = [TableSpec(f"w{i}", rows, 16, constraints={"sharding_types": ["table_wise"]})
         for i in range(3)]
    c["test/no_pack_error"] = lambda: plan_sharding(w, Topology.preset("cpu-local"), 64)
    c["test/no_pack_split"] = lambda: plan_sharding(
        [TableSpec(t.name, t.num_embeddings, 16) for t in w], Topology.preset("cpu-local"), 64)
    c["test/across_processes"] = lambda: plan_sharding(mix(80), zionex(32), 512)
    cli = [{"name": "users", "num_embeddings": 200000, "embedding_dim": 64, "pooling_factor": 1},
           {"name": "items", "num_embeddings": 50000, "embedding_dim": 32, "pooling_factor": 10,
            "feature_names": ["clicked", "viewed"]},
           {"name": "tiny", "num_embeddings": 10, "embedding_dim": 16}]
    c["test/cli_yaml"] = lambda: plan_sharding(
        cli, Topology.preset("zionex", 16), 512,
        comms={"forward": "fp16", "backward": "bf16", "dense_allreduce": "fp32"})
    c["test/module_default"] = lambda: plan_sharding(
        [{"name": "a", "num_embeddings": 1000, "embedding_dim": 16}], "cpu-local", 512)
    # the Kedro node's input: 26 tables from a manifest, dim 16, cpu-local with 2 ranks, exact_sgd
    rng = np.random.default_rng(7)
    manifest = {"sparse_features": [f"C{i}" for i in range(1, 27)],
                "table_sizes": [int(x) for x in rng.integers(2, 5000, 26)],
                "pooling_factors": [float(x) for x in rng.uniform(0, 1, 26).round(3)]}
    manifest["pooling_factors"][5] = 0.0
    for ws in (1, 2):
        c[f"test/node_manifest/ws{ws}"] = lambda ws=ws: plan_sharding(
            table_specs_from_manifest(manifest, 16), Topology.preset("cpu-local", world_size=ws),
            256, {"optimizer": "exact_sgd"})
    bad = {
        "num_embeddings": lambda: TableSpec("x", 0, 16),
        "embedding_dim": lambda: TableSpec("x", 10, -4),
        "pooling_factor": lambda: TableSpec("x", 10, 16, pooling_factor=0),
        "pooling_nan": lambda: TableSpec("x", 10, 16, pooling_factor=float("nan")),
        "name_empty": lambda: TableSpec("", 10, 16),
        "feature_names": lambda: TableSpec("x", 10, 16, feature_names=("a", "")),
        "sharding_types": lambda: TableSpec("x", 10, 16,
                                            constraints={"sharding_types": ["diagonal"]}),
        "sharding_types_empty": lambda: TableSpec("x", 10, 16, constraints={"sharding_types": []}),
        "constraints_type": lambda: TableSpec("x", 10, 16, constraints=3),
        "tier": lambda: TableSpec("x", 10, 16, constraints={"tier": "tape"}),
        "colour": lambda: TableSpec("x", 10, 16, constraints={"colour": 1}),
        "table_missing_key": lambda: TableSpec.from_dict({"name": "x", "num_embeddings": 3}),
        "table_unknown_key": lambda: TableSpec.from_dict(
            {"name": "x", "num_embeddings": 3, "embedding_dim": 4, "rows": 1}),
        "table_not_mapping": lambda: TableSpec.from_dict(["x"]),
        "world_size": lambda: Topology.preset("zionex", world_size=12),
        "preset": lambda: Topology.preset("tpu-pod"),
        "comms_forward": lambda: PlannerOptionsCall(comms={"forward": "fp12"}),
        "comms_key": lambda: PlannerOptionsCall(comms={"sideways": "fp16"}),
        "comms_name": lambda: PlannerOptionsCall(comms="fp12"),
        "comms_allreduce": lambda: PlannerOptionsCall(comms={"dense_allreduce": "int8"}),
        "optimizer": lambda: PlannerOptionsCall(optimizer="lamb"),
        "weight_precision": lambda: PlannerOptionsCall(weight_precision="fp8"),
        "memory_fraction": lambda: PlannerOptionsCall(memory_fraction=1.5),
        "memory_fraction_0": lambda: PlannerOptionsCall(memory_fraction=0),
        "column_granularity": lambda: PlannerOptionsCall(column_granularity=0),
        "min_column_width": lambda: PlannerOptionsCall(min_column_width=2.5),
        "cache_fraction": lambda: PlannerOptionsCall(cache_fraction=1.0),
        "cache_fraction_neg": lambda: PlannerOptionsCall(cache_fraction=-0.1),
        "cache_hit_exponent": lambda: PlannerOptionsCall(cache_hit_exponent=0),
        "index_bytes": lambda: PlannerOptionsCall(index_bytes=True),
        "pack_fraction": lambda: PlannerOptionsCall(pack_fraction=2),
        "dp_max_fraction": lambda: PlannerOptionsCall(data_parallel_max_fraction=-1),
        "split_fractions": lambda: PlannerOptionsCall(split_fractions=[]),
        "split_fractions_item": lambda: PlannerOptionsCall(split_fractions=[0.5, 0]),
        "strategy": lambda: PlannerOptionsCall(strategy="random"),
        "max_improve_iters": lambda: PlannerOptionsCall(max_improve_iters=-1),
        "options_type": lambda: plan_sharding([TableSpec("a", 10, 4)], "zionex", 8, options=3),
        "options_key": lambda: plan_sharding([TableSpec("a", 10, 4)], "zionex", 8,
                                             {"colour": 1}),
        "batch_size": lambda: plan_sharding([TableSpec("a", 10, 4)], "zionex", 0),
        "batch_size_bool": lambda: plan_sharding([TableSpec("a", 10, 4)], "zionex", True),
        "unique": lambda: plan_sharding([TableSpec("a", 10, 4)] * 2, "zionex", 8),
        "dict_missing": lambda: plan_sharding([{"name": "a", "num_embeddings": 5}], "zionex", 8),
        "override_key": lambda: plan_sharding([TableSpec("a", 10, 4)], "zionex", 8, colour=1),
        "tables_empty": lambda: plan_sharding([], "zionex", 8),
        "tables_str": lambda: plan_sharding("abc", "zionex", 8),
        "tables_item": lambda: plan_sharding([3], "zionex", 8),
        "topology_type": lambda: plan_sharding([TableSpec("a", 10, 4)], 3, 8),
        "topology_lws": lambda: Topology.preset("zionex", 16, local_world_size=0),
        "topology_bw": lambda: Topology(2, 2, 1e9, 0, 0, 0, 0, 0, 1e9, 1e9),
        "topology_key": lambda: Topology.from_dict({**zionex(8).to_dict(), "colour": 1}),
    }
    for k, f in bad.items():
        c[f"test/bad/{k}"] = f
    return c


def PlannerOptionsCall(**kw):  # noqa: N802
    from recscale.sharding import PlannerOptions

    return PlannerOptions(**kw)


# --- mixes of benchmarks/bench_planner.py ---------------------------------------------------------
def bench_cases():
    c = {}
    for name, gen, n, preset, ws, kw in bench.CASES:
        for s in bench.STRATEGIES:
            key = f"bench/{name}/{n}x{ws}/{preset}/{s}"
            c[key] = (lambda gen=gen, n=n, preset=preset, ws=ws, kw=kw, s=s: plan_sharding(
                gen(n, 0), Topology.preset(preset, world_size=ws), bench.BATCH, strategy=s, **kw))
    yml = yaml.safe_load((HERE / "criteo_kaggle_tables.yaml").read_text())
    for preset, ws in (("zionex", 8), ("zionex", 128), ("dgx-h100", 16), ("cpu-local", 2)):
        for s in bench.STRATEGIES:
            c[f"bench/criteo_kaggle_yaml/{preset}/{ws}/{s}"] = (
                lambda preset=preset, ws=ws, s=s: plan_sharding(
                    yml, Topology.preset(preset, world_size=ws), 512, strategy=s))
    return c


# --- seeded random mixes ----------------------------------------------------------------------------
DIMS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 18, 50)  # 18 and 50: not column-splittable by 4


def random_tables(rng, n, target_bytes=None, constraints=0.0, pins=(), features=0.2):
    rows = (1000 * (rng.pareto(1.1, n) + 1)).astype(np.int64)
    rows = np.minimum(rows, 5_000_000_000)
    dims = rng.choice(DIMS, n)
    pool = np.exp(rng.uniform(0, np.log(50), n))
    if target_bytes is not None:  # fp32 weights + a rowwise-adagrad float per row
        rows = np.maximum(10, (rows * target_bytes / (rows * (dims * 4 + 4)).sum())).astype(
            np.int64)
    out = []
    for i in range(n):
        kw = {}
        if rng.random() < features:
            kw["feature_names"] = tuple(f"f{i}_{j}" for j in range(int(rng.integers(2, 4))))
        cons = {}
        if rng.random() < constraints:
            k = int(rng.integers(1, 4))
            cons["sharding_types"] = [TYPES[j] for j in sorted(rng.choice(6, k, replace=False))]
        if pins and rng.random() < 0.05:
            cons["tier"] = pins[int(rng.integers(len(pins)))]
        if cons:
            kw["constraints"] = cons
        out.append(TableSpec(f"r{i:04d}", int(rows[i]), int(dims[i]), float(pool[i]), **kw))
    return out


def tiny_topology(ws, lws, hbm, ddr, ssd, name="small"):
    return Topology(world_size=ws, local_world_size=lws, hbm_bytes=hbm, ddr_bytes=ddr,
                    ssd_bytes=ssd, hbm_bw=1e12, ddr_bw=2e10, ssd_bw=2e9,
                    intra_node_bw=1e11, inter_node_bw=1e10, name=name)


def random_cases():
    c = {}
    # (seed, n tables, topology, batch, options, fill factor of the compute tier or None,
    #  constraint share, pinnable tiers)
    specs = []
    presets = [("zionex", 1), ("zionex", 2), ("zionex", 8), ("zionex", 16), ("zionex", 64),
               ("zionex", 128), ("dgx-h100", 8), ("dgx-h100", 64), ("cpu-local", 1),
               ("cpu-local", 2), ("cpu-local", 4)]
    seed = 100
    for preset, ws in presets:
        for j, n in enumerate((10, 60, 300) if ws <= 16 else (40, 400)):
            topo = Topology.preset(preset, world_size=ws)
            # raw sizes; 0.9 and 1.6 x the compute tier (spills); cpu-local has no lower tier
            fill = ((None, 0.4, 0.8) if preset == "cpu-local" else (None, 0.9, 1.6))[j]
            specs.append((seed, n, topo, 512 if preset != "cpu-local" else 128, {}, fill, 0.1,
                          ("hbm", "ddr") if j == 1 and preset != "cpu-local" else ()))
            seed += 1
    # 1,000 tables on 64 and 256 ranks
    specs.append((200, 1000, Topology.preset("zionex", world_size=64), 512, {}, None, 0.05, ()))
    specs.append((201, 1000, Topology.preset("dgx-h100", world_size=256), 256,
                  {"weight_precision": "bf16"}, None, 0.0, ()))
    # spilling: small tiers, tables 0.5..3 x the compute tier
    for i, (ws, lws, fill) in enumerate([(1, 1, 1.5), (2, 2, 0.8), (4, 2, 2.0), (8, 4, 3.0),
                                         (16, 8, 1.2), (64, 8, 2.5)]):
        hbm, ddr, ssd = 2e8, 1e9, 1e10
        topo = tiny_topology(ws, lws, hbm, ddr, ssd)
        for j, opts in enumerate([{}, {"cache_fraction": 0.1}, {"cache_fraction": 0.0},
                                  {"optimizer": "adam", "memory_fraction": 0.7}]):
            n = (20, 80, 200, 50)[j]
            specs.append((300 + 10 * i + j, n, topo, 256, opts, fill, 0.1, ("hbm", "ddr", "ssd")))
    # HBM + SSD only, DDR + SSD only
    specs.append((400, 80, tiny_topology(8, 4, 2e8, 0.0, 1e10, "hbm-ssd"), 256, {}, 2.0, 0.0, ()))
    specs.append((401, 80, tiny_topology(8, 4, 0.0, 1e9, 1e10, "ddr-ssd"), 256, {}, 2.0, 0.0, ()))
    # option variations on one mid-size mix
    variations = [
        {"optimizer": "exact_sgd"}, {"optimizer": "exact_adagrad"}, {"optimizer": "adam"},
        {"weight_precision": "fp16"}, {"comms": "int8"}, {"comms": "fp8"},
        {"comms": {"forward": "fp16", "backward": "bf16", "dense_allreduce": "bf16"}},
        {"memory_fraction": 0.5}, {"column_granularity": 8, "min_column_width": 32},
        {"cache_hit_exponent": 0.5}, {"index_bytes": 4}, {"pack_fraction": 0.25},
        {"data_parallel_max_fraction": 0.0}, {"data_parallel_max_fraction": 0.05},
        {"split_fractions": (1.0,)}, {"split_fractions": (0.7, 0.3, 0.1, 0.05)},
        {"max_improve_iters": 3},
    ]
    for i, opts in enumerate(variations):
        specs.append((500 + i, 150, Topology.preset("zionex", world_size=32), 512, opts, None,
                      0.1, ("hbm", "ddr")))
    # heavy constraints (every table restricted), and hierarchical types only
    specs.append((600, 120, Topology.preset("zionex", world_size=32), 512, {}, None, 1.0,
                  ("hbm", "ddr")))
    specs.append((601, 120, Topology.preset("zionex", world_size=16, local_world_size=4), 512,
                  {}, None, 0.0, ()))
    for seed_, n, topo, batch, opts, fill, cons, pins in specs:
        name = (f"rand/s{seed_}/n{n}/{topo.name}/w{topo.world_size}x{topo.local_world_size}"
                f"/b{batch}/" + (",".join(f"{k}={v}" for k, v in opts.items()) or "default"))

        def make(seed_=seed_, n=n, topo=topo, fill=fill, cons=cons, pins=pins):
            rng = np.random.default_rng(seed_)
            target = None
            if fill is not None:
                target = fill * topo.capacity(topo.compute_tier) * topo.world_size
            tabs = random_tables(rng, n, target, cons, pins)
            if seed_ == 601:
                tabs = [dataclasses.replace(t, constraints={"sharding_types": [
                    "table_row_wise", "table_column_wise"]}) for t in tabs]
            return tabs

        for s in ("balanced", "greedy", "round_robin"):
            if s != "balanced" and not (seed_ % 3 == 0 or n >= 1000 or fill is not None):
                continue  # the baselines on a third of the mixes, all large and spilling ones
            c[f"{name}/{s}"] = (lambda make=make, topo=topo, batch=batch, opts=opts, s=s:
                                plan_sharding(make(), topo, batch, {**opts, "strategy": s}))
    return c


# --- running and comparing ----------------------------------------------------------------------------
def _plan_output(plan) -> dict:
    d = plan.to_dict()
    d["summary"].pop("planning_seconds", None)
    d = {("batch_size_per_rank" if k == "batch_size" else k): v for k, v in d.items()}
    quiet = dataclasses.replace(plan, planning_seconds=0.0)
    return {"plan": d, "report": quiet.report(max_rows=12).splitlines(),
            "traffic": estimate_comm_bytes(plan)}


def run_case(fn) -> dict:
    try:
        out = fn()
    except (PlannerError, ValueError, TypeError, KeyError) as exc:
        err = {"error": type(exc).__name__, "message": str(exc)}
        if isinstance(exc, PlannerError):
            err.update(table=exc.table, bytes_needed=exc.bytes_needed, capacity=exc.capacity,
                       suggestions=list(exc.suggestions))
        return err
    if hasattr(out, "to_dict") and hasattr(out, "tables"):
        return _plan_output(out)
    return {"value": repr(out)}


def all_cases() -> dict:
    return {**test_cases(), **bench_cases(), **random_cases()}


def canonical(x) -> str:
    return json.dumps(x, sort_keys=False, allow_nan=True, separators=(",", ":"))


def _read(path: Path) -> dict:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)


def compare(old: dict, new: dict) -> int:
    """Print every case whose plan changed (old max, new max, ratio); exit 1 if the maximum of
    a one-host plan rose or a case's error or value changed."""
    same = report_only = 0
    rows = []
    for name, out in new.items():
        was = old.get(name)
        if was is None:
            print(f"not in the old outputs: {name}")
            continue
        if canonical(was) == canonical(out):
            same += 1
            continue
        if "plan" not in out or "plan" not in was:
            print(f"CHANGED (error or value): {name}")
            rows.append((name, None, None, None))
            continue
        if canonical(was["plan"]) == canonical(out["plan"]):
            report_only += 1
            continue
        topo = out["plan"]["topology"]
        hosts = topo["world_size"] // topo["local_world_size"]
        a, b = was["plan"]["summary"]["max_cost"], out["plan"]["summary"]["max_cost"]
        rows.append((name, hosts, a, b))
    print(f"{same} cases identical, {report_only} with the same plan and another report, "
          f"{len(rows)} plans changed:")
    risen = []
    for name, hosts, a, b in sorted(rows, key=lambda r: (r[3] / r[2]) if r[2] else 9.0):
        if a is None:
            continue
        print(f"  {name}: {hosts} host(s), max {a * 1e3:.4f} -> {b * 1e3:.4f} ms "
              f"({b / a:.3f}x)")
        if hosts == 1 and b > a * (1 + 1e-9):
            risen.append(name)
    one = [r for r in rows if r[1] == 1]
    print(f"one-host plans changed: {len(one)}, of them with a higher max: {len(risen)}"
          + ("".join(f"\n  ROSE: {n}" for n in risen)))
    return 1 if risen or any(r[2] is None for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"record the hashes in {HASHES.name}")
    ap.add_argument("--out", default=None, help="also write all outputs here (.json or .json.gz)")
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    ap.add_argument("--list", action="store_true", help="list the case names and exit")
    ap.add_argument("--hashes", default=str(HASHES), help="the recorded hashes to compare with")
    ap.add_argument("--fast", action="store_true",
                    help=f"run the cases of {FAST.name} only (those under {FAST_S} s when recorded)")
    ap.add_argument("--compare", default=None,
                    help="outputs of the old code (--out): compare the plans' maxima")
    args = ap.parse_args(argv)
    cases = all_cases()
    if args.only:
        cases = {k: v for k, v in cases.items() if args.only in k}
    if args.fast:
        fast = set(FAST.read_text().splitlines())
        cases = {k: v for k, v in cases.items() if k in fast}
    if args.list:
        print("\n".join(cases))
        return 0
    outputs, hashes, seconds = {}, {}, {}
    n_err = 0
    t0 = time.perf_counter()
    for name, fn in cases.items():
        t = time.perf_counter()
        out = run_case(fn)
        seconds[name] = time.perf_counter() - t
        text = canonical(out)
        hashes[name] = hashlib.sha256(text.encode()).hexdigest()
        if args.out or args.compare:
            outputs[name] = out
        n_err += "error" in out
    secs = time.perf_counter() - t0
    print(f"{len(cases)} cases ({n_err} raise) in {secs:.1f} s")
    if args.out:
        path = Path(args.out)
        data = (json.dumps(outputs, indent=1, allow_nan=True) + "\n").encode()
        path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
        print(f"outputs written to {path}")
    if args.compare:
        return compare(_read(Path(args.compare)), outputs)
    if args.write:
        if args.only:
            old = json.loads(HASHES.read_text()) if HASHES.exists() else {}
            hashes = {**old, **hashes}
        HASHES.write_text(json.dumps(hashes, indent=0, sort_keys=True) + "\n")
        print(f"hashes written to {HASHES}")
        if not (args.only or args.fast):
            fast = sorted(k for k, sec in seconds.items() if sec < FAST_S)
            FAST.write_text("\n".join(fast) + "\n")
            print(f"{len(fast)} cases under {FAST_S} s written to {FAST}")
        return 0
    recorded = Path(args.hashes)
    if not recorded.exists():
        print(f"no {recorded}: run with --write first")
        return 1
    golden = json.loads(recorded.read_text())
    missing = [k for k in cases if k not in golden]
    differ = [k for k in cases if k in golden and golden[k] != hashes[k]]
    for k in differ:
        print(f"DIFFERS: {k}")
    for k in missing:
        print(f"not recorded: {k}")
    if not (args.only or args.fast):
        for k in sorted(set(golden) - set(cases)):
            print(f"recorded but not run: {k}")
    ok = not differ and not missing
    print("IDENTICAL" if ok else f"{len(differ)} differ, {len(missing)} not recorded")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
