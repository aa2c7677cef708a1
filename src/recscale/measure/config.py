"""What the machine's measurement measures (``CalibrationConfig``: ``recscale calibrate``'s flags,
``sharding.calibration_seconds`` and the run's batch and tables in a ``dlrm`` run), built in one
place for a run (``config_for_run``), and the error that says why a measurement cannot run."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from recscale.config import Validated, check


class CalibrationError(RuntimeError):
    """Calibration cannot run here; the message says what is missing."""


@dataclass(frozen=True)
class CalibrationConfig(Validated):
    """How long and what to measure (``recscale calibrate`` flags / ``sharding.calibration``)."""

    dims: tuple[int, ...] = (16, 128)
    poolings: tuple[int, ...] = (1, 8)
    # id draws: uniform (0) and power-law with these exponents (data's skew: most batches repeat
    # hot ids, which the backward updates once)
    skews: tuple[float, ...] = (0.0, 1.2)
    batch_sizes: tuple[int, ...] = (256, 2048)
    tables: int = 4  # tables per in-memory module
    rows: int = 20000  # rows per in-memory table
    # the run's tables' rows (the sharding pipeline passes its dataset's): the in-memory tier is
    # then measured on tables of these sizes (each of a host's ranks its share of their rows),
    # scaled down alike to at most MEMORY_MODULE_BYTES at the widest dim, instead of ``tables``
    # x ``rows`` (``memory_tables``). A lookup's cost per id grows with the tables' size (rows
    # leave the caches): 200,000-row tables ran 14-19% slower per id than 20,000-row ones here
    table_rows: tuple[int, ...] = ()
    cache_rows: int = 50000  # rows of the one cached table (DDR / SSD-backed)
    cache_fraction: float = 0.2
    tiers: tuple[str, ...] = ("memory", "ddr", "ssd")
    scratch_dir: str = ""  # SSD-backed cache files ("" = the system temp directory)
    reps: int = 3
    # the whole sweep this many times, each point's median over them: on a shared machine the
    # cores' speed drifts over seconds, and a point measured only once, in a slow or a fast
    # spell, skews the fits (the sweeps interleave the points, so the spells hit them alike)
    rounds: int = 3
    # and then more sweeps until this many seconds of sweeping have passed (at most
    # ``max_rounds``): a spell of the cores outlasts a short calibration, so a minimum time
    # spreads the sweeps over several spells, whatever a sweep takes on the machine
    min_seconds: float = 0.0
    max_rounds: int = 15
    comm_sizes: tuple[int, ...] = (1 << 14, 1 << 17, 1 << 20, 1 << 22)  # bytes per all-to-all
    comms: bool = True  # measure the collectives between the host's ranks
    num_threads: int | None = None  # threads per rank (train.num_threads; null: the host's cores
    # shared by its ranks)
    optimizer: str = "exact_rowwise_adagrad"
    timeout_s: float = 120.0
    # the run's dense inputs (the dense arch's first layer; null: the Criteo preset's)
    num_dense: int | None = None

    def validate(self, prefix: str = "calibration") -> None:
        for key in ("dims", "poolings", "batch_sizes", "comm_sizes"):
            v = getattr(self, key)
            check(len(v) >= 1 and all(isinstance(x, int) and x > 0 for x in v), f"{prefix}.{key}",
                  v, "a non-empty list of positive integers")
        check(all(d % 4 == 0 for d in self.dims), f"{prefix}.dims", self.dims,
              "multiples of 4 (fbgemm's row alignment)")
        check(len(set(self.batch_sizes)) >= 2, f"{prefix}.batch_sizes", self.batch_sizes,
              "at least two different sizes (a fixed and a per-item cost are fitted)")
        check(set(self.tiers) <= {"memory", "ddr", "ssd"} and "memory" in self.tiers,
              f"{prefix}.tiers", self.tiers, "'memory' and any of 'ddr', 'ssd'")
        check(0 < self.cache_fraction < 1, f"{prefix}.cache_fraction", self.cache_fraction,
              "in (0, 1)")
        check(isinstance(self.rounds, int) and self.rounds >= 1, f"{prefix}.rounds", self.rounds,
              "a positive integer")
        check(isinstance(self.min_seconds, (int, float)) and 0 <= self.min_seconds <= 600,
              f"{prefix}.min_seconds", self.min_seconds, "seconds in [0, 600]")
        check(isinstance(self.max_rounds, int) and self.max_rounds >= self.rounds,
              f"{prefix}.max_rounds", self.max_rounds, f"an integer >= rounds ({self.rounds})")
        check(self.reps >= 1 and self.tables >= 1 and self.rows >= 1000, f"{prefix}.reps",
              self.reps, ">= 1 (and tables >= 1, rows >= 1000)")
        check(all(isinstance(x, int) and x > 0 for x in self.table_rows), f"{prefix}.table_rows",
              self.table_rows, "positive integers (rows per table; empty: tables x rows)")
        check(isinstance(self.comms, bool), f"{prefix}.comms", self.comms, "true or false")
        check(len(self.skews) >= 1 and all(isinstance(x, (int, float)) and 0 <= x <= 3
                                           for x in self.skews),
              f"{prefix}.skews", self.skews, "a non-empty list of exponents in [0, 3] (0: uniform)")
        check(self.num_threads is None or (isinstance(self.num_threads, int)
                                           and self.num_threads > 0),
              f"{prefix}.num_threads", self.num_threads, "null or a positive integer")
        check(self.num_dense is None or (isinstance(self.num_dense, int) and self.num_dense >= 0),
              f"{prefix}.num_dense", self.num_dense, "null or a non-negative integer")


def preset_shape() -> tuple[int, int]:
    """(dense inputs, tables) of the Criteo preset: what the measurement assumes of a run it is
    not told about (``recscale calibrate`` without ``--tables`` / ``--table-rows``)."""
    from recscale.data.schema import criteo_schema

    s = criteo_schema()
    return len(s.dense), len(s.sparse)


def dense_inputs(cfg: CalibrationConfig) -> int:
    """The run's dense inputs: ``cfg.num_dense``, else the Criteo preset's."""
    return preset_shape()[0] if cfg.num_dense is None else cfg.num_dense


# the in-memory module measured on the run's tables holds at most this many bytes of weights at the
# widest calibrated dim (each of a host's ranks holds one)
MEMORY_MODULE_BYTES = 512 << 20


def memory_tables(cfg: CalibrationConfig, ranks: int = 1) -> list[int]:
    """Rows of each table of the in-memory module each of a host's ``ranks`` measures (at the
    same time): ``cfg.table_rows`` / ``ranks`` (a rank holds about that share of the tables'
    rows, and the host's ranks share its caches), scaled down alike to ``MEMORY_MODULE_BYTES``
    at the widest dim; or ``cfg.tables`` x ``cfg.rows``."""
    if not cfg.table_rows:
        return [cfg.rows] * cfg.tables
    scale = min(1.0 / ranks, MEMORY_MODULE_BYTES / (sum(cfg.table_rows) * max(cfg.dims) * 4))
    return [max(1, int(r * scale)) for r in cfg.table_rows]


def batch_sizes_for(batch_size_per_rank: int) -> tuple[int, int]:
    """The batch sizes to calibrate a run of ``batch_size_per_rank`` at: that batch and a quarter
    of it. A step's time is not linear in the batch far from it (the activations leave the
    caches: on one machine the dense arch at dim 128 took 36 ms at 1,024 samples and 98 at 2,048),
    so a fit through sizes around another batch mispredicts this one."""
    b = int(batch_size_per_rank)
    check(b >= 8, "train.batch_size_per_rank", b, "at least 8 to calibrate at")
    return (max(b // 4, 2), b)


def config_for_run(batch_size_per_rank: int, table_rows: Sequence[int] = (),
                   **settings) -> CalibrationConfig:
    """What to measure for a run of ``batch_size_per_rank`` samples per rank on tables of
    ``table_rows`` rows (a dataset manifest's ``table_sizes``; empty: ``tables`` x ``rows``):
    at that batch and a quarter of it (``batch_sizes_for``), the in-memory tier on tables of
    those sizes (``memory_tables``); ``settings``: any other field (``dims``, ``scratch_dir``,
    ``optimizer``, ``rounds`` ...). The one place a measurement's config is built, for the
    ``dlrm`` run (``for_run.calibrate_for_run``), ``recscale calibrate`` and the benchmarks."""
    return CalibrationConfig(batch_sizes=batch_sizes_for(batch_size_per_rank),
                             table_rows=tuple(int(n) for n in table_rows), **settings)


class Sweeps:
    """How many sweeps a calibration takes: ``cfg.rounds``, then more while under
    ``cfg.min_seconds`` since the first began (at most ``cfg.max_rounds``). ``expected``: the
    count to show on a progress bar, from the first sweep's length."""

    def __init__(self, cfg: CalibrationConfig):
        self.cfg, self.done, self.started, self.expected = cfg, 0, time.perf_counter(), cfg.rounds

    def more(self) -> bool:
        c, elapsed = self.cfg, time.perf_counter() - self.started
        if self.done == 1 and c.min_seconds > 0 and elapsed > 0:
            self.expected = min(c.max_rounds, max(c.rounds, math.ceil(c.min_seconds / elapsed)))
        if self.done < c.rounds:
            return True
        return self.done < c.max_rounds and elapsed < c.min_seconds

    def finished_one(self) -> None:
        self.done += 1
        self.expected = max(self.expected, self.done)
