"""Text report and PNG chart of a ``ShardingPlan``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import ShardingPlan


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f}"


def _ranks_str(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 4:
        return f"{len(ranks)} ranks"
    return ",".join(str(r) for r in ranks)


def format_report(plan: ShardingPlan, max_rows: int = 20) -> str:
    """Human-readable summary: totals, the critical rank, the costliest tables, per-rank load and
    memory against capacity (at most ``max_rows`` table and rank lines each)."""
    topo = plan.topology
    o = plan.options
    tiers = topo.tiers
    crit = plan.ranks[plan.critical_rank]
    from .bounds import plan_lower_bound

    lb = plan_lower_bound(plan)
    lines = [
        f"Sharding plan: {len(plan.tables)} tables on {topo.name} ({topo.world_size} ranks = "
        f"{topo.num_hosts} host{'s' if topo.num_hosts > 1 else ''} x {topo.local_world_size}), "
        f"local batch {plan.batch_size_per_rank}",
        f"optimizer {o.optimizer}, weights {o.weight_precision}, comms forward {o.comms.forward} / "
        f"backward {o.comms.backward} / dense all-reduce {o.comms.dense_allreduce}, "
        f"cache fraction {plan.cache_fraction:g}, strategy {o.strategy}",
        f"cost per iteration: max {_ms(plan.max_cost)} ms, mean {_ms(plan.mean_cost)} ms, "
        f"max/mean {plan.max_over_mean:.3f}; planned in {plan.planning_seconds:.2f} s",
        f"lower bound on any plan's max: {_ms(lb.value)} ms (total / ranks "
        f"{_ms(lb.total_over_ranks)} ms, largest unsplittable piece {_ms(lb.largest_piece)} ms "
        f"in {lb.piece_table}"
        + (f" with {_ms(lb.spread_floor)} ms of tables split over every rank under it"
           if lb.spread_floor > 0 else "")
        + (f"; pieces memory makes share ranks {_ms(lb.coupled)} ms (CP-SAT)"
           if lb.coupled > 0 else "")
        + "; tiers spread as a linear programme would); this plan's max / bound "
        f"{plan.max_cost / lb.value if lb.value > 0 else float('nan'):.3f}",
        f"critical path: rank {crit.rank} = compute {_ms(crit.compute_cost)} ms + comms "
        f"{_ms(crit.comms_cost)} ms; largest shards there: {', '.join(plan.critical_tables)}",
    ]
    types: dict[str, int] = {}
    for t in plan.tables:
        types[t.sharding_type] = types.get(t.sharding_type, 0) + 1
    lines.append("sharding types: " + ", ".join(f"{k} {v}" for k, v in sorted(types.items())))
    used = {t: sum(r.memory(t) for r in plan.ranks) for t in tiers}
    lines.append("memory used / capacity (all ranks): " + ", ".join(
        f"{t} {_gb(used[t])} / {_gb(topo.capacity(t) * topo.world_size)} GB" for t in tiers))
    lines.append("")

    tables = sorted(plan.tables, key=lambda t: (-t.cost, t.name))
    shown = tables[:max_rows]
    w = max([4] + [len(t.name) for t in shown])
    lines.append(f"tables (top {len(shown)} of {len(tables)} by cost)")
    lines.append(f"{'name':<{w}}  {'type':<17}  {'rows':>12}  {'dim':>5}  {'shards':>6}  "
                 f"{'ranks':<12}  {'tier':<4}  {'cache':>5}  {'cost ms':>9}")
    for t in shown:
        lines.append(
            f"{t.name:<{w}}  {t.sharding_type:<17}  {t.num_embeddings:>12,}  {t.embedding_dim:>5}  "
            f"{len(t.shards):>6}  {_ranks_str(t.ranks):<12}  {t.tier:<4}  "
            f"{t.shards[0].cache_fraction:>5.2f}  {_ms(t.cost):>9}")
    lines.append("")

    ranks = sorted(plan.ranks, key=lambda r: (-r.cost, r.rank))
    if len(ranks) > max_rows:
        half = max_rows // 2
        ranks_shown = ranks[:half] + ranks[-(max_rows - half):]
        title = f"ranks (the {half} most and {max_rows - half} least loaded of {len(ranks)})"
    else:
        ranks_shown = ranks
        title = "ranks"
    lines.append(title)
    head = f"{'rank':>4}  {'host':>4}  {'compute ms':>10}  {'comms ms':>9}  {'total ms':>9}"
    for t in tiers:
        head += f"  {t + ' GB used/cap':>18}"
    lines.append(head)
    for r in ranks_shown:
        row = (f"{r.rank:>4}  {topo.host_of(r.rank):>4}  {_ms(r.compute_cost):>10}  "
               f"{_ms(r.comms_cost):>9}  {_ms(r.cost):>9}")
        for t in tiers:
            row += f"  {_gb(r.memory(t)) + ' / ' + _gb(topo.capacity(t)):>18}"
        lines.append(row)
    return "\n".join(lines)


def save_chart(plan: ShardingPlan, path: str | Path) -> Path:
    """PNG: per-rank stacked cost bars (compute vs comms) and memory per tier against capacity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    topo = plan.topology
    tiers = topo.tiers
    ranks = np.arange(topo.world_size)
    compute = np.array([r.compute_cost for r in plan.ranks]) * 1e3
    comms = np.array([r.comms_cost for r in plan.ranks]) * 1e3
    width = max(6.0, 0.08 * len(ranks) + 4)
    fig, axes = plt.subplots(1 + len(tiers), 1, figsize=(width, 3 + 2.2 * len(tiers)),
                             squeeze=False)
    ax = axes[0, 0]
    ax.bar(ranks, compute, label="compute (lookup)", color="#4C72B0")
    ax.bar(ranks, comms, bottom=compute, label="communication", color="#DD8452")
    ax.axhline(plan.mean_cost * 1e3, color="k", lw=0.8, ls="--", label="mean")
    ax.set_ylabel("ms / iteration")
    ax.set_title(f"{len(plan.tables)} tables on {topo.name}, {topo.world_size} ranks: "
                 f"max/mean {plan.max_over_mean:.3f}")
    ax.legend(loc="upper right", fontsize=8)
    colors = {"hbm": "#55A868", "ddr": "#8172B2", "ssd": "#937860"}
    for i, t in enumerate(tiers, start=1):
        ax = axes[i, 0]
        used = np.array([r.memory(t) for r in plan.ranks]) / 1e9
        ax.bar(ranks, used, color=colors[t], label=f"{t} used")
        ax.axhline(topo.capacity(t) / 1e9, color="r", lw=1.0, label=f"{t} capacity")
        ax.set_ylabel("GB")
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("rank")
    step = max(1, len(ranks) // 16)  # integer rank ticks, at most ~16 labels
    for a in axes[:, 0]:
        a.set_xticks(ranks[::step])
        a.set_xlim(-0.6, len(ranks) - 0.4)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

