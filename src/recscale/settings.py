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


def _replaced(base: dict, env: dict) -> dict:
    """``base`` without the keys whose env value is another kind of value (a mapping where base
    has a list, ``preprocess.splits: {by: ts, ...}`` over ``[0.8, 0.1, 0.1]``): the env's
    value replaces them whole, as a scalar would; mappings in both merge key by key."""
    out = dict(base)
    for k, v in env.items():
        if k not in out:
            continue
        if isinstance(out[k], dict) and isinstance(v, dict):
            out[k] = _replaced(out[k], v)
        elif isinstance(out[k], (dict, list)) or isinstance(v, (dict, list)):
            del out[k]
    return out


class ConfigLoader(OmegaConfigLoader):
    """Kedro's loader whose soft merge lets an env give a mapping where base has a list (and
    the other way round), which OmegaConf's merge refuses."""

    @staticmethod
    def _soft_merge(config, env_config, env_path=None):
        return OmegaConfigLoader._soft_merge(_replaced(config, env_config), env_config, env_path)


CONFIG_LOADER_CLASS = ConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # an environment overrides single keys of a parameter block, not the whole block
    "merge_strategy": {"parameters": "soft"},
}
