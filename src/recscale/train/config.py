"""Typed training configuration (the ``train`` block of parameters_dlrm.yml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from recscale.comm import CommsConfig
from recscale.config import Validated, check, check_choice
from recscale.embedding.tbe import EmbeddingOptimizerConfig
from recscale.embedding.tier_config import TierConfig
from recscale.train.checkpoint import CheckpointConfig

DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam")
FAULT_KINDS = ("kill", "nan")


@dataclass(frozen=True)
class FaultInjection(Validated):
    """``train.fault_injection``: for tests and drills. ``kill``: rank ``rank`` SIGKILLs itself
    when it reaches step ``step``; ``nan``: its batch of that step gets a NaN feature (the NaN
    guard must stop the run). Fires only in elastic attempt ``attempt`` (0: the first start), so
    the restarted group runs through."""

    rank: int = 0
    step: int = 1
    kind: str = "kill"
    attempt: int = 0

    def validate(self, prefix: str = "train.fault_injection") -> None:
        check(self.rank >= 0, f"{prefix}.rank", self.rank, ">= 0")
        check(self.step >= 1, f"{prefix}.step", self.step, ">= 1")
        check_choice(f"{prefix}.kind", self.kind, FAULT_KINDS)
        check(self.attempt >= 0, f"{prefix}.attempt", self.attempt, ">= 0")


@dataclass(frozen=True)
class DenseOptimizerConfig(Validated):
    name: str = "adagrad"
    learning_rate: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0

    def validate(self, prefix: str = "train.dense_optimizer") -> None:
        check_choice(f"{prefix}.name", self.name, DENSE_OPTIMIZERS)
        check(self.learning_rate > 0, f"{prefix}.learning_rate", self.learning_rate, "> 0")
        check(0 <= self.momentum < 1, f"{prefix}.momentum", self.momentum, "in [0, 1)")
        check(self.weight_decay >= 0, f"{prefix}.weight_decay", self.weight_decay, ">= 0")


@dataclass(frozen=True)
class TrainConfig(Validated):
    batch_size: int = 2048  # per rank; global batch = batch_size x world_size
    epochs: int = 1
    max_steps: int | None = None
    seed: int = 0
    embedding_optimizer: EmbeddingOptimizerConfig = field(default_factory=EmbeddingOptimizerConfig)
    dense_optimizer: DenseOptimizerConfig = field(default_factory=DenseOptimizerConfig)
    # wire precision of the sharded runtime's collectives (the top-level `comms` parameters)
    comms: CommsConfig = field(default_factory=CommsConfig)
    # memory tiers: tables the plan puts on DDR/SSD train behind a software cache
    tiers: TierConfig = field(default_factory=TierConfig)
    # sharded runtime: start the next batch's input distribution before the current batch's
    # forward/backward (results are identical either way)
    pipeline: bool = True
    log_every: int = 20  # steps between metric-history points
    world_size: int = 1  # ranks in all; > 1 runs the sharded runtime (torch.distributed)
    nnodes: int = 1  # hosts; each starts world_size / nnodes workers
    rdzv_endpoint: str = "127.0.0.1:0"  # host:port of the rendezvous (port 0: pick one, 1 host)
    max_restarts: int = 0  # elastic restarts of the worker group after a failure
    collective_timeout_s: float = 300.0  # a collective stuck this long fails the run
    num_threads: int | None = None  # intra-op threads per process; null -> cores / local ranks
    reader_workers: int = 2
    prefetch: int = 4
    eval_batch_size: int = 16384
    progress: Literal["auto", "bar", "log", "off"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    fault_injection: FaultInjection | None = None

    def validate(self, prefix: str = "train") -> None:
        check(self.batch_size > 0, f"{prefix}.batch_size", self.batch_size, "a positive integer")
        check(self.epochs > 0, f"{prefix}.epochs", self.epochs, "a positive integer")
        check(self.max_steps is None or self.max_steps > 0, f"{prefix}.max_steps", self.max_steps,
              "null or a positive integer")
        check(self.log_every > 0, f"{prefix}.log_every", self.log_every, "a positive integer")
        check(self.world_size >= 1, f"{prefix}.world_size", self.world_size, ">= 1")
        check(self.nnodes >= 1 and self.world_size % self.nnodes == 0, f"{prefix}.nnodes",
              self.nnodes, f"a divisor of train.world_size={self.world_size}")
        check(":" in self.rdzv_endpoint, f"{prefix}.rdzv_endpoint", self.rdzv_endpoint, "host:port")
        check(self.max_restarts >= 0, f"{prefix}.max_restarts", self.max_restarts, ">= 0")
        check(self.collective_timeout_s > 0, f"{prefix}.collective_timeout_s",
              self.collective_timeout_s, "> 0")
        check(self.num_threads is None or self.num_threads >= 1, f"{prefix}.num_threads",
              self.num_threads, "null or >= 1")
        check(self.reader_workers >= 1, f"{prefix}.reader_workers", self.reader_workers, ">= 1")
        check(self.prefetch >= 1, f"{prefix}.prefetch", self.prefetch, ">= 1")
        check(self.eval_batch_size > 0, f"{prefix}.eval_batch_size", self.eval_batch_size, "> 0")
        check_choice(f"{prefix}.progress", self.progress, ("auto", "bar", "log", "off"))
        check_choice(f"{prefix}.device", self.device, ("auto", "cpu", "cuda"))
        if self.fault_injection is not None:
            check(self.fault_injection.rank < self.world_size, f"{prefix}.fault_injection.rank",
                  self.fault_injection.rank, f"< train.world_size={self.world_size}")
