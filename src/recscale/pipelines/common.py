"""Helpers shared by the Kedro nodes (Kedro side only)."""

from __future__ import annotations

import math

from kedro.pipeline import Node

from recscale.config import parse
from recscale.runconfig import DLRMConfig

DLRM_BLOCKS = ("data", "features", "preprocess", "sharding", "comms", "model", "train", "evaluate")


def as_metrics(values: dict[str, float], step: int = 0) -> dict[str, dict]:
    """{name: number} -> the {name: {value, step}} form kedro-mlflow's metrics dataset logs.
    Non-finite values are left out (MLflow rejects NaN in some stores); the caller logs them."""
    return {k: {"value": float(v), "step": step} for k, v in values.items()
            if v is not None and math.isfinite(float(v))}


def parse_dlrm_config(*blocks: dict) -> DLRMConfig:
    """Every block of parameters_dlrm.yml (``DLRM_BLOCKS``, in order) into one typed config, once
    per run; a bad key or value fails here, before any work, naming the full key."""
    return parse(DLRMConfig, dict(zip(DLRM_BLOCKS, blocks, strict=True)), "")


def dlrm_config_node() -> Node:
    """The first node of every DLRM pipeline (identical in each, so joined pipelines run it once)."""
    return Node(parse_dlrm_config, [f"params:{b}" for b in DLRM_BLOCKS], "dlrm_config",
                name="parse_dlrm_config")
