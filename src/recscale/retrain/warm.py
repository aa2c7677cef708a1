"""Where a retrain starts from, and training from that state.

A warm-start source is a function that returns a ``WarmStart`` (a state_dict and the resolved
config it was trained with, or a checkpoint directory) or None when it has nothing.
``first_warm_start`` tries sources in order. ``state_dict_file_source`` reads the previous
retrain's model file and ``checkpoint_source`` its newest checkpoint; the MLflow champion source
lives on the Kedro side (recscale.pipelines.retrain) because the library never imports MLflow.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from recscale.config import ConfigError
from recscale.data.schema import FittedSchema, schema_change
from recscale.model import check_table_growth
from recscale.retrain.config import DLRMRetrainConfig
from recscale.runconfig import plan_for_run
from recscale.train import TrainOutcome, train_dlrm

log = logging.getLogger(__name__)

LATEST_FILE = "latest.pt"


@dataclass
class WarmStart:
    source: str  # "latest", "champion", "checkpoint" or "cold"
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


def checkpoint_source(checkpoint_dir: str | os.PathLike,
                      ledger: str | os.PathLike | None = None) -> WarmStartSource:
    """The checkpoint of the last night the ``ledger`` records as consumed (its model was
    registered), else the newest checkpoint directly under ``checkpoint_dir``: weights and the
    embedding and dense optimizers' state, unlike a state_dict. A night that failed before
    registering is not a warm start: its own rerun resumes from its checkpoints."""
    def load() -> WarmStart | None:
        from recscale.retrain.partitions import PartitionLedger
        from recscale.train.checkpoint import list_checkpoints, read_manifest

        done = [e["checkpoint"] for e in (PartitionLedger(ledger).entries() if ledger else [])
                if e.get("checkpoint")]
        found = [done[-1]] if done and os.path.isdir(done[-1]) else \
            list_checkpoints(str(checkpoint_dir), all_runs=True)
        if not found:
            return None
        manifest = read_manifest(found[0])
        fp = manifest.get("fingerprint", {})
        return WarmStart("checkpoint", None, {"table_sizes": fp.get("table_sizes"),
                                              "model": fp.get("model")},
                         f"{found[0]} (step {manifest['step']} of run {manifest['run_id']})",
                         checkpoint=found[0])
    return load


def train_warm(manifest: dict, cfg: DLRMRetrainConfig, warm: WarmStart | None = None,
               checkpoint_dir: str | None = None, plan=None, resume: bool = False
               ) -> TrainOutcome:
    """Train on the manifest's train split starting from ``warm``, on the same path as every
    other run (``train_dlrm``: one process or sharded over ``train.launch.world_size`` ranks,
    the plan's memory tiers, a CPU model back). ``plan``: the sharding plan (default: planned
    here, as ``plan_for_run`` plans a ``dlrm`` run).

    From a checkpoint, the run starts with its weights and optimizer state; from a state_dict
    (``latest``, ``champion``) with its tables and their optimizer state, the dense optimizer
    fresh. With ``preprocess.ids: vocab`` the data's tables may be larger than the warm
    model's (its vocabulary grew): the tables grow, every old row and its optimizer state kept,
    new rows as a fresh model initialises them; a table that would shrink fails, naming it and
    both sizes. A checkpoint's rows are read by offset into the grown tables
    (``train.checkpoint.init_grow``; sharded, each rank its shards' rows, whatever the world size
    and plan that wrote it), with both optimizers' state; only a run that writes no checkpoints
    goes through the checkpoint's state_dict (the dense optimizer fresh). Sharded, a state_dict
    is first written as a checkpoint (``warm_checkpoint``). With
    ``checkpoint_dir`` the run writes its own checkpoints there (the next retrain's
    ``checkpoint`` source); with ``resume`` a checkpoint already there (the same night, run
    again after a failure) is resumed exactly instead (any world size), the warm start unused."""
    if warm is not None and "schema" in warm.config and "schema" in manifest:
        change = schema_change(FittedSchema.of(warm.config).schema,
                               FittedSchema.of(manifest).schema)
        if change:
            raise ConfigError(f"the warm start from {warm.source} was trained on another feature "
                              f"schema: {change}. A retrain keeps its model's schema; train a "
                              "model of the new one with the dlrm pipeline")
    sharded = cfg.train.world_size > 1
    init_from = warm.checkpoint if warm else None
    state = warm.state if warm is not None else None
    grow_from = None
    if warm is not None and warm.table_sizes is not None \
            and list(warm.table_sizes) != list(manifest["table_sizes"]):
        fitted = FittedSchema.of(manifest)
        changed = [n for n, a, b in zip(fitted.table_names, warm.table_sizes,
                                        manifest["table_sizes"]) if int(a) != int(b)]
        if len(warm.table_sizes) != len(manifest["table_sizes"]) or \
                any(n not in fitted.schema.vocab_tables for n in changed):
            raise ValueError(f"warm start from {warm.source} has table sizes {warm.table_sizes} "
                             f"but the data has {manifest['table_sizes']} (only tables of "
                             "ids: vocab grow)")
        # a grown vocabulary: the tables grow, old rows kept, new rows fresh
        check_table_growth(warm.table_sizes, manifest["table_sizes"], fitted.table_names)
        grow_from = list(warm.table_sizes)
        if init_from is not None and checkpoint_dir is None and not cfg.train.checkpoint.dir:
            # no checkpoints in this run: the checkpoint's tables and their state, through a
            # state_dict (the dense optimizer fresh)
            state, init_from = checkpoint_state(init_from, grow_from, manifest, cfg), None
    if sharded and state is not None:  # the sharded runtime starts from checkpoints only
        init_from = warm_checkpoint(state, warm.table_sizes or manifest["table_sizes"], manifest,
                                    cfg, Path(cfg.retrain.model_dir) / "warm_start")
        state = None
    ck = dataclasses.replace(cfg.train.checkpoint,
                             dir=str(checkpoint_dir) if checkpoint_dir else cfg.train.checkpoint.dir,
                             resume="latest" if resume else "never", init_from=init_from,
                             init_grow=init_from is not None and grow_from is not None)
    train = dataclasses.replace(cfg.train, checkpoint=ck)
    if train.reinit_embeddings and (state is not None or init_from is not None):
        # the reset starts later epochs' tables from a fresh build's values: it would throw
        # away what the warm model's tables hold
        log.info("train.reinit_embeddings is off for this warm start (a reset would discard the "
                 "warm model's table rows)")
        train = dataclasses.replace(train, reinit_embeddings=False)
    cfg = dataclasses.replace(cfg, train=train)
    return train_dlrm(manifest, cfg.model, cfg.train, plan=plan or plan_for_run(manifest, cfg),
                      comms=cfg.comms, sharding=cfg.sharding, init_state=state,
                      init_state_table_sizes=grow_from if state is not None else None)


def warm_checkpoint(state: dict[str, torch.Tensor], table_sizes: Sequence[int], manifest: dict,
                    cfg: DLRMRetrainConfig, out_dir: str | os.PathLike) -> str:
    """A warm start's state_dict (of tables ``table_sizes``) written as a checkpoint under
    ``out_dir``, so the sharded runtime can start from it (each rank reads its shards' rows by
    offset): the tables and their optimizer state, the dense layers, a fresh dense optimizer."""
    from recscale.runconfig import CheckpointConfig, recipe_for
    from recscale.train.checkpoint import Checkpointer, dense_tensors, model_fingerprint
    from recscale.train.step import make_dense_optimizer

    old = {**manifest, "table_sizes": list(table_sizes)}
    model = recipe_for(old, cfg.model, cfg.train).build("cpu")
    model.load_state_dict(state)
    dense, rest = dense_tensors(model.dense, make_dense_optimizer(model.dense.parameters(),
                                                                  cfg.train.dense_optimizer))
    shutil.rmtree(out_dir, ignore_errors=True)
    ckpt = Checkpointer(CheckpointConfig(dir=str(out_dir), keep_last=1), "warm",
                        fingerprint=model_fingerprint(old, cfg.model, cfg.train))
    path = ckpt.save(0, model.embeddings.shards(), dense, rest, {"steps": 0})
    if path is None:
        raise RuntimeError(f"could not write the warm start as a checkpoint under {out_dir}")
    return path


def checkpoint_state(path: str, table_sizes: list[int], manifest: dict,
                     cfg: DLRMRetrainConfig) -> dict[str, torch.Tensor]:
    """A checkpoint of a model with ``table_sizes`` -> its in-memory CPU state_dict (tables,
    embedding-optimizer state, dense layers; not the dense optimizer's state)."""
    from recscale.runconfig import CheckpointConfig, recipe_for
    from recscale.train.checkpoint import Checkpointer, model_fingerprint

    old = {**manifest, "table_sizes": table_sizes}
    model = recipe_for(old, cfg.model, cfg.train).build("cpu")
    ckpt = Checkpointer(CheckpointConfig(dir=os.path.dirname(path), resume="never",
                                         init_from=path), "read-only",
                        fingerprint=model_fingerprint(old, cfg.model, cfg.train))
    ckpt.init_from_checkpoint(model.embeddings.shards(), model.dense, None)
    return model.state_dict()
