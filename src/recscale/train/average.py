"""``train.average``: an exponential moving average of the weights, the model a run hands back.

A row-wise Adagrad step moves a row seen thousands of times as far as a row seen once, so the
last step's tables carry the noise of the last few batches: on the generated click logs, a user
seen thousands of times has a mean error ten times the planted model's refit. Averaging the
weights over the last ~1 / (1 - decay) steps removes most of it (docs/results.md, "The weights'
average"). Training itself goes on from the weights; the average is what validation scores,
what early stopping keeps as the best step and what the run returns.

The average is normalised from where each weight starts to learn: after n updates it is the
weights of those n steps weighted by ``decay ** age`` (``average += (weights - average) * (1 -
decay) / (1 - decay ** n)``: the first takes the weights as they are). The dense layers count
from the first step. A table row counts from the first step that changed it: in a time-ordered
log, an id that arrives late in training has only its last steps, and an average counted from
the table's start would hand back mostly its random initial row (on the arriving-ids data, 0.005
AUC). So n is kept per row (0: not changed yet, its average is its weights), and the rate read
from a table of ``(1 - decay) / (1 - decay ** n)`` by n (float32; past ``decay ** n < 1e-9`` it
is ``1 - decay``): per-row float64 arithmetic every step cost twice the rest of the update. At a
``train.reinit_embeddings`` epoch every row starts again; the dense layers' count goes on.

``WeightAverage`` holds one average per table piece this process holds (``shards()``: whole
tables in one process; sharded, each rank its own pieces and the replicated tables) and one per
dense parameter. The update is element-wise, so a sharded run's average equals one process's;
a checkpoint carries the averages and the rows' counts (``TableShard.average`` and
``average_counts``; the dense averages as ``dense_avg.*``, their count in the progress), so a
resumed or resharded run goes on bitwise. Tables on a slow (DDR/SSD) tier are refused: the
average reads and writes every row every step.

``decay: auto`` (``auto_decay``) averages over an eighth of the steps the tables train in one
stretch (an epoch, or ``max_steps`` if fewer), at most 100 steps: the average lags the weights by
about its horizon, so it must be short against the run. Measured (docs/results.md): with
782-step epochs a horizon of ~100 steps (0.99) was best or level and 200 (0.995) lost 0.0006
validation AUC; 157-step epochs wanted ~20 (0.95), where 0.99 lost 0.002; conf/test's one
32-step epoch lost 0.029 test AUC at 0.99 and 0.001 at 0.75 (a horizon of 4).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from recscale.embedding.api import TableShard

# decay: auto, an average over AUTO_SHARE of an epoch's steps, between AUTO_HORIZONS steps
AUTO_SHARE = 1 / 8
AUTO_HORIZONS = (2.0, 100.0)


def auto_decay(steps_per_epoch: int | None, max_steps: int | None = None) -> float:
    """The decay ``train.average.decay: auto`` stands for: ``1 - 1 / horizon``, the horizon
    ``AUTO_SHARE`` of the steps the tables train in one stretch (an epoch, or ``max_steps`` if
    fewer; neither known: the longest horizon), clamped to ``AUTO_HORIZONS``."""
    stretch = [s for s in (steps_per_epoch, max_steps) if s]
    lo, hi = AUTO_HORIZONS
    horizon = min(hi, max(lo, min(stretch) * AUTO_SHARE)) if stretch else hi
    return 1.0 - 1.0 / horizon


def resolve_decay(decay: float | str | None, steps_per_epoch: int | None,
                  max_steps: int | None = None) -> float | None:
    """``train.average.decay`` as a number (``auto``: ``auto_decay``), or None (off)."""
    return auto_decay(steps_per_epoch, max_steps) if decay == "auto" else decay


class WeightAverage:
    """The averages of ``model``'s table pieces and dense parameters, started at their current
    values; ``update()`` after each step, ``applied()`` to score the average, ``finish()`` to
    leave the average in the model. ``counts[key]``: each row's n (int32); ``dense_steps``: the
    dense averages' n (a checkpoint's progress carries it: ``state()``)."""

    def __init__(self, model, decay: float):
        self.model, self.decay = model, float(decay)
        self.dense_steps = 0
        d = self.decay
        last = max(1, math.ceil(math.log(1e-9) / math.log(d)))  # decay ** n below 1e-9 past it
        self.rates = torch.tensor([0.0] + [(1 - d) / (1 - d ** n) for n in range(1, last + 1)],
                                  dtype=torch.float64).float()
        # the pieces in runs that lie back to back in one buffer (a fused module's tables of one
        # dim), each run updated as one [rows, dim] tensor: 26 tables one by one cost 3.8 ms a
        # step, most of it the per-call overhead; the averages and counts of a run are one
        # tensor too, each piece's a slice of it (``tables``, ``counts``)
        self.groups: list[_Run] = []
        self.tables, self.counts = {}, {}
        with torch.no_grad():
            for run in _runs(self._shards()):
                run.average = run.weight.detach().clone()
                run.counts = torch.zeros(run.weight.shape[0], dtype=torch.int32,
                                         device=run.weight.device)
                r0 = 0
                for key, rows in run.pieces:
                    self.tables[key] = run.average[r0: r0 + rows]
                    self.counts[key] = run.counts[r0: r0 + rows]
                    r0 += rows
                self.groups.append(run)
            self.dense = {n: p.detach().clone() for n, p in model.dense.named_parameters()}
            self.rates = self.rates.to(next(iter(self.tables.values()), self.rates).device)

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
        """One step into every average (see the module docstring)."""
        d, last = self.decay, len(self.rates) - 1
        for run in self.groups:
            w, a, n = run.weight.detach().to(run.average.dtype), run.average, run.counts
            n.add_(_counting(run.state, w, a, n))
            rate = self.rates.index_select(0, n.clamp(max=last)).to(a.dtype)
            a.lerp_(w, rate.unsqueeze(1))
        self.dense_steps += 1
        rate = (1.0 - d) / (1.0 - d ** self.dense_steps)
        for n, w in self.model.dense.named_parameters():
            self.dense[n].lerp_(w.detach(), rate)

    @torch.no_grad()
    def restart_tables(self) -> None:
        """Every row starts again (after ``reset_tables``): its average is its weights until a
        step changes it; the dense layers' averages go on."""
        for sh in self._shards():
            self.tables[sh.key].copy_(sh.weight)
            self.counts[sh.key].zero_()

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
        """``shards`` (a subset of this process's pieces) with their averages and rows' counts
        attached, what a checkpoint saves and restores into."""
        return [replace(sh, average=self.tables[sh.key], average_counts=self.counts[sh.key])
                for sh in shards]

    def dense_tensors(self) -> dict[str, torch.Tensor]:
        """The dense averages as a checkpoint saves them (``dense_avg.<parameter>``)."""
        return {f"dense_avg.{n}": a.detach().cpu() for n, a in self.dense.items()}

    def state(self) -> dict[str, int]:
        """What a checkpoint's progress keeps (JSON-able)."""
        return {"dense_steps": self.dense_steps}

    def load_state(self, state: dict | None) -> None:
        """What a checkpoint's progress kept; none (a checkpoint without averages): start again."""
        self.dense_steps = int((state or {}).get("dense_steps", 0))

    def snapshot(self) -> tuple:
        """A copy in memory (the best step's, when checkpoints are off)."""
        return ([a.clone() for a in self.tables.values()],
                [n.clone() for n in self.counts.values()],
                [a.clone() for a in self.dense.values()], self.dense_steps)

    @torch.no_grad()
    def restore(self, snap: tuple) -> None:
        tables, counts, dense, self.dense_steps = snap
        for mine, saved in ((self.tables.values(), tables), (self.counts.values(), counts),
                            (self.dense.values(), dense)):
            for a, s in zip(mine, saved, strict=True):
                a.copy_(s)


