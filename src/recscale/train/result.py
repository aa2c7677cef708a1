"""What one rank's run hands back (``RankResult``; a plain dict of it crosses the process
boundary, and ``recscale.report.summary`` puts the ranks' together) and the warm-up steps its
step times leave out."""

from __future__ import annotations

from dataclasses import dataclass, field

# the first steps of a process are not the step it runs: the first allocates every buffer and
# opens gloo's connections, and DDP rebuilds its gradient buckets after the first backward, so
# the second allocates again (measured: 1.5-3x the steps after). The per-step time split
# (summarize's rank<r>.step_ms) leaves them out where a run has more
WARMUP_STEPS = 2


@dataclass
class RankResult:
    """One rank's run (a plain dict of it crosses the process boundary)."""

    rank: int = 0
    steps: int = 0
    samples: int = 0  # this rank's rows, resumed ones included
    global_samples: int = 0
    step_seconds: float = 0.0
    wall_seconds: float = 0.0
    comm_seconds: float = 0.0
    data_wait_seconds: float = 0.0  # time the trainer waited for the loader
    # the first WARMUP_STEPS steps this process took: their seconds and communication seconds
    warmup_steps: int = 0
    warmup_seconds: float = 0.0
    warmup_comm_seconds: float = 0.0
    # bytes sent per step: per collective name, and the totals split by the plan's hosts under
    # SPLIT_KEYS ("intra_host", "inter_host"; not collectives: leave them out of sums)
    bytes_per_step: dict[str, float] = field(default_factory=dict)
    embedding_bytes: int = 0
    planned_bytes: float = 0.0
    history: dict[str, list[dict]] = field(default_factory=dict)
    final_loss: float = float("nan")
    state_path: str | None = None
    resumed_from: str | None = None
    resumed_samples: int = 0  # this rank's rows trained before the checkpoint it resumed from
    resharded: bool = False  # resumed from a checkpoint of another world size
    resharded_from: int = 0  # that checkpoint's world size (0: not resharded)
    reshard_step: int = 0  # the step it was written at
    reshard_rows_remaining: int = 0  # rows of its epoch no rank had read: split over this run
    initialised_from: str | None = None  # train.checkpoint.init_from
    checkpoints: list[str] = field(default_factory=list)
    checkpoint_failures: int = 0
    checkpoint_seconds: float = 0.0
    tier_stats: dict[str, float] = field(default_factory=dict)
    dense_optimizer: dict[str, float] = field(default_factory=dict)  # HF: its step counters
    # validation and early stopping: best point, the step it stopped at (0: none), points, time
    best_step: int = 0
    best_value: float = float("nan")
    stopped_early_at: int = 0
    pruned_at: int = 0  # the step the validation observer ended training at (0: none)
    restored_best: bool = False
    validation_points: int = 0
    validation_seconds: float = 0.0
    validation_state: dict | None = None  # the early-stopping state a checkpoint carried
    average_decay: float = 0.0  # train.average's decay as the run used it (0: off)
