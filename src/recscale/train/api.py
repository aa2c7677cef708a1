"""Entry points the Kedro nodes (and notebooks) call: train and evaluate a DLRM from a manifest.

``manifest`` is the dict that preprocessing writes (``_manifest.json``): split files, table sizes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from recscale.data.criteo import NUM_DENSE
from recscale.data.loader import LoaderConfig, count_rows, make_loader
from recscale.evaluate.metrics import auc_score, binary_metrics
from recscale.model.dlrm import DLRM, ModelConfig, build_dlrm
from recscale.train.config import TrainConfig
from recscale.train.loop import TrainResult, predict, resolve_device, set_threads, train_epochs

log = logging.getLogger(__name__)


@dataclass
class TrainOutcome:
    model: DLRM
    result: TrainResult
    table_sizes: tuple[int, ...]
    threads: int
    device: str


def build_model_for(manifest: dict, model_cfg: ModelConfig, train_cfg: TrainConfig,
                    device: torch.device | str = "cpu") -> DLRM:
    return build_dlrm(model_cfg, manifest["table_sizes"], NUM_DENSE,
                      train_cfg.embedding_optimizer, seed=train_cfg.seed, device=device)


def train_dlrm(manifest: dict, model_cfg: ModelConfig, train_cfg: TrainConfig) -> TrainOutcome:
    """Train on the manifest's train split in this process."""
    device = resolve_device(train_cfg.device)
    threads = set_threads(train_cfg.num_threads)
    model = build_model_for(manifest, model_cfg, train_cfg, device)
    files = manifest["splits"]["train"]["files"]
    rows = count_rows(files)
    if rows == 0:
        raise ValueError("the train split is empty: check preprocess.splits and the input data")
    loader_cfg = LoaderConfig(batch_size=train_cfg.batch_size, reader_workers=train_cfg.reader_workers,
                              prefetch=train_cfg.prefetch, pin_memory=device.type == "cuda")
    steps_per_epoch = -(-rows // train_cfg.batch_size)
    result = train_epochs(
        model, None, train_cfg, make_epoch=lambda: make_loader(files, loader_cfg),
        total_steps=steps_per_epoch * train_cfg.epochs, device=device,
    )
    expected = rows * train_cfg.epochs
    if train_cfg.max_steps is None and result.samples != expected:
        raise RuntimeError(f"trained on {result.samples} samples but the train split holds "
                           f"{rows} rows x {train_cfg.epochs} epochs = {expected}")
    return TrainOutcome(model, result, tuple(manifest["table_sizes"]), threads, str(device))


def evaluate_dlrm(model: DLRM, manifest: dict, split: str, batch_size: int,
                  oracle_probs: np.ndarray | None = None) -> dict[str, float]:
    """Click metrics of ``model`` on one split; with the generator's true probabilities, also the
    oracle AUC of the same rows (the best any model can expect)."""
    files = manifest["splits"][split]["files"]
    loader = make_loader(files, LoaderConfig(batch_size=batch_size))
    labels, probs, rows = predict(model, loader)
    expected = manifest["splits"][split]["rows"]
    if labels.size != expected:
        raise RuntimeError(f"evaluated {labels.size} rows of {split} but it holds {expected}")
    metrics = binary_metrics(labels, probs)
    if oracle_probs is not None and labels.size:
        metrics["oracle_auc"] = auc_score(labels, oracle_probs[rows])
        metrics["auc_gap_to_oracle"] = metrics["oracle_auc"] - metrics["auc"]
    return metrics
