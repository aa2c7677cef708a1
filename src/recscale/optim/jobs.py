"""Root typed configs of the Hessian-free jobs: a whole parameter block (``hf``, ``hf_speech``)
parsed once, data included, into one object that every step of the job reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from recscale.config import Validated
from recscale.data.frames import SpeechFramesConfig
from recscale.data.idx import MnistConfig
from recscale.optim.config import HessianFreeConfig
from recscale.optim.trainer import BaselinesConfig, FitConfig, NetConfig


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
