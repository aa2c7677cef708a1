"""Timing helpers of the machine's measurement: a point's median time over repetitions, the median
of several sweeps' points, and a directory checked writable before a tier is measured in it."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from recscale.measure.config import CalibrationError


def median_of_rounds(rounds: list[dict[str, list[dict]]]) -> dict[str, list[dict]]:
    """The same points measured in several sweeps: each point with the median over the sweeps of
    every measured number (seconds, communication seconds, hit rate, ...); what names the point
    (dim, batch, ...) is the same in every sweep. A part some sweeps lack (kept calibrations of an
    older version: no host steps) is the median over those that have it as the newest of them
    does (the same number of points)."""
    out = {}
    for part in dict.fromkeys(k for r in rounds for k in r):
        have = [r[part] for r in rounds if part in r]
        have = [h for h in have if len(h) == len(have[-1])]
        merged = []
        for i, p in enumerate(have[-1]):
            q = dict(p)
            for k, v in p.items():
                if isinstance(v, float):
                    q[k] = statistics.median(h[i][k] for h in have)
            merged.append(q)
        out[part] = merged
    return out


def median_time(fn: Callable[[int], Any], reps: int) -> float:
    fn(-1)  # warm-up
    ts = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn(i)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def check_writable(path: str, what: str) -> str:
    """``path`` exists (made if missing) and a file can be written in it, else a clear error."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as e:
        raise CalibrationError(f"cannot calibrate the {what}: its directory {path!r} cannot be "
                               f"written ({e.strerror or e}); give a writable directory "
                               "(--scratch-dir / train.tiers.scratch_dir) or leave the tier out "
                               "(--tiers memory,ddr)") from e
    return path
