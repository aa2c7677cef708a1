"""What a training run did, in one place: its result from its ranks' (``summary``:
``TrainResult``, ``summarize``, ``steady_per_step``: the warm-up rule of a rank's step) and its
measurements beside its plan's predictions (``against_plan``: bytes against the traffic
estimate, step time against the cost model). The plan's own report is the planner's
(``recscale.sharding.report``)."""

from recscale.report.against_plan import (
    bytes_against_plan,
    format_step_report,
    step_time_against_plan,
    step_time_metrics,
)
from recscale.report.summary import SPLIT_KEYS, TrainResult, steady_per_step, summarize

__all__ = [
    "SPLIT_KEYS",
    "TrainResult",
    "bytes_against_plan",
    "format_step_report",
    "steady_per_step",
    "step_time_against_plan",
    "step_time_metrics",
    "summarize",
]
