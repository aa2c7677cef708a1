"""Thin sharding nodes: measure this machine when ``sharding.calibrate`` asks for it, plan the
run's tables, then its report, chart and metrics."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from recscale.pipelines.common import as_metrics
from recscale.sharding import Topology, save_chart
from recscale.train import DLRMConfig, plan_for_run

log = logging.getLogger(__name__)


def calibrate_topology(dataset_manifest: dict, cfg: DLRMConfig):
    """``sharding.calibrate: true``: the measured topology (its dict; logged as an MLflow
    artifact) and the fitted constants as metrics; else which preset the plan comes from (the
    artifact says so, rather than being empty) and no metrics."""
    if not cfg.sharding.calibrate:
        return {"calibrated": False, "planned_on": cfg.sharding.topology}, {}
    from recscale.train.calibrate import CalibrationConfig, calibrate
    from recscale.train.calibration_config import batch_sizes_for
    from recscale.train.calibration_history import merge_calibrations

    sh, train = cfg.sharding, cfg.train
    base = sh.topology_for(train.world_size)
    ccfg = CalibrationConfig(dims=tuple(sorted({16, cfg.model.embedding_dim})),
                             batch_sizes=batch_sizes_for(train.batch_size_per_rank),
                             scratch_dir=train.tiers.scratch_dir,
                             optimizer=train.embedding_optimizer.name,
                             num_threads=train.num_threads,
                             comms=base.local_world_size > 1,
                             min_seconds=float(sh.calibration_seconds),
                             table_rows=tuple(int(n) for n in dataset_manifest["table_sizes"]))
    T = len(dataset_manifest["table_sizes"])
    cal = calibrate(base, ccfg, cfg.model, T, sh.options.weight_precision,
                    progress_mode=train.progress)
    metrics = cal.metrics()
    if sh.calibration_history:  # the median of this run's calibration and the earlier ones
        cal, merged = merge_calibrations(base, cal, sh.calibration_history, ccfg, T,
                                         sh.options.weight_precision)
        metrics["calibration.merged"] = float(merged)
        log.info("merged with %d earlier calibration(s) in %s", merged, sh.calibration_history)
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
    metrics = {"max_cost_ms": plan.max_cost * 1e3, "mean_cost_ms": plan.mean_cost * 1e3,
               "max_over_mean": plan.max_over_mean, "planning_seconds": plan.planning_seconds,
               "world_size": plan.world_size}
    return plan.to_dict(), plan.report(), image, as_metrics(metrics)
