"""Kedro project settings."""

from kedro.config import OmegaConfigLoader

from recscale.hooks import RecscaleHooks, TrackingStoreCheck

HOOKS = (TrackingStoreCheck(), RecscaleHooks())

CONFIG_LOADER_CLASS = OmegaConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # an environment overrides single keys of a parameter block, not the whole block
    "merge_strategy": {"parameters": "soft"},
}
