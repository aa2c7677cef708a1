"""Kedro project settings."""

import os

from kedro.config import OmegaConfigLoader

from recscale.hooks import RecscaleHooks, SparkHooks, TrackingStoreCheck
from recscale.warning_filters import install as install_warning_filters

# library warnings nobody using this project can act on (also installed at kedro's start-up)
install_warning_filters()

# MLflow draws a progress bar for every artifact it downloads (a model it loads or logs: three
# bars per model); a run's log shows our progress instead
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

HOOKS = (TrackingStoreCheck(), RecscaleHooks(), SparkHooks())

CONFIG_LOADER_CLASS = OmegaConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # an environment overrides single keys of a parameter block, not the whole block
    "merge_strategy": {"parameters": "soft"},
}
