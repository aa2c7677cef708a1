"""Measure this machine and fit the planner's cost model to it (``recscale calibrate``,
``sharding.calibrate: true``): the lookups per memory tier, the collectives and the runtime's
exchange between a host's ranks, the dense arch's step, the training steps themselves, and the
link between hosts, fitted to a ``Topology`` the planner accepts.

It sits above ``train`` (it runs the runtime's own pieces and training steps, which the
torch-free planner may not import) and only the pipelines and the CLI import it. The fits
(numpy) live beside the cost model they fit, ``recscale.sharding.cost_fit``. "Calibration" here
is the cost model's; the click probabilities' calibration is ``recscale.evaluate``'s.

- ``config.py``: ``CalibrationConfig``, ``config_for_run`` (the one place it is built), errors
- ``machine.py``: ``calibrate`` (every point on the host's ranks) and ``fit_calibration``
- ``lookups.py``, ``dense.py``, ``comms.py``, ``steps.py``: what is measured; ``timing.py``
- ``link.py``: the link between hosts, one process per host
- ``history.py``: calibrations kept beside a topology file and merged into their median
- ``for_run.py``: what a ``dlrm`` run measures; ``cli.py``: ``recscale calibrate``
"""

from recscale.measure.config import (
    CalibrationConfig,
    CalibrationError,
    batch_sizes_for,
    config_for_run,
)
from recscale.measure.for_run import calibrate_for_run
from recscale.measure.history import merge_calibrations, points_path
from recscale.measure.link import measure_link
from recscale.measure.machine import Calibration, calibrate, fit_calibration

__all__ = [
    "Calibration",
    "CalibrationConfig",
    "CalibrationError",
    "batch_sizes_for",
    "calibrate",
    "calibrate_for_run",
    "config_for_run",
    "fit_calibration",
    "measure_link",
    "merge_calibrations",
    "points_path",
]
