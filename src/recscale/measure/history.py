"""Calibrations taken at different times, kept beside a topology file and merged into the fit of
their median (``recscale calibrate --merge``, ``sharding.calibration_history``): on a machine
whose speed drifts for minutes, one calibration samples one spell, the median of several taken
apart samples the machine. Apart from ``calibrate`` because it is file bookkeeping over finished
calibrations, not measurement."""

from __future__ import annotations

import datetime
import json
import os
from typing import Any

from recscale.config import to_dict
from recscale.measure.config import CalibrationConfig, CalibrationError, preset_shape
from recscale.measure.machine import Calibration, fit_calibration
from recscale.measure.timing import median_of_rounds
from recscale.sharding import Topology

# what names a calibration's points (the same list of points in the same order): calibrations that
# agree on these can be merged; the rest (reps, rounds, timing, scratch directory) may differ
_IDENTITY = ("dims", "poolings", "skews", "batch_sizes", "tables", "rows", "table_rows",
             "cache_rows", "cache_fraction", "tiers", "comm_sizes", "comms", "num_threads",
             "optimizer", "num_dense")


def points_path(topology_path) -> str:
    """Where ``recscale calibrate`` keeps a topology file's calibrations (``--merge``)."""
    root, _ = os.path.splitext(str(topology_path))
    return root + ".points.json"


def calibration_key(base: Topology, cfg: CalibrationConfig, num_tables: int,
                    weight_precision: str = "fp32") -> dict[str, Any]:
    c = to_dict(cfg)
    key = {"local_world_size": base.local_world_size, "num_tables": num_tables,
           "weight_precision": weight_precision, **{k: c[k] for k in _IDENTITY}}
    return json.loads(json.dumps(key))  # as the file holds it (lists, not tuples)


def merge_calibrations(base: Topology, cal: Calibration, path: str, cfg: CalibrationConfig,
                       num_tables: int | None = None, weight_precision: str = "fp32", merge: bool = True,
                       keep: int = 10) -> tuple[Calibration, int]:
    """Keep ``cal``'s points in the file ``path`` (JSON: the last ``keep`` calibrations of one
    layout and config) and, with ``merge``, fit the median of every kept calibration's points
    (``fit_calibration``): on a machine whose speed drifts for minutes, one calibration samples
    one spell and the median of calibrations taken at different times samples the machine.
    -> (the calibration to write, how many earlier ones it merged). A file from another layout
    or config is refused naming what differs (``merge``), or replaced (without)."""
    num_tables = preset_shape()[1] if num_tables is None else num_tables
    key = calibration_key(base, cfg, num_tables, weight_precision)
    kept: list[dict] = []
    if merge and os.path.exists(path):
        try:
            with open(path) as fh:
                old = json.load(fh)
            old_key, kept = old["key"], list(old["calibrations"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CalibrationError(f"cannot merge with the calibrations in {path}: {e}; remove "
                                   "the file or calibrate without --merge") from e
        differ = [k for k in key if old_key.get(k) != key[k]]
        if differ:
            raise CalibrationError(
                f"cannot merge with the calibrations in {path}: they measured "
                + ", ".join(f"{k}={old_key.get(k)!r}" for k in differ) + ", this one "
                + ", ".join(f"{k}={key[k]!r}" for k in differ)
                + "; remove the file or calibrate without --merge")
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    kept = (kept + [{"when": now, "seconds": cal.seconds, "points": cal.points}])[-max(keep, 1):]
    tmp = path + ".tmp"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(tmp, "w") as fh:
            json.dump({"key": key, "calibrations": kept}, fh, default=float)
        os.replace(tmp, path)
    except OSError as e:
        raise CalibrationError(f"cannot keep the calibration's points in {path}: "
                               f"{e.strerror or e}") from e
    if len(kept) == 1:
        return cal, 0
    out = fit_calibration(base, median_of_rounds([k["points"] for k in kept]), cfg, num_tables,
                          weight_precision)
    out.seconds, out.sweeps = cal.seconds, cal.sweeps
    return out, len(kept) - 1

