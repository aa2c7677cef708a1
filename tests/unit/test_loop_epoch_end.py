"""The end of an epoch in the one training loop: a loader with reader threads is ended on the
training thread (a full garbage collection), and batches held in memory cost no collection."""

import torch
import torchdata.nodes as tn

from recscale.config import parse
from recscale.data.batch import Batch, SparseFeatures
from recscale.embedding import EmbeddingOptimizerConfig
from recscale.model import ModelConfig, build_dlrm
from recscale.runconfig import TrainConfig
from recscale.train import loop as loop_mod
from recscale.train.loop import EpochData, run_loop
from recscale.train.runtime import LocalRuntime

TABLES, B = (50, 70), 16


def _batches(n: int) -> list[Batch]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(n):
        ids = torch.cat([torch.randint(0, rows, (B,), generator=g) for rows in TABLES])
        sparse = SparseFeatures(("a", "b"), ids, torch.ones(len(TABLES), B, dtype=torch.int64))
        out.append(Batch(torch.randn(B, 13, generator=g), sparse,
                         torch.randint(0, 2, (B,), generator=g).float(),
                         torch.arange(i * B, (i + 1) * B)))
    return out


def _run(open_epoch, steps: int, epochs: int, monkeypatch) -> tuple[int, int]:
    calls = []
    monkeypatch.setattr(loop_mod.gc, "collect", lambda *a: calls.append(a) or 0)
    cfg = parse(TrainConfig, {"progress": "off", "epochs": epochs, "checkpoint": {"dir": None},
                              "dense_optimizer": {"name": "sgd", "learning_rate": 0.05}}, "train")
    model = build_dlrm(ModelConfig(embedding_dim=4, bottom_mlp=(8, 4), top_mlp=(8, 1)), TABLES,
                       13, EmbeddingOptimizerConfig("exact_sgd", 0.05))
    res = run_loop(LocalRuntime(model, cfg, torch.device("cpu")), EpochData(open_epoch, steps),
                   cfg)
    return res.steps, len(calls)


def test_batches_in_memory_end_an_epoch_without_a_collection(monkeypatch):
    batches = _batches(4)
    assert _run(lambda: iter(batches), 4, 2, monkeypatch) == (8, 0)


def test_a_loader_with_threads_is_ended_on_the_training_thread_once_per_epoch(monkeypatch):
    batches = _batches(4)

    def open_epoch():
        return tn.Loader(tn.Prefetcher(tn.IterableWrapper(batches), prefetch_factor=2))

    assert _run(open_epoch, 4, 2, monkeypatch) == (8, 2)
