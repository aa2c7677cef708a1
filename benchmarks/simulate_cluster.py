"""Scale on paper: what the planner and its cost model predict for a 12-trillion-parameter model on
16 ZionEX hosts and on 16 DGX H100 hosts, next to the figures the Neo paper reports.

    PYTHONPATH=src .venv/bin/python benchmarks/simulate_cluster.py            # full (seconds)
    PYTHONPATH=src .venv/bin/python benchmarks/simulate_cluster.py --quick    # 2 hosts, 100 tables

Nothing here runs a model: every predicted number comes from ``plan_sharding`` (placement, memory
per tier) and the cost model behind it (``recscale.sharding.cost``: seconds per iteration) and the
traffic estimate (``recscale.sharding.traffic``: bytes per iteration). The script prints a markdown
table and writes it, with the full numbers as JSON, to ``benchmarks/out/simulate_cluster.{md,json}``
(gitignored; docs/results.md holds the committed copy).

Configurations (``CONFIGS``):
- ``zionex``, 16 hosts x 8 ranks, the 12e12-parameter mix, fp16 weights (Neo's largest model);
- ``dgx-h100``, 16 hosts x 8 ranks, the same mix (same tables, the other machine);
- ``dgx-h100``, 16 hosts x 8 ranks, a 4e12-parameter mix (about what its 128 x 80 GB HBM hold in
  fp16 with the planner's 10 % headroom).

Assumptions (ours; none of them is a figure from the Neo paper):
- The table mix (``table_mix``, seeded): 1,000 tables, one sparse feature each; sizes follow a power
  law: weight ~ 1 + Pareto(1.2), capped at 1,000 x the smallest, rows proportional to weight /
  dim; dims drawn uniformly from {64, 128, 192, 256}; pooling factors log-uniform in [1, 50]. Rows
  are scaled so that sum(rows x dim) equals the target exactly (the remainder goes to the largest
  dim-64 table). With seed 0 the largest table holds about 17 % of the parameters.
- Local batch 512 per rank, so a global batch of 65,536 on 128 ranks. Neo's batch size for this
  model is not known to us with confidence; samples/s = global batch / predicted step time.
- Weights fp16, optimizer exact row-wise AdaGrad (one fp32 per row), pooled embeddings on the wire
  in fp16 forward and bf16 backward, dense all-reduce in fp32, the planner's other defaults
  (memory_fraction 0.9, ...).
- A dense network (MLPs) of ``DENSE_PARAMS`` = 50e6 parameters, reduced every step the way the
  runtime does across hosts (``train.dense_reduction: auto``): reduce-scatter inside the host,
  all-reduce of each rank's slice among its peers on the other hosts (all 8 NICs of a host at
  once), all-gather inside the host. Its FLOPs are not modelled (the cost model has no dense
  compute term), so the predicted step time leaves out the MLPs' forward and backward.
- Nothing overlaps: step time = the slowest rank's embedding compute + its intra-host and
  inter-host all-to-all seconds + the dense all-reduce. Neo pipelines and overlaps these, so its
  step is shorter than this sum would say for the same per-term costs.
- Bytes per link: the traffic estimate's own intra-/inter-host split (sharding/traffic.py), which
  follows the exchanges as built: flat types spread over uniform peers, the hierarchical types
  (table_row_wise / table_column_wise) in their two stages; a replicated table's all-reduce counts
  as inter-host when the plan spans hosts.

Reported figures (``REPORTED``) are only ones known to us with confidence, each with its source;
the paper's throughput in samples/s for the 12T model is not among them (left empty).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from recscale.sharding import SHARDING_TYPES, TableSpec, Topology, plan_sharding
from recscale.sharding.cost import CW, DP, RW, TIER_INDEX, TW, TWCW, TWRW, CostModel
from recscale.sharding.plan import ShardingPlan
from recscale.sharding.traffic import estimate_comm_bytes

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"

LOCAL_BATCH = 512
DENSE_PARAMS = 50_000_000
DIMS = (64, 128, 192, 256)
PLANNER_OPTIONS: dict[str, Any] = {
    "weight_precision": "fp16",
    "optimizer": "exact_rowwise_adagrad",
    "comms": {"forward": "fp16", "backward": "bf16", "dense_allreduce": "fp32"},
}
NEO_CITATION = ('Neo: Mudigere et al., "Software-Hardware Co-design for Fast and Scalable Training '
                'of Deep Learning Recommendation Models", ISCA 2022 (arXiv:2104.05158)')
NEO = "Neo"
DGX = "NVIDIA DGX H100 datasheet / DGX BasePOD reference architecture"

# Figures reported by others, with where they come from; None = not known to us with confidence.
REPORTED: dict[str, dict[str, tuple[str | None, str]]] = {
    "zionex": {
        "hosts x ranks": ("16 x 8 (128 A100 GPUs)", NEO + ", abstract"),
        "parameters": ("12 trillion", NEO + ", abstract"),
        "samples/s": (None, "the paper's 12T throughput is not known to us with confidence"),
        "speed-up": ("up to 40x over existing systems", NEO + ", abstract"),
        "HBM per rank": ("40 GB (A100 40 GB)", NEO + ", its description of the ZionEX platform"),
        "inter-host link": ("200 Gb/s RoCE NIC per GPU", NEO + ", its description of the ZionEX platform"),
        "intra-host link": ("NVLink/NVSwitch (A100: 600 GB/s both ways per GPU)",
                            "NVIDIA A100 datasheet"),
        "DDR per host": (None, "the preset's 1.5 TB is the project's assumption"),
    },
    "dgx-h100": {
        "HBM per rank": ("80 GB (H100 SXM5)", DGX),
        "inter-host link": ("400 Gb/s ConnectX-7 per GPU", DGX),
        "intra-host link": ("NVLink 4 (900 GB/s both ways per GPU)", DGX),
        "DDR per host": ("2 TB", DGX),
        "samples/s": (None, "no reported DLRM throughput for this configuration"),
    },
}


@dataclass(frozen=True)
class Config:
    name: str
    preset: str
    hosts: int
    ranks_per_host: int
    tables: int
    params: int
    seed: int = 0


CONFIGS = (
    Config("zionex, 12T", "zionex", 16, 8, 1000, 12 * 10**12),
    Config("dgx-h100, 12T", "dgx-h100", 16, 8, 1000, 12 * 10**12),
    Config("dgx-h100, 4T (HBM)", "dgx-h100", 16, 8, 1000, 4 * 10**12),
)
QUICK = (
    Config("zionex, 1.5T (quick)", "zionex", 2, 8, 100, 15 * 10**11),
    Config("dgx-h100, 0.5T (quick)", "dgx-h100", 2, 8, 100, 5 * 10**11),
)


# --- the table mix --------------------------------------------------------------------------------
def table_mix(n: int, total_params: int, seed: int = 0) -> list[TableSpec]:
    """``n`` tables whose rows x dims sum to exactly ``total_params`` (a multiple of 64); see the
    module docstring for the distribution."""
    if n < 1 or total_params % 64 or total_params < 64 * n:
        raise ValueError(f"total_params={total_params} with n={n}: expected a multiple of 64 and "
                         "at least 64 per table")
    rng = np.random.default_rng(seed)
    dims = rng.choice(DIMS, n).astype(np.int64)
    weight = np.minimum(rng.pareto(1.2, n) + 1.0, 1000.0)
    pool = np.exp(rng.uniform(0.0, np.log(50.0), n))
    if not (dims == 64).any():
        dims[int(np.argmax(weight))] = 64
    # params of table i proportional to its weight: rows = weight x scale / dim
    rows = np.maximum(1, np.floor(weight / weight.sum() * total_params / dims)).astype(np.int64)
    absorb = int(np.argmax(np.where(dims == 64, rows, -1)))
    rest = total_params - int((rows * dims).sum())
    rows[absorb] += rest // 64
    if rows[absorb] < 1:
        raise ValueError(f"cannot make {n} tables sum to {total_params} parameters")
    return [TableSpec(f"t{i:04d}", int(r), int(d), float(p))
            for i, (r, d, p) in enumerate(zip(rows, dims, pool))]


# --- per-rank costs, split by link -----------------------------------------------------------------
def _group_size(kind: int, n_shards: int, W: int, Lw: int) -> int:
    """The ``k`` the planner costs a shard with (enumerate.enumerate_options)."""
    return {TW: 1, RW: W, TWRW: Lw, CW: n_shards, TWCW: n_shards, DP: W}[kind]


def rank_costs(plan: ShardingPlan) -> dict[str, np.ndarray]:
    """Per-rank seconds per iteration, re-costed from the plan's shards with the cost model:
    ``compute``; ``intra`` / ``inter``: all-to-all and row-wise ring seconds of the sharded
    (not replicated) tables over intra-host / inter-host links; ``dp``: the data-parallel tables'
    all-reduce; ``comms``: all communication (intra + inter + dp, as the planner sums it).

    Comms seconds are linear in 1/intra_node_bw and 1/inter_node_bw, so the intra part is the cost
    with the inter-host links made (practically) free, and the other way round."""
    topo, opts, B = plan.topology, plan.options, plan.batch_size_per_rank
    W, Lw = topo.world_size, topo.local_world_size
    free = 1e30
    models = {
        "all": CostModel(topo, B, opts),
        "intra": CostModel(replace(topo, inter_node_bw=free), B, opts),
        "inter": CostModel(replace(topo, intra_node_bw=free), B, opts),
    }
    out = {k: np.zeros(W) for k in ("compute", "intra", "inter", "dp", "comms")}
    by_kind: dict[int, list[tuple]] = {}
    for tp in plan.tables:
        kind = SHARDING_TYPES.index(tp.sharding_type)
        k = _group_size(kind, len(tp.shards), W, Lw)
        for s in tp.shards:
            by_kind.setdefault(kind, []).append(
                (tp.num_embeddings, tp.pooling_factor, len(tp.feature_names), s.row_length,
                 s.col_length, k, TIER_INDEX[s.tier], s.cache_fraction, s.rank))
    for kind, rows in by_kind.items():
        N, L, F, r, c, k, tier, cache, rank = (np.array(x) for x in zip(*rows))
        cost = {name: m.shards(kind, N, L, F, r, c, k, tier, cache) for name, m in models.items()}
        rank = rank.astype(np.int64)

        def add(key, values, rank=rank):
            out[key] += np.bincount(rank, weights=values, minlength=W)

        add("compute", cost["all"].compute)
        add("comms", cost["all"].comms)
        if kind == DP:
            add("dp", cost["all"].comms)
        else:
            add("intra", cost["intra"].comms)
            add("inter", cost["inter"].comms)
    return out


# --- bytes per link --------------------------------------------------------------------------------
def hierarchical_allreduce(topo: Topology, nbytes: float) -> dict[str, float]:
    """The dense reduction the runtime runs when a plan spans hosts (comm/ddp_hooks.py):
    reduce-scatter inside the host, all-reduce of each rank's 1/Lw slice among the H peers of
    its local rank (every rank through its own NIC), all-gather inside the host. -> bytes per
    link summed over ranks ("intra", "inter") and the seconds of one rank ("seconds"). One host:
    a ring over its ranks."""
    W, Lw, H = topo.world_size, topo.local_world_size, topo.num_hosts
    if W == 1:
        return {"intra": 0.0, "inter": 0.0, "seconds": 0.0}
    intra_per_rank = 2 * (Lw - 1) / Lw * nbytes  # reduce-scatter + all-gather
    inter_per_rank = 2 * (H - 1) / H * nbytes / Lw if H > 1 else 0.0
    seconds = intra_per_rank / topo.intra_node_bw if Lw > 1 else 0.0
    seconds += inter_per_rank / topo.inter_node_bw if H > 1 else 0.0
    return {"intra": W * intra_per_rank, "inter": W * inter_per_rank, "seconds": seconds}


def link_bytes(plan: ShardingPlan) -> dict[str, Any]:
    """The traffic estimate's bytes per iteration (summed over ranks), split into intra-host and
    inter-host links as the estimate splits them (for the exchanges as built, hierarchical types
    included): {"intra": {term: bytes}, "inter": {term: bytes}, "estimate": the estimate}."""
    from recscale.sharding.traffic import KEYS as terms

    est = estimate_comm_bytes(plan)
    return {"intra": {t: est[f"{t}.intra_host"] for t in terms},
            "inter": {t: est[f"{t}.inter_host"] for t in terms}, "estimate": est}


# --- one configuration ----------------------------------------------------------------------------
def simulate(tables: list[TableSpec], topo: Topology, local_batch: int = LOCAL_BATCH,
             dense_params: int = DENSE_PARAMS, **options: Any) -> dict[str, Any]:
    """Plan ``tables`` on ``topo`` and predict one training step; returns the plan and numbers."""
    opts = {**PLANNER_OPTIONS, **options}
    plan = plan_sharding(tables, topo, local_batch, **opts)
    rc = rank_costs(plan)
    crit = plan.critical_rank
    db = {"fp32": 4, "fp16": 2, "bf16": 2}[plan.options.comms.dense_allreduce]
    W = topo.world_size
    dense_links = hierarchical_allreduce(topo, dense_params * db)
    dense_s = dense_links["seconds"]
    split = {
        "compute": float(rc["compute"][crit]),
        "intra_host_comm": float(rc["intra"][crit]),
        "inter_host_comm": float(rc["inter"][crit]),
        "dense_allreduce": float(rc["dp"][crit]) + dense_s,
    }
    step = sum(split.values())
    links = link_bytes(plan)
    per_tier = {t: [r.memory(t) for r in plan.ranks] for t in ("hbm", "ddr", "ssd")}
    return {
        "plan": plan,
        "rank_costs": rc,
        "topology": topo.to_dict(),
        "hosts": topo.num_hosts,
        "ranks_per_host": topo.local_world_size,
        "tables": len(tables),
        "parameters": int(sum(t.num_params for t in tables)),
        "local_batch": local_batch,
        "global_batch": local_batch * W,
        "dense_params": dense_params,
        "step_split_s": split,
        "dp_tables_s": float(rc["dp"][crit]),
        "dense_mlp_s": dense_s,
        "embedding_step_s": plan.max_cost,
        "step_s": step,
        "samples_per_s": local_batch * W / step,
        "memory_max_per_rank": {t: max(v) for t, v in per_tier.items()},
        "memory_mean_per_rank": {t: float(np.mean(v)) for t, v in per_tier.items()},
        "capacity_per_rank": {t: topo.capacity(t) for t in per_tier},
        "link_bytes": links,
        "dense_link_bytes": dense_links,
        "bytes_intra": sum(links["intra"].values()) + dense_links["intra"],
        "bytes_inter": sum(links["inter"].values()) + dense_links["inter"],
        "planning_s": plan.planning_seconds,
        "sharding_types": plan.to_dict()["summary"]["sharding_types"],
        "shards_per_tier": plan.to_dict()["summary"]["tiers"],
        "cache_fraction": plan.cache_fraction,
        "max_over_mean": plan.max_over_mean,
    }


def run_config(cfg: Config) -> dict[str, Any]:
    t0 = time.perf_counter()
    tables = table_mix(cfg.tables, cfg.params, cfg.seed)
    topo = Topology.preset(cfg.preset, world_size=cfg.hosts * cfg.ranks_per_host,
                           local_world_size=cfg.ranks_per_host)
    res = simulate(tables, topo)
    res["name"], res["preset"] = cfg.name, cfg.preset
    res["wall_s"] = time.perf_counter() - t0
    return res


# --- output ---------------------------------------------------------------------------------------
def _ms(s: float) -> str:
    return f"{s * 1e3:,.2f}"


def _gb(b: float) -> str:
    return f"{b / 1e9:,.1f}"


def _params(p: float) -> str:
    return f"{p / 1e12:g}e12" if p >= 1e11 else f"{p / 1e9:g}e9"


def markdown(results: list[dict[str, Any]]) -> str:
    """Quantities as rows, one column per configuration; a "reported" column after each preset's
    first configuration where REPORTED has figures for it."""
    cols: list[tuple[str, dict[str, Any] | None, str]] = []
    seen: set[str] = set()
    for r in results:
        cols.append((f"{r['name']}: predicted", r, r["preset"]))
        if r["preset"] in REPORTED and r["preset"] not in seen:
            cols.append((f"{r['preset']}: reported", None, r["preset"]))
        seen.add(r["preset"])

    def rep(preset: str, key: str) -> str:
        fig = REPORTED.get(preset, {}).get(key)
        return "" if fig is None or fig[0] is None else fig[0]

    def tier(r, t):
        cap = r["capacity_per_rank"][t]
        if cap <= 0:
            return "-"
        return f"{_gb(r['memory_max_per_rank'][t])} / {_gb(cap)}"

    rows: list[tuple[str, Any, str | None]] = [
        ("hosts x ranks", lambda r: f"{r['hosts']} x {r['ranks_per_host']}", "hosts x ranks"),
        ("tables, parameters", lambda r: f"{r['tables']:,}, {_params(r['parameters'])}",
         "parameters"),
        (f"global batch (local {LOCAL_BATCH})", lambda r: f"{r['global_batch']:,}", None),
        ("step time, ms (no overlap)", lambda r: _ms(r["step_s"]), None),
        ("- embedding compute (lookups + update), ms",
         lambda r: _ms(r["step_split_s"]["compute"]), None),
        ("- intra-host all-to-all, ms", lambda r: _ms(r["step_split_s"]["intra_host_comm"]),
         None),
        ("- inter-host all-to-all, ms", lambda r: _ms(r["step_split_s"]["inter_host_comm"]),
         None),
        (f"- dense all-reduce, ms (replicated tables + {DENSE_PARAMS / 1e6:g}M-param MLPs)",
         lambda r: f"{_ms(r['step_split_s']['dense_allreduce'])} ({_ms(r['dp_tables_s'])} + "
                   f"{_ms(r['dense_mlp_s'])})", None),
        ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}", "samples/s"),
        ("samples/s, embeddings alone (planner's max rank cost)",
         lambda r: f"{r['global_batch'] / r['embedding_step_s']:,.0f}", None),
        ("speed-up over previous systems", lambda r: "", "speed-up"),
        ("intra-host link per rank, one way (preset)",
         lambda r: f"{r['topology']['intra_node_bw'] / 1e9:g} GB/s", "intra-host link"),
        ("inter-host link per rank, one way (preset)",
         lambda r: f"{r['topology']['inter_node_bw'] / 1e9:g} GB/s", "inter-host link"),
        ("DDR per host (preset)",
         lambda r: f"{r['topology']['ddr_bytes'] * r['ranks_per_host'] / 1e12:g} TB",
         "DDR per host"),
        ("HBM per rank, GB (max used / capacity)", lambda r: tier(r, "hbm"), "HBM per rank"),
        ("DDR per rank, GB (max used / capacity)", lambda r: tier(r, "ddr"), None),
        ("SSD per rank, GB (max used / capacity)", lambda r: tier(r, "ssd"), None),
        ("intra-host bytes per step, GB, all ranks (MLP all-reduce's share)",
         lambda r: f"{_gb(r['bytes_intra'])} ({_gb(r['dense_link_bytes']['intra'])})", None),
        ("inter-host bytes per step, GB, all ranks (MLP all-reduce's share)",
         lambda r: f"{_gb(r['bytes_inter'])} ({_gb(r['dense_link_bytes']['inter'])})", None),
        ("inter-host bytes per step per rank, GB", lambda r: _gb(r["bytes_inter"]
                                                                  / (r["hosts"]
                                                                     * r["ranks_per_host"])),
         None),
        ("sharding types", lambda r: ", ".join(f"{k} {v}" for k, v in
                                               sorted(r["sharding_types"].items())), None),
        ("shards per tier", lambda r: ", ".join(f"{k} {v}" for k, v in
                                                sorted(r["shards_per_tier"].items())), None),
        ("max/mean rank cost", lambda r: f"{r['max_over_mean']:.3f}", None),
        ("planner wall time, s", lambda r: f"{r['planning_s']:.2f}", None),
    ]
    head = "| quantity | " + " | ".join(c[0] for c in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 1)]
    for label, fn, key in rows:
        cells = []
        for _, r, preset in cols:
            if r is None:
                cells.append(rep(preset, key) if key else "")
            else:
                cells.append(fn(r))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sources(results: list[dict[str, Any]]) -> str:
    presets = list(dict.fromkeys(r["preset"] for r in results))
    lines = [f"- {NEO_CITATION}"] if "zionex" in presets else []
    for p in presets:
        for key, (fig, src) in REPORTED.get(p, {}).items():
            lines.append(f"- {p}, {key}: {fig if fig is not None else '(empty)'}: {src}")
    return "\n".join(lines)


def to_json(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in results:
        d = {k: v for k, v in r.items() if k not in ("plan", "rank_costs")}
        d["rank_costs_s"] = {k: v.tolist() for k, v in r["rank_costs"].items()}
        d["planner_options"] = r["plan"].options.to_dict()
        out.append(d)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="2 hosts x 8 ranks and 100 tables instead of 16 x 8 and 1,000")
    ap.add_argument("--out", type=Path, default=OUT, help="folder for the .md and .json files")
    args = ap.parse_args(argv)
    results = []
    for cfg in QUICK if args.quick else CONFIGS:
        res = run_config(cfg)
        print(f"{cfg.name}: planned in {res['planning_s']:.2f} s, simulated in "
              f"{res['wall_s']:.2f} s", flush=True)
        results.append(res)
    cmd = "python benchmarks/simulate_cluster.py" + (" --quick" if args.quick else "")
    md = f"```bash\n{cmd}\n```\n\n{markdown(results)}\n\nReported figures and sources:\n\n"
    md += sources(results) + "\n"
    print()
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "simulate_cluster.md").write_text(md)
    (args.out / "simulate_cluster.json").write_text(json.dumps(to_json(results), indent=1))
    print(f"wrote {args.out / 'simulate_cluster.md'} and simulate_cluster.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
