"""``train.average``: an exponential moving average of the weights, the model a run hands back.

A row-wise Adagrad step moves a row seen thousands of times as far as a row seen once, so the
last step's tables carry the noise of the last few batches: on the generated click logs, a user
seen thousands of times has a mean error ten times the planted model's refit. Averaging the
weights over the last ~1 / (1 - decay) steps removes most of it (docs/results.md, "Settings
tried"). Training itself goes on from the weights; the average is what validation scores, what
early stopping keeps as the best step and what the run returns.

``WeightAverage`` holds one average per table piece this process holds (``shards()``: whole
tables in one process; sharded, each rank its own pieces and the replicated tables) and one per
dense parameter. The update is element-wise, so a sharded run's average equals one process's,
and a checkpoint carries it (``Checkpointer.save``/``restore``/``load`` with ``average=``), so
a resumed or resharded run goes on bitwise. Tables on a slow (DDR/SSD) tier are refused: the
average reads and writes every row every step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

import torch

from recscale.embedding.api import TableShard


class WeightAverage:
    """The averages of ``model``'s table pieces and dense parameters, started at their current
    values; ``update()`` after each step, ``applied()`` to score the average, ``finish()`` to
    leave the average in the model."""

    def __init__(self, model, decay: float):
        self.model, self.decay = model, float(decay)
        with torch.no_grad():
            self.tables = {sh.key: sh.weight.detach().clone() for sh in self._shards()}
            self.dense = {n: p.detach().clone() for n, p in model.dense.named_parameters()}

    def _shards(self) -> list[TableShard]:
        return self.model.embeddings.shards(replicated=True)

    def pairs(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(weights, their average) of every table piece and dense parameter."""
        for sh in self._shards():
            yield sh.weight, self.tables[sh.key]
        for n, p in self.model.dense.named_parameters():
            yield p, self.dense[n]

    @torch.no_grad()
    def update(self) -> None:
        """average = decay * average + (1 - decay) * weights, for every piece."""
        for w, a in self.pairs():
            a.mul_(self.decay).add_(w.detach().to(a.dtype), alpha=1.0 - self.decay)

    @torch.no_grad()
    def restart_tables(self) -> None:
        """The tables' averages to the tables as they are now (after ``reset_tables``); the
        dense layers' go on."""
        for sh in self._shards():
            self.tables[sh.key].copy_(sh.weight)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The average in the model for the block (a validation point), the weights back after
        it, bitwise."""
        kept = []
        with torch.no_grad():
            for w, a in self.pairs():
                kept.append(w.detach().clone())
                w.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for (w, _), k in zip(self.pairs(), kept, strict=True):
                    w.copy_(k)

    @torch.no_grad()
    def finish(self) -> None:
        """The average into the model for good: the run hands back the average."""
        for w, a in self.pairs():
            w.copy_(a)

    # ------------------------------------------------------------------------- checkpoints
    def shards(self, shards: list[TableShard]) -> list[TableShard]:
        """``shards`` (a subset of this process's pieces) with their averages attached, what a
        checkpoint saves and restores into."""
        return [replace(sh, average=self.tables[sh.key]) for sh in shards]

    def dense_tensors(self) -> dict[str, torch.Tensor]:
        """The dense averages as a checkpoint saves them (``dense_avg.<parameter>``)."""
        return {f"dense_avg.{n}": a.detach().cpu() for n, a in self.dense.items()}

    def snapshot(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """A copy in memory (the best step's, when checkpoints are off)."""
        return ([a.clone() for a in self.tables.values()], [a.clone() for a in self.dense.values()])

    @torch.no_grad()
    def restore(self, snap: tuple[list[torch.Tensor], list[torch.Tensor]]) -> None:
        for a, s in zip(self.tables.values(), snap[0], strict=True):
            a.copy_(s)
        for a, s in zip(self.dense.values(), snap[1], strict=True):
            a.copy_(s)


def check_fast_tier(embeddings, gather, decay: float | None) -> None:
    """Refuse ``train.average`` over tables on a slow tier, on every rank alike (``gather``: the
    runtime's all_gather, every rank's answer on every rank)."""
    if decay is None:
        return
    slow = sorted({t for tiers in gather(sorted(set(embeddings.memory_bytes()) - {"fast"}))
                   for t in tiers})
    if slow:
        raise ValueError(
            f"train.average.decay={decay} is not allowed with tables on the {', '.join(slow)} "
            "tier: the average reads and writes every row at every step. Set "
            "train.average.decay: null, or give the tables fast memory (train.tiers."
            "ram_budget_bytes, the topology's memory)")
