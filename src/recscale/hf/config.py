"""Configuration of the Hessian-free application: the network (``NetConfig``), the schedule and its
launch (``FitConfig``), the first-order baselines (``BaselinesConfig``), and the root configs of
the ``hf`` pipelines (``HFJobConfig``: a whole parameter block, ``hf`` or ``hf_speech``, data
included, parsed once into one object every step of the job reads)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from torch import nn

from recscale.config import Validated, check, check_choice
from recscale.data.frames import SpeechFramesConfig
from recscale.data.idx import MnistConfig
from recscale.distributed import LaunchConfig
from recscale.optim import HessianFreeConfig

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "softplus": nn.Softplus, "sigmoid": nn.Sigmoid}
BASELINES = ("sgd", "adam", "soap")  # soap: pytorch-optimizer (the extra `second_order`)


@dataclass(frozen=True)
class NetConfig(Validated):
    """Fully connected classifier: len(hidden) + 1 linear layers (default 4)."""

    hidden: tuple[int, ...] = (256, 128, 64)
    activation: Literal["relu", "tanh", "softplus", "sigmoid"] = "relu"

    def validate(self, prefix: str = "model") -> None:
        check(all(h > 0 for h in self.hidden), f"{prefix}.hidden", list(self.hidden),
              "a list of positive layer widths")
        check_choice(f"{prefix}.activation", self.activation, tuple(ACTIVATIONS))


@dataclass(frozen=True)
class FitConfig(Validated):
    """The ``train`` block: schedule shared by HF and the baselines."""

    RENAMED: ClassVar[dict[str, str]] = {
        "batch_size": "global_batch_size",
        "world_size": "launch.world_size",
        "collective_timeout_s": "launch.collective_timeout_s",
    }

    global_batch_size: int = 1000  # the gradient batch, over all workers
    curvature_batch_size: int | None = None  # HF: curvature mini-batch (null = global_batch_size)
    epochs: float = 10.0  # passes over the training split (gradient batches)
    max_steps: int | None = None
    eval_every: float = 1.0  # passes between validation evaluations
    seed: int = 0
    # HF data-parallel workers (world_size), rendezvous and deadlines: shared with DLRM training
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    num_threads: int | None = None  # per worker; null = cores / workers on this host
    progress: Literal["auto", "bar", "log", "off"] = "auto"
    dtype: Literal["float32", "float64"] = "float32"

    def validate(self, prefix: str = "train") -> None:
        check(self.global_batch_size > 0, f"{prefix}.global_batch_size", self.global_batch_size,
              "a positive integer")
        check(self.curvature_batch_size is None
              or 0 < self.curvature_batch_size <= self.global_batch_size,
              f"{prefix}.curvature_batch_size", self.curvature_batch_size,
              f"null or in [1, global_batch_size={self.global_batch_size}]")
        check(self.epochs > 0, f"{prefix}.epochs", self.epochs, "> 0")
        check(self.max_steps is None or self.max_steps > 0, f"{prefix}.max_steps",
              self.max_steps, "null or a positive integer")
        check(self.eval_every > 0, f"{prefix}.eval_every", self.eval_every, "> 0")
        check(self.num_threads is None or self.num_threads >= 1, f"{prefix}.num_threads",
              self.num_threads, "null or >= 1")
        check_choice(f"{prefix}.progress", self.progress, ("auto", "bar", "log", "off"))
        check_choice(f"{prefix}.dtype", self.dtype, ("float32", "float64"))


@dataclass(frozen=True)
class SGDConfig(Validated):
    learning_rate: float = 0.05
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0

    def validate(self, prefix: str = "baselines.sgd") -> None:
        check(self.learning_rate > 0, f"{prefix}.learning_rate", self.learning_rate, "> 0")
        check(0 <= self.momentum < 1, f"{prefix}.momentum", self.momentum, "in [0, 1)")
        check(self.weight_decay >= 0, f"{prefix}.weight_decay", self.weight_decay, ">= 0")


@dataclass(frozen=True)
class AdamConfig(Validated):
    learning_rate: float = 1e-3
    weight_decay: float = 0.0

    def validate(self, prefix: str = "baselines.adam") -> None:
        check(self.learning_rate > 0, f"{prefix}.learning_rate", self.learning_rate, "> 0")
        check(self.weight_decay >= 0, f"{prefix}.weight_decay", self.weight_decay, ">= 0")


@dataclass(frozen=True)
class SOAPConfig(Validated):
    """SOAP (Shampoo's preconditioner, Adam in its eigenbasis) from pytorch-optimizer."""

    learning_rate: float = 3e-3
    weight_decay: float = 0.0

    def validate(self, prefix: str = "baselines.soap") -> None:
        check(self.learning_rate > 0, f"{prefix}.learning_rate", self.learning_rate, "> 0")
        check(self.weight_decay >= 0, f"{prefix}.weight_decay", self.weight_decay, ">= 0")


@dataclass(frozen=True)
class BaselinesConfig(Validated):
    """The ``baselines`` block: first-order optimizers trained on the same data and network."""

    RENAMED: ClassVar[dict[str, str]] = {"batch_size": "global_batch_size"}

    optimizers: tuple[str, ...] = ("sgd", "adam")
    global_batch_size: int | None = None  # null = train.global_batch_size
    epochs: float | None = None  # null = train.epochs
    sgd: SGDConfig = field(default_factory=SGDConfig)
    adam: AdamConfig = field(default_factory=AdamConfig)
    soap: SOAPConfig = field(default_factory=SOAPConfig)

    def validate(self, prefix: str = "baselines") -> None:
        for i, name in enumerate(self.optimizers):
            check_choice(f"{prefix}.optimizers[{i}]", name, BASELINES)
        check(self.global_batch_size is None or self.global_batch_size > 0,
              f"{prefix}.global_batch_size", self.global_batch_size, "null or a positive integer")
        check(self.epochs is None or self.epochs > 0, f"{prefix}.epochs", self.epochs, "null or > 0")


@dataclass(frozen=True)
class HFJobConfig(Validated):
    """Network, Hessian-free settings, schedule (with the launch) and baselines."""

    model: NetConfig = field(default_factory=NetConfig)
    optimizer: HessianFreeConfig = field(default_factory=HessianFreeConfig)
    train: FitConfig = field(default_factory=FitConfig)
    baselines: BaselinesConfig = field(default_factory=BaselinesConfig)


@dataclass(frozen=True)
class MnistJobConfig(HFJobConfig):
    """The ``hf`` block: IDX images (MNIST) -> splits -> HF and baselines."""

    data: MnistConfig = field(default_factory=MnistConfig)


@dataclass(frozen=True)
class SpeechJobConfig(HFJobConfig):
    """The ``hf_speech`` block: MFCC frames in context windows -> splits -> HF and baselines."""

    data: SpeechFramesConfig = field(default_factory=SpeechFramesConfig)
