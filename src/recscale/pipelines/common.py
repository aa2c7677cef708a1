"""Helpers shared by the Kedro nodes (Kedro side only)."""

from __future__ import annotations

import math


def as_metrics(values: dict[str, float], step: int = 0) -> dict[str, dict]:
    """{name: number} -> the {name: {value, step}} form kedro-mlflow's metrics dataset logs.
    Non-finite values are left out (MLflow rejects NaN in some stores); the caller logs them."""
    return {k: {"value": float(v), "step": step} for k, v in values.items()
            if v is not None and math.isfinite(float(v))}
