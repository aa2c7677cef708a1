"""The Hessian-free application: fully connected classifiers on MNIST and on spoken-digit frames
(the ``hf`` and ``hf_speech`` pipelines) trained with ``recscale.optim.HessianFree`` (1 or more
data-parallel ranks) against first-order baselines (SGD, Adam, SOAP) on the same data.

- ``config.py``: the network, schedule, baselines and the pipelines' root configs
- ``fit.py``: ``fit_hessian_free``, ``fit_baseline``, ``load_model``
- ``loop.py``: one rank's HF loop and what the fits share; ``workers.py``: the launched worker
- ``plots.py``: the comparison figure
"""

from recscale.hf.config import (
    BaselinesConfig,
    FitConfig,
    HFJobConfig,
    MnistJobConfig,
    NetConfig,
    SpeechJobConfig,
)
from recscale.hf.fit import fit_baseline, fit_hessian_free, load_model
from recscale.hf.loop import FitResult, build_mlp, evaluate_classifier

__all__ = [
    "BaselinesConfig",
    "FitConfig",
    "FitResult",
    "HFJobConfig",
    "MnistJobConfig",
    "NetConfig",
    "SpeechJobConfig",
    "build_mlp",
    "evaluate_classifier",
    "fit_baseline",
    "fit_hessian_free",
    "load_model",
]
