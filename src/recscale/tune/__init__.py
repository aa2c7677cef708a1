"""Hyperparameter search over a DLRM config with Optuna (``kedro run --pipelines=tune``):
``space`` (the keys searched and their ranges), ``config`` (``TuneConfig``, the ``tune`` block),
``trial`` (one config trained and scored), ``study`` (the study, its pruner and storage, the best
trial's parameters as a config env). No Kedro or MLflow here: the pipeline's node logs each trial
as a nested MLflow run."""

from recscale.tune.config import TuneConfig
from recscale.tune.space import DEFAULT_SPACE, Param, apply, check_space, parse_space, set_key
from recscale.tune.study import (
    StudyResult,
    TrialObserver,
    best_values,
    figures,
    open_study,
    run_study,
    trials_table,
    write_env,
)
from recscale.tune.trial import TrialOutcome, run_trial

__all__ = ["DEFAULT_SPACE", "Param", "StudyResult", "TrialObserver", "TrialOutcome", "TuneConfig", "apply",
           "best_values", "check_space", "figures", "open_study", "parse_space", "run_study",
           "run_trial", "set_key", "trials_table", "write_env"]
