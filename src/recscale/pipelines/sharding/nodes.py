"""Thin sharding node: table specs from the preprocessed data, plan, report, chart."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from recscale.comm import CommsConfig
from recscale.config import ConfigError, parse
from recscale.pipelines.common import as_metrics
from recscale.sharding import Topology, plan_sharding, save_chart
from recscale.sharding.from_data import table_specs_from_manifest

log = logging.getLogger(__name__)

_KEYS = {"topology", "world_size", "local_world_size", "options"}


def _with_ram_budget(topo: Topology, tiers_params: dict | None) -> Topology:
    """``train.tiers.ram_budget_bytes``: each rank gets that much RAM for embeddings and an SSD
    tier (the free space of ``train.tiers.scratch_dir``), so larger tables are planned onto SSD."""
    from recscale.embedding.tier_config import TierConfig

    tiers = parse(TierConfig, tiers_params or {}, "train.tiers")
    if tiers.ram_budget_bytes is None:
        return topo
    scratch = tiers.scratch_dir or tempfile.gettempdir()
    os.makedirs(scratch, exist_ok=True)
    free = shutil.disk_usage(scratch).free / topo.local_world_size
    return topo.with_ram_budget(tiers.ram_budget_bytes, free)


def plan_tables(dataset_manifest: dict, sharding_params: dict, model_params: dict,
                train_params: dict, comms_params: dict | None = None):
    unknown = sorted(set(sharding_params) - _KEYS)
    if unknown:
        raise ConfigError(f"unknown key sharding.{unknown[0]}; allowed keys under sharding: "
                          f"{', '.join(sorted(_KEYS))}")
    world = sharding_params.get("world_size") or train_params.get("world_size", 1)
    topo = Topology.preset(sharding_params.get("topology", "cpu-local"), world_size=world,
                           local_world_size=sharding_params.get("local_world_size"))
    topo = _with_ram_budget(topo, train_params.get("tiers"))
    opts = {"optimizer": train_params.get("embedding_optimizer", {}).get(
        "name", "exact_rowwise_adagrad"), **(sharding_params.get("options") or {})}
    if comms_params is not None:  # the planner prices the wire precisions the run will use
        opts["comms"] = parse(CommsConfig, comms_params, "comms")
    plan = plan_sharding(table_specs_from_manifest(dataset_manifest, model_params["embedding_dim"]), topo,
                         train_params["batch_size"], opts)
    log.info("sharding plan\n%s", plan.report())
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / "plan.png"
        save_chart(plan, chart)
        from PIL import Image

        image = Image.open(chart)
        image.load()
    metrics = {
        "max_cost_ms": plan.max_cost * 1e3,
        "mean_cost_ms": plan.mean_cost * 1e3,
        "max_over_mean": plan.max_over_mean,
        "planning_seconds": plan.planning_seconds,
        "world_size": plan.world_size,
    }
    return plan.to_dict(), plan.report(), image, as_metrics(metrics)
