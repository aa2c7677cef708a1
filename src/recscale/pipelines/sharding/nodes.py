"""Thin sharding node: plan the run's tables, then its report, chart and metrics."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from recscale.pipelines.common import as_metrics
from recscale.sharding import save_chart
from recscale.train import DLRMConfig, plan_for_run

log = logging.getLogger(__name__)


def plan_tables(dataset_manifest: dict, cfg: DLRMConfig):
    plan = plan_for_run(dataset_manifest, cfg)
    log.info("sharding plan\n%s", plan.report())
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / "plan.png"
        save_chart(plan, chart)
        from PIL import Image

        image = Image.open(chart)
        image.load()
    metrics = {"max_cost_ms": plan.max_cost * 1e3, "mean_cost_ms": plan.mean_cost * 1e3,
               "max_over_mean": plan.max_over_mean, "planning_seconds": plan.planning_seconds,
               "world_size": plan.world_size}
    return plan.to_dict(), plan.report(), image, as_metrics(metrics)
