"""Training, and only training: the entry point (``entry.py``: ``train_dlrm``, one process,
sharded, tiered or across hosts; ``resolved_config``), the one loop (``loop.py``, with its
overlap policies in ``overlap.py`` and deliberate faults in ``faults.py``), validation while
training and early stopping (``validation.py``), the weights' average the run hands back
(``average.py``), what a rank's run returns (``result.py``), the runtimes
(``runtime.py``: one process, one rank of the sharded runtime), the steps (``step.py``,
``hf_step.py``), checkpoints (``checkpoint.py`` writes, ``checkpoint_files.py`` reads), and the
workers (``rank.py``: what every rank runs; ``job_worker.py``: a rank of a job across hosts).

The run's configuration is ``recscale.runconfig``; a run's summary and its reports against the
plan are ``recscale.report``; scoring a trained model is ``recscale.scoring``; a trained model
between devices and tiers is ``recscale.model.convert``."""

from recscale.train.entry import TrainOutcome, resolved_config, train_dlrm
from recscale.train.step import NonFiniteLossError, TrainStep

__all__ = [
    "NonFiniteLossError",
    "TrainOutcome",
    "TrainStep",
    "resolved_config",
    "train_dlrm",
]
