"""``train.average``: an exponential moving average of the weights, the model a run hands back.

A row-wise Adagrad step moves a row seen thousands of times as far as a row seen once, so the
last step's tables carry the noise of the last few batches: on the generated click logs, a user
seen thousands of times has a mean error ten times the planted model's refit. Averaging the
weights over the last ~1 / (1 - decay) steps removes most of it (docs/results.md, "Settings
tried"). Training itself goes on from the weights; the average is what validation scores, what
early stopping keeps as the best step and what the run returns.

The average is bias-corrected: after t updates it is the weights of those t steps weighted by
``decay ** age`` and normalised (``average += (weights - average) * (1 - decay) / (1 - decay **
t)``), so the first update takes the weights as they are, a short run (a test config's few
steps) is not pulled back towards the initial weights, and a long one is the plain exponential
average (the correction fades as ``decay ** t``). The tables' count restarts at a
``train.reinit_embeddings`` epoch; the dense layers' goes on.

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
    leave the average in the model. ``steps``: the updates each average has had, tables' and
    dense layers' (a checkpoint's progress carries them: ``state()``)."""

    def __init__(self, model, decay: float):
        self.model, self.decay = model, float(decay)
        self.steps = {"tables": 0, "dense": 0}
        with torch.no_grad():
            self.tables = {sh.key: sh.weight.detach().clone() for sh in self._shards()}
            self.dense = {n: p.detach().clone() for n, p in model.dense.named_parameters()}

    def _shards(self) -> list[TableShard]:
        return self.model.embeddings.shards(replicated=True)

    def pairs(self, group: str | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(weights, their average) of every table piece and dense parameter (``group``:
        "tables" or "dense" only)."""
        if group in (None, "tables"):
            for sh in self._shards():
                yield sh.weight, self.tables[sh.key]
        if group in (None, "dense"):
            for n, p in self.model.dense.named_parameters():
                yield p, self.dense[n]

    @torch.no_grad()
    def update(self) -> None:
        """One step into every average: ``average += (weights - average) * rate``, ``rate =
        (1 - decay) / (1 - decay ** t)`` at its t-th update (1 at the first)."""
        for group in ("tables", "dense"):
            self.steps[group] += 1
            rate = (1.0 - self.decay) / (1.0 - self.decay ** self.steps[group])
            for w, a in self.pairs(group):
                a.lerp_(w.detach().to(a.dtype), rate)

    @torch.no_grad()
    def restart_tables(self) -> None:
        """The tables' averages start again (after ``reset_tables``): the next update takes the
        tables as they are; the dense layers' go on."""
        self.steps["tables"] = 0
        for sh in self._shards():
            self.tables[sh.key].copy_(sh.weight)

    def state(self) -> dict[str, int]:
        """What a checkpoint's progress keeps (JSON-able): the update counts."""
        return dict(self.steps)

    def load_state(self, state: dict | None) -> None:
        """The counts a checkpoint kept; none (a checkpoint without averages): start again."""
        self.steps = {k: int((state or {}).get(k, 0)) for k in ("tables", "dense")}

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
