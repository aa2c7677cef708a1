"""Kedro project settings."""

import os
import warnings

from kedro.config import OmegaConfigLoader

from recscale.hooks import RecscaleHooks, SparkHooks, TrackingStoreCheck

# Kedro 1.7 and kedro-mlflow call omegaconf's register_new_resolver, deprecated in the omegaconf
# they install; nothing a user of this project can act on
warnings.filterwarnings("ignore", message=r"register_new_resolver\(\) is deprecated",
                        category=UserWarning)

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
