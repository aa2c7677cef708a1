"""Typed DLRM configuration: the ``train`` block (with ``train.checkpoint``), the ``evaluate``
block, and ``DLRMConfig``, the root that every block of parameters_dlrm.yml is parsed into once
(by the first node of each DLRM pipeline)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from recscale.comm import CommsConfig
from recscale.config import ConfigError, Validated, check, check_choice
from recscale.data.preprocess import PreprocessConfig
from recscale.data.schema import FeatureSchema, parse_features
from recscale.data.source import DataConfig
from recscale.data.unknown_ids import UnknownIdsConfig
from recscale.distributed import LaunchConfig
from recscale.embedding.tbe import LR_SCHEDULES, EmbeddingOptimizerConfig
from recscale.embedding.tier_config import TierConfig
from recscale.evaluate.config import EvaluateConfig  # noqa: F401  (the evaluate block; re-exported)
from recscale.model.dlrm import ModelConfig
from recscale.optim.config import HessianFreeConfig
from recscale.sharding import ShardingConfig

RESUME_MODES = ("restart", "latest", "never")


@dataclass(frozen=True)
class CheckpointConfig(Validated):
    """``train.checkpoint``: where and how often to checkpoint, and what to resume from."""

    dir: str | None = None  # null: no checkpoints
    every_steps: int = 0  # 0: only at the end of training
    keep_last: int = 2
    # restart: resume only from this launch's own checkpoints (elastic restarts after a failure);
    # latest: the newest valid checkpoint under dir, of any run (continue a stopped job, or
    # reshard it to another world size); never; or the path of one step directory
    resume: str = "restart"
    # a checkpoint (step directory) whose model and optimizer state start this run when there is
    # nothing to resume: a warm start on new data, counters and data position from zero
    init_from: str | None = None
    # init_from's tables may be smaller than the data's (a vocabulary grown append-only, as the
    # retrain's are): its rows fill each table's first rows, the rows past them start as a fresh
    # model's (weights and optimizer state)
    init_grow: bool = False

    def validate(self, prefix: str = "train.checkpoint") -> None:
        check(self.every_steps >= 0, f"{prefix}.every_steps", self.every_steps, ">= 0 (0: at the end only)")
        check(self.keep_last >= 1, f"{prefix}.keep_last", self.keep_last, ">= 1")
        check(self.resume in RESUME_MODES or os.sep in self.resume or self.resume.startswith("step-"),
              f"{prefix}.resume", self.resume,
              f"one of {RESUME_MODES} or the path of a checkpoint's step directory")


DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam", "hessian_free", "shampoo", "soap")
# Shampoo and SOAP come from pytorch-optimizer, the optional extra `second_order`
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
    """``train.dense_optimizer``: what updates the dense arch (the embeddings keep their fused
    optimizer, ``train.embedding_optimizer``, whatever is chosen here).

    ``hessian_free``: truncated-Newton steps (``recscale.optim.HessianFree``, its settings under
    ``hf``: the keys of the ``hf.optimizer`` block of parameters_hf.yml) whose curvature products
    go through the whole dense arch with the pooled embeddings held fixed; ``learning_rate`` and
    ``momentum`` do not apply. ``curvature_batch_size``: rows of the global batch the products
    use (null: all of it; each rank takes its first curvature_batch_size / world_size rows).
    ``warmup_steps``: the first-order optimizers' learning rate rises linearly from
    learning_rate / warmup_steps to learning_rate over that many steps (the large-batch recipe).
    ``decay_steps``: after ``decay_start_step`` steps, the rate falls as ``schedule`` says:
    polynomially ((1 - t / decay_steps) ** decay_power, t the steps since the start) to 0 over
    that many steps, as the MLPerf DLRM's schedule; linearly or along a half cosine to 0; or
    ``step``: times ``decay_gamma`` every decay_steps steps; 0 (or ``schedule: constant``) turns
    it off (``recscale.train.step.scheduled_rate``).
    """

    name: str = "adagrad"
    learning_rate: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    warmup_steps: int = 0
    decay_start_step: int = 0
    decay_steps: int = 0
    decay_power: float = 2.0
    schedule: str = "polynomial"
    decay_gamma: float = 0.1
    curvature_batch_size: int | None = None
    hf: HessianFreeConfig = field(default_factory=HessianFreeConfig)

    def validate(self, prefix: str = "train.dense_optimizer") -> None:
        check_choice(f"{prefix}.name", self.name, DENSE_OPTIMIZERS)
        check(self.learning_rate > 0, f"{prefix}.learning_rate", self.learning_rate, "> 0")
        check(0 <= self.momentum < 1, f"{prefix}.momentum", self.momentum, "in [0, 1)")
        check(self.weight_decay >= 0, f"{prefix}.weight_decay", self.weight_decay, ">= 0")
        check(self.warmup_steps >= 0, f"{prefix}.warmup_steps", self.warmup_steps, ">= 0")
        check(self.decay_start_step >= 0, f"{prefix}.decay_start_step", self.decay_start_step,
              ">= 0")
        check(self.decay_steps >= 0, f"{prefix}.decay_steps", self.decay_steps, ">= 0")
        check(self.decay_power > 0, f"{prefix}.decay_power", self.decay_power, "> 0")
        check_choice(f"{prefix}.schedule", self.schedule, LR_SCHEDULES)
        check(0 < self.decay_gamma <= 1, f"{prefix}.decay_gamma", self.decay_gamma, "in (0, 1]")
        check(self.curvature_batch_size is None or self.curvature_batch_size > 0,
              f"{prefix}.curvature_batch_size", self.curvature_batch_size,
              "null or a positive integer")
        if self.name == "hessian_free":
            # the empirical Fisher needs per-example gradients of the whole model (embeddings
            # included), which the fused embedding kernels do not give
            check(self.hf.preconditioner == "none", f"{prefix}.hf.preconditioner",
                  self.hf.preconditioner, "'none' with the DLRM (no per-example gradients "
                  "through the fused embeddings for the Fisher diagonal)")

    def check_model(self, model: ModelConfig, prefix: str = "train.dense_optimizer") -> None:
        """What this optimizer needs of the model: Hessian-free runs the dense arch in fp32 or
        fp64 (curvature products in bf16 are too coarse for CG's conjugacy), without dropout."""
        if self.name == "hessian_free":
            check(model.dense_precision == "fp32", f"{prefix}.name", self.name,
                  f"a first-order optimizer with model.dense_precision="
                  f"{model.dense_precision!r} (Hessian-free needs fp32 dense layers: CG on "
                  "bf16 curvature products loses conjugacy)")
            # every loss and curvature evaluation of one step must see the same function
            check(not model.dropout.any, f"{prefix}.name", self.name,
                  f"a first-order optimizer with model.dropout={model.dropout} (Hessian-free "
                  "evaluates the loss and curvature products several times per step; dropout "
                  "would draw a new mask each time)")


VALIDATION_METRICS = ("auc", "log_loss")


@dataclass(frozen=True)
class ValidateConfig(Validated):
    """``train.validation``: the validation split scored while training, by every rank on its share
    of the rows (the same numbers in one process and sharded); AUC, log loss and calibration go to
    the run's history as curves beside the training loss, and drive ``train.early_stopping``.

    Validation points: ``per_epoch`` of them spread evenly over each epoch (the last at its end),
    or one every ``every_steps`` steps and one at each epoch's end when that is set.
    ``max_rows``: score only the first this many rows of the split (its earliest, in a time
    split); null scores all of them."""

    enabled: bool = False  # conf/base turns it on for every pipeline run
    per_epoch: int = 4
    every_steps: int | None = None
    max_rows: int | None = None
    # rows per rank per forward; null: train.batch_size_per_rank (a slow tier's cache is sized
    # for the training batch: a larger forward must still fit it)
    batch_size: int | None = None

    def validate(self, prefix: str = "train.validation") -> None:
        check(self.per_epoch >= 1, f"{prefix}.per_epoch", self.per_epoch, "a positive integer")
        check(self.every_steps is None or self.every_steps >= 1, f"{prefix}.every_steps",
              self.every_steps, "null (per_epoch decides) or a positive integer")
        check(self.max_rows is None or self.max_rows >= 1, f"{prefix}.max_rows", self.max_rows,
              "null (every row of the split) or a positive integer")
        check(self.batch_size is None or self.batch_size >= 1, f"{prefix}.batch_size",
              self.batch_size, "null (train.batch_size_per_rank) or a positive integer")


@dataclass(frozen=True)
class EarlyStoppingConfig(Validated):
    """``train.early_stopping``: stop when the validation ``metric`` has not improved by more
    than ``min_delta`` for ``patience`` validation points in a row; ``restore_best``: the model a
    run returns (evaluated, logged, registered) is the one of the best validation point, not the
    last step's. ``mode``: max or min; auto = max for auc, min for log_loss. Needs
    ``train.validation.enabled``."""

    enabled: bool = False  # conf/base turns it on for every pipeline run
    metric: str = "auc"
    mode: Literal["auto", "max", "min"] = "auto"
    patience: int = 2
    min_delta: float = 0.0
    restore_best: bool = True

    @property
    def maximize(self) -> bool:
        return self.mode == "max" or (self.mode == "auto" and self.metric == "auc")

    def validate(self, prefix: str = "train.early_stopping") -> None:
        check_choice(f"{prefix}.metric", self.metric, VALIDATION_METRICS)
        check_choice(f"{prefix}.mode", self.mode, ("auto", "max", "min"))
        check(self.patience >= 1, f"{prefix}.patience", self.patience, "a positive integer")
        check(self.min_delta >= 0, f"{prefix}.min_delta", self.min_delta, ">= 0")


@dataclass(frozen=True)
class AverageConfig(Validated):
    """``train.average``: the model validated, kept as the best step and handed back is an
    exponential moving average of the weights (every table and the dense layers), the steps'
    weights weighted by ``decay ** age`` and normalised, each table row's from the first step
    that changed it (``recscale.train.average``), while training goes on from the weights
    themselves. It smooths the last steps' noise (a row-wise Adagrad step moves a row seen
    thousands of times as far as one seen once). ``decay``: ``auto`` = an average over an eighth
    of an epoch's steps, at most 100 steps (``average.auto_decay``); a number in (0, 0.9999]; null
    = off (the last step's weights). Every row starts again at a ``train.reinit_embeddings``
    epoch; checkpoints carry the average. Tables on a slow (DDR/SSD) tier are refused: the
    average reads every row every step."""

    decay: float | Literal["auto"] | None = None

    def validate(self, prefix: str = "train.average") -> None:
        d = self.decay
        number = isinstance(d, (int, float)) and not isinstance(d, bool)
        check(d is None or d == "auto" or (number and 0.0 < d <= 0.9999), f"{prefix}.decay", d,
              "auto (over an eighth of an epoch's steps, at most 100), null (off) or a number "
              "in (0, 0.9999] (an average over at most ~10,000 steps), e.g. 0.99")


@dataclass(frozen=True)
class TrainConfig(Validated):
    batch_size_per_rank: int = 2048  # the global batch is this x launch.world_size
    epochs: int = 1
    # every epoch after the first starts the embedding tables (and their optimizer state) from
    # their initial values while the dense layers go on: what a second pass over the same rows
    # teaches the dense layers without the tables memorising them (recscale.embedding.reset)
    reinit_embeddings: bool = False
    max_steps: int | None = None
    seed: int = 0
    embedding_optimizer: EmbeddingOptimizerConfig = field(default_factory=EmbeddingOptimizerConfig)
    dense_optimizer: DenseOptimizerConfig = field(default_factory=DenseOptimizerConfig)
    # memory tiers: tables the plan puts on DDR/SSD train behind a software cache
    tiers: TierConfig = field(default_factory=TierConfig)
    # overlap policy: pipelined (start the next batch's input distribution and slow-tier loads
    # while the current batch computes; sharded: also overlap the output exchange with the bottom
    # MLP) or plain. Results are bitwise identical either way.
    pipeline: bool = True
    # dense gradients' reduction (DDP hook): hierarchical (reduce-scatter inside the host,
    # all-reduce across hosts among peers, all-gather inside the host) or flat; auto:
    # hierarchical when the sharding plan spans more than one host
    dense_reduction: Literal["auto", "flat", "hierarchical"] = "auto"
    log_every: int = 20  # steps between metric-history points
    num_threads: int | None = None  # intra-op threads per process; null -> cores / local ranks
    reader_workers: int = 2
    prefetch: int = 4
    progress: Literal["auto", "bar", "log", "off"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # workers, hosts, rendezvous, restarts and deadlines; launch.world_size > 1 runs the sharded
    # runtime on torch.distributed
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # the validation split scored while training, and stopping at (and keeping) its best point
    validation: ValidateConfig = field(default_factory=ValidateConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    # the model validated, kept and returned: an exponential average of the weights (null: off)
    average: AverageConfig = field(default_factory=AverageConfig)
    fault_injection: FaultInjection | None = None
    # ids unseen in training look up a trained row: a share of the train ids routed to their
    # table's unknown row, and untrained rows filled from it (recscale.data.unknown_ids)
    unknown_ids: UnknownIdsConfig = field(default_factory=UnknownIdsConfig)

    RENAMED = {"batch_size": "batch_size_per_rank", "world_size": "launch.world_size",
               "nnodes": "launch.nnodes", "rdzv_endpoint": "launch.rdzv_endpoint",
               "max_restarts": "launch.max_restarts",
               "collective_timeout_s": "launch.collective_timeout_s",
               "eval_batch_size": "/evaluate.batch_size", "comms": "/comms"}

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    def validate(self, prefix: str = "train") -> None:
        check(self.batch_size_per_rank > 0, f"{prefix}.batch_size_per_rank",
              self.batch_size_per_rank, "a positive integer")
        check(self.epochs > 0, f"{prefix}.epochs", self.epochs, "a positive integer")
        check(self.max_steps is None or self.max_steps > 0, f"{prefix}.max_steps", self.max_steps,
              "null or a positive integer")
        check(self.log_every > 0, f"{prefix}.log_every", self.log_every, "a positive integer")
        check(self.num_threads is None or self.num_threads >= 1, f"{prefix}.num_threads",
              self.num_threads, "null or >= 1")
        check(self.reader_workers >= 1, f"{prefix}.reader_workers", self.reader_workers, ">= 1")
        check(self.prefetch >= 1, f"{prefix}.prefetch", self.prefetch, ">= 1")
        check_choice(f"{prefix}.progress", self.progress, ("auto", "bar", "log", "off"))
        check_choice(f"{prefix}.dense_reduction", self.dense_reduction,
                     ("auto", "flat", "hierarchical"))
        check_choice(f"{prefix}.device", self.device, ("auto", "cpu", "cuda"))
        if self.launch.multi_host:
            check(self.checkpoint.dir is not None, f"{prefix}.checkpoint.dir", None,
                  f"a directory every host sees (a shared filesystem) with {prefix}.launch."
                  f"nnodes={self.launch.nnodes!r}: the job's checkpoints and model go there")
        c = self.dense_optimizer.curvature_batch_size
        if c is not None:
            g = self.batch_size_per_rank * self.world_size
            check(c <= g and c % self.world_size == 0, f"{prefix}.dense_optimizer."
                  "curvature_batch_size", c, f"at most the global batch ({prefix}."
                  f"batch_size_per_rank x world size = {g}) and a multiple of the world size "
                  f"{self.world_size}")
        if self.early_stopping.enabled:
            check(self.validation.enabled, f"{prefix}.early_stopping.enabled", True,
                  f"false when {prefix}.validation.enabled is false (early stopping reads the "
                  "validation metric)")
        if self.fault_injection is not None:
            check(self.fault_injection.rank < self.world_size, f"{prefix}.fault_injection.rank",
                  self.fault_injection.rank, f"< {prefix}.launch.world_size={self.world_size}")


@dataclass(frozen=True)
class DLRMConfig(Validated):
    """Every block of parameters_dlrm.yml, parsed once: ``parse(DLRMConfig, params, "")``."""

    data: DataConfig = field(default_factory=DataConfig)
    # the feature schema (recscale.data.schema, docs/features.md): a preset's name or the schema
    features: FeatureSchema | Literal["criteo"] = "criteo"
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    comms: CommsConfig = field(default_factory=CommsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)

    @property
    def schema(self) -> FeatureSchema:
        """The ``features`` block as a schema (a preset's name resolved)."""
        return parse_features(self.features)

    def validate(self, prefix: str = "") -> None:
        dot = f"{prefix}." if prefix else ""
        custom = not isinstance(self.features, str)
        allowed = ("table", "dataset", "synthetic") if custom else \
            ("synthetic", "criteo_tsv", "parquet")
        if self.data.source not in allowed:
            raise ConfigError(
                f"{dot}features={'a schema' if custom else repr(self.features)} is not allowed "
                f"with {dot}data.source={self.data.source!r}: a schema of your own reads "
                "data.source 'table' (parquet or delimited text) or 'dataset' (the catalog's "
                "raw_table), or draws 'synthetic' rows for itself, and 'table' and 'dataset' "
                "need one; the Criteo sources (criteo_tsv, parquet) take features: criteo")
        self.train.dense_optimizer.check_model(self.model, f"{dot}train.dense_optimizer")
