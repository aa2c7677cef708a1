"""The measurement a ``dlrm`` run asks for (``sharding.calibrate: true``): this machine laid out as
the run's topology (its ranks per host), at the run's batch per rank, dims, embedding optimizer,
threads and tables, merged with the calibrations kept in ``sharding.calibration_history``."""

from __future__ import annotations

import logging

from recscale.data.schema import FittedSchema
from recscale.measure.config import config_for_run
from recscale.measure.history import merge_calibrations
from recscale.measure.machine import Calibration, calibrate
from recscale.runconfig import DLRMConfig

log = logging.getLogger(__name__)


def calibrate_for_run(cfg: DLRMConfig, manifest: dict) -> tuple[Calibration, dict]:
    """The measurement of a run on the dataset of ``manifest`` (its tables' rows, its dense
    inputs) -> (the calibration to plan on, its metrics: the fitted constants and how many
    earlier calibrations it merged)."""
    sh, train = cfg.sharding, cfg.train
    base = sh.topology_for(train.world_size)
    table_sizes = list(manifest["table_sizes"])
    mcfg = config_for_run(train.batch_size_per_rank, table_sizes,
                          num_dense=FittedSchema.of(manifest).num_dense,
                          dims=tuple(sorted({16, cfg.model.embedding_dim})),
                          scratch_dir=train.tiers.scratch_dir,
                          optimizer=train.embedding_optimizer.name,
                          num_threads=train.num_threads, comms=base.local_world_size > 1,
                          min_seconds=float(sh.calibration_seconds))
    T = len(table_sizes)
    cal = calibrate(base, mcfg, cfg.model, T, sh.options.weight_precision,
                    progress_mode=train.progress)
    metrics = cal.metrics()
    if sh.calibration_history:  # the median of this run's calibration and the earlier ones
        cal, merged = merge_calibrations(base, cal, sh.calibration_history, mcfg, T,
                                         sh.options.weight_precision)
        metrics["calibration.merged"] = float(merged)
        log.info("merged with %d earlier calibration(s) in %s", merged, sh.calibration_history)
    return cal, metrics
