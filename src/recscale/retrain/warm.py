"""Where a retrain starts from, and training from that state.

A warm-start source is a function that returns a ``WarmStart`` (a state_dict and the resolved
config it was trained with) or None when it has nothing. ``first_warm_start`` tries sources in
order. ``state_dict_file_source`` reads the previous retrain's model file; the MLflow champion
source lives on the Kedro side (recscale.pipelines.retrain) because the library never imports
MLflow. A checkpoint directory (issue 9) plugs in as one more source function.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from recscale.config import ConfigError
from recscale.model import ModelConfig
from recscale.train import TrainConfig
from recscale.train.api import TrainOutcome, build_model_for
from recscale.train.loop import resolve_device, set_threads

log = logging.getLogger(__name__)

LATEST_FILE = "latest.pt"


@dataclass
class WarmStart:
    source: str  # "latest", "champion", ... or "cold"
    state: dict[str, torch.Tensor] | None = None
    config: dict = field(default_factory=dict)  # resolved config: model, train, table_sizes
    detail: str = ""
    checkpoint: str | None = None  # a checkpoint directory: weights and optimizer state

    @property
    def table_sizes(self) -> list[int] | None:
        return self.config.get("table_sizes")


WarmStartSource = Callable[[], "WarmStart | None"]


def first_warm_start(sources: Sequence[tuple[str, WarmStartSource]]) -> WarmStart:
    """The first source that has a model, else a cold start."""
    for name, fn in sources:
        ws = fn()
        if ws is not None:
            log.info("warm start from %s: %s", name, ws.detail)
            return ws
        log.info("warm-start source %s has no model", name)
    return WarmStart("cold", detail="no warm-start source had a model: training from scratch")


def save_latest(model_dir: str | os.PathLike, state: dict, resolved_config: dict, **info) -> Path:
    """One file holding the state_dict and its resolved config, replaced atomically."""
    path = Path(model_dir) / LATEST_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"state_dict": {k: v.detach().cpu() for k, v in state.items()},
                "resolved_config": json.dumps(resolved_config), "info": json.dumps(info)}, tmp)
    os.replace(tmp, path)
    return path


def state_dict_file_source(model_dir: str | os.PathLike) -> WarmStartSource:
    """The model ``save_latest`` wrote in ``model_dir`` (the previous retrain's)."""
    def load() -> WarmStart | None:
        path = Path(model_dir) / LATEST_FILE
        if not path.exists():
            return None
        blob = torch.load(path, map_location="cpu", weights_only=True)
        info = json.loads(blob.get("info", "{}"))
        return WarmStart("latest", blob["state_dict"], json.loads(blob["resolved_config"]),
                         f"{path} ({', '.join(f'{k} {v}' for k, v in info.items()) or 'no info'})")
    return load


def checkpoint_source(checkpoint_dir: str | os.PathLike) -> WarmStartSource:
    """The newest checkpoint under ``checkpoint_dir`` (previous retrains write theirs there):
    weights and the embedding and dense optimizers' state, unlike a state_dict."""
    def load() -> WarmStart | None:
        from recscale.train.checkpoint import list_checkpoints, read_manifest

        found = list_checkpoints(str(checkpoint_dir), all_runs=True)
        if not found:
            return None
        manifest = read_manifest(found[0])
        fp = manifest.get("fingerprint", {})
        return WarmStart("checkpoint", None, {"table_sizes": fp.get("table_sizes"),
                                              "model": fp.get("model")},
                         f"{found[0]} (step {manifest['step']} of run {manifest['run_id']})",
                         checkpoint=found[0])
    return load


def train_warm(manifest: dict, model_cfg: ModelConfig, train_cfg: TrainConfig,
               warm: WarmStart | None = None, checkpoint_dir: str | None = None) -> TrainOutcome:
    """Train on the manifest's train split starting from ``warm`` (single process).

    From a checkpoint, the run starts with its weights and optimizer state; from a state_dict
    (``latest``, ``champion``) the optimizers start fresh. With ``checkpoint_dir`` the run writes
    its own checkpoints there (the next retrain's ``checkpoint`` source)."""
    import dataclasses

    from recscale.train.api import train_in_process

    ck = train_cfg.checkpoint
    ck = dataclasses.replace(ck, dir=str(checkpoint_dir) if checkpoint_dir else ck.dir,
                             resume="never",
                             init_from=warm.checkpoint if warm is not None else None)
    train_cfg = dataclasses.replace(train_cfg, checkpoint=ck)
    if train_cfg.world_size != 1:
        raise ConfigError(f"train.world_size={train_cfg.world_size} is not allowed in dlrm_retrain: "
                          "expected 1 (warm-starting the sharded runtime waits for checkpoints)")
    device = resolve_device(train_cfg.device)
    threads = set_threads(train_cfg.num_threads)
    model = build_model_for(manifest, model_cfg, train_cfg, device)
    if warm is not None and warm.state is not None:
        if warm.table_sizes is not None and list(warm.table_sizes) != list(manifest["table_sizes"]):
            raise ValueError(f"warm start from {warm.source} has table sizes {warm.table_sizes} "
                             f"but the data has {manifest['table_sizes']}")
        try:
            model.load_state_dict(warm.state)
        except RuntimeError as exc:
            raise ValueError(f"the {warm.source} model does not fit model={model_cfg}: {exc}. "
                             "Change the model back, or set retrain.warm_start: [] to start "
                             "cold") from None
    result = train_in_process(model, manifest, model_cfg, train_cfg, device)
    return TrainOutcome(model, result, tuple(manifest["table_sizes"]), threads, str(device))
