"""Thin sharding nodes: measure this machine when ``sharding.calibrate`` asks for it, plan the
run's tables, then its report, chart and metrics."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from recscale.pipelines.common import as_metrics
from recscale.runconfig import DLRMConfig, plan_for_run
from recscale.sharding import Topology, save_chart

log = logging.getLogger(__name__)


def calibrate_topology(dataset_manifest: dict, cfg: DLRMConfig):
    """``sharding.calibrate: true``: the measured topology (its dict; logged as an MLflow
    artifact) and the fitted constants as metrics; else which preset the plan comes from (the
    artifact says so, rather than being empty) and no metrics."""
    if not cfg.sharding.calibrate:
        return {"calibrated": False, "planned_on": cfg.sharding.topology}, {}
    from recscale.measure import calibrate_for_run

    cal, metrics = calibrate_for_run(cfg, dataset_manifest)
    log.info("calibrated topology in %.1f s: %s", cal.seconds, cal.topology)
    return {"calibrated": True, "topology": cal.topology.to_dict()}, as_metrics(metrics)


def plan_tables(dataset_manifest: dict, cfg: DLRMConfig, calibrated_topology: dict | None = None):
    measured = None
    if calibrated_topology and "topology" in calibrated_topology:
        measured = Topology.from_dict(calibrated_topology["topology"])
    plan = plan_for_run(dataset_manifest, cfg, measured)
    log.info("sharding plan\n%s", plan.report())
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / "plan.png"
        save_chart(plan, chart)
        from PIL import Image

        image = Image.open(chart)
        image.load()
    return plan.to_dict(), plan.report(), image, plan_metrics(plan)


def plan_metrics(plan) -> dict:
    """A plan's ``sharding.*`` metrics (both pipelines that plan log them)."""
    return as_metrics({"max_cost_ms": plan.max_cost * 1e3, "mean_cost_ms": plan.mean_cost * 1e3,
                       "max_over_mean": plan.max_over_mean,
                       "planning_seconds": plan.planning_seconds, "world_size": plan.world_size})
