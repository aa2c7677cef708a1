"""A run's measurements beside what its plan predicted: the embedding exchanges' bytes per step
against the planner's traffic estimate, and the step time per rank against the cost model's
prediction (the dense arch included), as metrics and as a text report."""

from __future__ import annotations

from recscale.model import ModelConfig, dense_spec
from recscale.sharding import ShardingPlan
from recscale.sharding.step_time import StepPrediction, predict_step
from recscale.sharding.traffic import estimate_comm_bytes


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def bytes_against_plan(extra: dict[str, float], plan: ShardingPlan) -> dict[str, float]:
    """The embedding exchanges' bytes per step, split by the plan's hosts, measured (all ranks)
    and as the planner's traffic estimate says, with measured / estimate."""
    est = estimate_comm_bytes(plan)
    out = {}
    for side in ("intra_host", "inter_host"):
        got = extra.get(f"bytes_per_step.embedding.{side}", float("nan"))
        out[f"bytes_per_step.embedding.{side}.estimate"] = est[side]
        out[f"bytes_per_step.embedding.{side}.measured_over_estimate"] = (
            got / est[side] if est[side] else float("nan"))
    return out


def step_time_against_plan(extra: dict[str, float], plan: ShardingPlan, model_cfg: ModelConfig,
                           pipelined: bool, num_dense: int) -> tuple[dict[str, float], str]:
    """The cost model's per-rank step time for this run (``recscale.sharding.step_time``, the
    dense arch of ``model_cfg`` on ``num_dense`` inputs and the plan's tables included) beside
    the measured one, with measured / predicted; and the plan's report followed by the table of
    both."""
    dims = [t.embedding_dim for t in plan.tables]
    pred = predict_step(plan, dense_spec(model_cfg, dims, num_dense), pipelined)
    return (step_time_metrics(extra, pred),
            plan.report() + "\n\n" + format_step_report(pred, extra))


def step_time_metrics(measured: dict[str, float], pred: StepPrediction) -> dict[str, float]:
    """Per rank: predicted step / compute / comm ms and measured / predicted, from the run's
    ``rank{r}.step_ms`` / ``compute_ms`` / ``comm_ms``; ``step_ms.*`` over the slowest rank."""
    out: dict[str, float] = {}
    for r, (c, m) in enumerate(zip(pred.compute, pred.comm)):
        for key, p in (("step_ms", pred.step), ("compute_ms", c), ("comm_ms", m)):
            got = measured.get(f"rank{r}.{key}", float("nan"))
            out[f"rank{r}.{key}.predicted"] = p * 1e3
            out[f"rank{r}.{key}.measured_over_predicted"] = got / (p * 1e3) if p > 0 else float("nan")
    got = max((measured.get(f"rank{r}.step_ms", float("nan")) for r in range(len(pred.compute))),
              default=float("nan"))
    out["step_ms.predicted"] = pred.step * 1e3
    out["step_ms.measured"] = got
    out["step_ms.measured_over_predicted"] = got / (pred.step * 1e3) if pred.step > 0 else float("nan")
    return out


def format_step_report(pred: StepPrediction, measured: dict[str, float] | None = None,
                       max_rows: int = 20) -> str:
    """Predicted per-rank step time (compute, exposed communication) beside what a run measured
    (``rank{r}.step_ms`` / ``compute_ms`` / ``comm_ms`` from its metrics), with measured /
    predicted."""
    m = measured or {}
    W = len(pred.compute)
    lines = [f"step time per rank, predicted{' vs measured' if m else ''} "
             f"(ms; predicted step {_ms(pred.step)} ms)"]
    head = f"{'rank':>4}  {'compute pred':>12}  {'comm pred':>9}  {'step pred':>9}"
    if m:
        head += f"  {'compute meas':>12}  {'comm meas':>9}  {'step meas':>9}  {'meas/pred':>9}"
    lines.append(head)
    for r in range(min(W, max_rows)):
        row = (f"{r:>4}  {_ms(pred.compute[r]):>12}  {_ms(pred.comm[r]):>9}  "
               f"{_ms(pred.step):>9}")
        if m:
            got = m.get(f"rank{r}.step_ms", float("nan"))
            row += (f"  {m.get(f'rank{r}.compute_ms', float('nan')):>12.3f}  "
                    f"{m.get(f'rank{r}.comm_ms', float('nan')):>9.3f}  {got:>9.3f}  "
                    f"{got / (pred.step * 1e3) if pred.step else float('nan'):>9.3f}")
        lines.append(row)
    if W > max_rows:
        lines.append(f"... {W - max_rows} more ranks")
    return "\n".join(lines)