@dataclass
class _Run:
    """Consecutive table pieces whose weights (and first optimizer state) lie back to back in
    one buffer: ``weight`` [rows, cols] and ``state`` ([rows], [rows, cols] or None) view them
    all; ``pieces``: (key, rows) of each, in order."""

    weight: torch.Tensor
    state: torch.Tensor | None
    pieces: list[tuple[str, int]]
    average: torch.Tensor | None = None
    counts: torch.Tensor | None = None


def _follows(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Does ``b`` start in ``a``'s buffer right where ``a`` ends, as ``a``'s rows would go on?"""
    if a is None or b is None:
        return a is None and b is None
    return (a.is_contiguous() and b.is_contiguous() and a.dtype == b.dtype
            and a.device == b.device and a.shape[1:] == b.shape[1:]
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and b.storage_offset() == a.storage_offset() + a.numel())


def _joined(a: torch.Tensor, rows: int) -> torch.Tensor:
    """A view of ``rows`` rows from ``a``'s start in its buffer (``a`` contiguous)."""
    return a.new_empty(0).set_(a.untyped_storage(), a.storage_offset(), (rows, *a.shape[1:]),
                               a.stride())


def _runs(shards: list[TableShard]) -> list[_Run]:
    """``shards`` in runs (``_Run``); a piece that does not follow the last starts a new one."""
    runs: list[_Run] = []
    last: tuple[torch.Tensor, torch.Tensor | None] | None = None
    for sh in shards:
        w, st = sh.weight.detach(), (sh.states[0].detach() if sh.states else None)
        if last is not None and _follows(last[0], w) and _follows(last[1], st):
            run = runs[-1]
            rows = run.weight.shape[0] + w.shape[0]
            run.weight = _joined(run.weight, rows)
            run.state = _joined(run.state, rows) if st is not None else None
        else:
            runs.append(_Run(w, st, []))
        runs[-1].pieces.append((sh.key, w.shape[0]))
        last = (w, st)
    return runs


def _counting(state: torch.Tensor | None, w: torch.Tensor, a: torch.Tensor,
              n: torch.Tensor) -> torch.Tensor:
    """Rows whose average counts this step: those a step has changed, now or before. Read from
    the fused optimizer's state (an Adagrad sum is positive from a row's first gradient on, and
    zeroed with the tables at a reset), which costs a tenth of comparing the weights with their
    averages (what an optimizer without state, ``exact_sgd``, gets: a row not counting yet has
    its weights as its average)."""
    if state is not None:
        return (state != 0 if state.dim() == 1 else (state != 0).any(dim=1)) | (n > 0)
    return (w != a).any(dim=1) | (n > 0)


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
