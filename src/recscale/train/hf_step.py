"""The DLRM step with a Hessian-free dense optimizer (``train.dense_optimizer.name: hessian_free``),
for one process and for one rank of the sharded runtime.

One step:

1. the embeddings look up the batch (sharded: the input and output exchanges as always) and the
   dense arch runs on a *detached* copy of the pooled embeddings;
2. the gradient of the ordinary loss (the one ``TrainStep`` / ``ShardedStep`` differentiate) with
   respect to that copy goes back into the embeddings: their fused optimizer updates the tables
   exactly as with a first-order dense optimizer (sharded: the transposed exchange as always);
3. ``HessianFree.step`` takes the dense step: gradient, Gauss-Newton (or Hessian) products through
   the whole dense arch (bottom MLP, interaction, top MLP) and loss evaluations, all with the
   pooled embeddings held fixed at the values of step 1. The first evaluation reuses the graph
   of step 1, so the gradient costs no second forward.

Sharded: the dense arch is used without its DDP wrapper. Each rank's objective is its share of
the global mean BCE (sum of its rows' losses / global batch); the optimizer's ``reduce`` sums the
gradient, every curvature product and every loss over ranks (one all-reduce each, counted in the
runtime's ``CommStats`` as ``dense_hf_allreduce``), so every rank takes the identical step and the
dense weights stay replicated. The dense arch may be float64 (tests): inputs follow its dtype.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from recscale.data.batch import Batch
from recscale.model.dlrm import DLRM
from recscale.train.step import EmbeddingSchedule


def counting_all_reduce(stats, spans_hosts: bool = False, group=None):
    """``reduce`` for HessianFree: one all-reduce (sum) on the default group, its bytes and
    seconds added to ``stats`` as ``dense_hf_allreduce`` (inter-host when ``spans_hosts``)."""
    import torch.distributed as dist

    def reduce(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        t0 = time.perf_counter()
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        n = t.numel() * t.element_size()
        stats.add("dense_hf_allreduce", n, time.perf_counter() - t0, n if spans_hosts else 0)
        return t

    return reduce


class HessianFreeStep:
    """One step (see the module docstring); ``run(batch, started)`` -> (this rank's loss sum,
    rows of the global batch), like the other steps. ``curvature_batch_size``: rows of the
    global batch the curvature products use (each rank its first ``c / world_size`` rows)."""

    def __init__(self, model: DLRM, opt, world_size: int = 1, sharded: bool = False,
                 curvature_batch_size: int | None = None):
        self.model, self.opt = model, opt
        self.world_size, self.sharded = world_size, sharded
        self.curvature_rows = (None if curvature_batch_size is None
                               else curvature_batch_size // world_size)
        self.sum_loss = nn.BCEWithLogitsLoss(reduction="sum")
        self.mean_loss = nn.BCEWithLogitsLoss()
        self.totals = {"steps": 0, "cg_iters": 0, "products": 0, "loss_evals": 0,
                       "negative_curvature_met": 0, "negative_curvature_taken": 0,
                       "rejected_steps": 0}
        self.last_damping = float(opt.damping)
        # train.embedding_optimizer's rate schedule, as the first-order steps apply it
        self.embedding_schedule = EmbeddingSchedule(model, opt)

    def _global_rows(self, local: int, cap: int | None = None) -> int:
        """Rows of the global batch (each rank's batch capped at ``cap``)."""
        sizes = self.model.embeddings.last_batch_sizes if self.sharded else [local]
        return sum(b if cap is None else min(b, cap) for b in sizes)

    def __call__(self, batch: Batch, started=None) -> tuple[float, int]:
        model, arch = self.model, self.model.dense  # the bare dense arch, never its DDP wrapper
        dtype = next(arch.parameters()).dtype
        x = batch.dense.to(dtype)
        held = {}
        looked = model.embeddings.lookup(started if started is not None else batch.sparse)

        def pooled():  # after the bottom MLP, so a sharded output exchange overlaps it
            out = looked() if callable(looked) else looked
            held["pooled"] = out
            held["fixed"] = out.detach().to(dtype).requires_grad_(True)
            return held["fixed"]

        logits = arch(x, pooled)
        y = batch.labels.to(logits.dtype)
        loss_sum = self.sum_loss(logits, y)
        rows = batch.batch_size
        g_rows = self._global_rows(rows)
        # the embeddings' gradient: of the loss the first-order steps differentiate, so their
        # fused update is the one those steps make
        if self.sharded:
            emb_loss = loss_sum * (self.world_size / g_rows)
        else:
            emb_loss = self.mean_loss(logits, y)
        (g_pooled,) = torch.autograd.grad(emb_loss, held["fixed"], retain_graph=True)
        self.embedding_schedule.before_backward()
        held["pooled"].backward(g_pooled.to(held["pooled"].dtype))

        fixed = held["fixed"].detach()
        first = [(loss_sum / g_rows, logits)]  # the graph above: the gradient needs no new forward

        def closure():
            if first:
                return first.pop()
            out = arch(x, fixed)
            return self.sum_loss(out, y) / g_rows, out

        curvature = None
        c = self.curvature_rows
        if c is not None:
            c_rows = self._global_rows(rows, c)

            def curvature():
                out = arch(x[:c], fixed[:c])
                return self.sum_loss(out, y[:c]) / c_rows, out

        self.opt.step(closure, curvature)
        self.embedding_schedule.after_step()
        self._count(self.opt.last_step)
        return float(loss_sum.detach()), g_rows

    run = __call__

    def _count(self, info) -> None:
        t = self.totals
        t["steps"] += 1
        t["cg_iters"] += info.cg_iters
        t["products"] += info.products
        t["loss_evals"] += info.loss_evals
        t["negative_curvature_met"] += int(info.negative_curvature)
        t["negative_curvature_taken"] += int(info.took_negative_curvature)
        t["rejected_steps"] += int(not info.accepted)
        self.last_damping = info.next_damping

    def summary(self) -> dict[str, float]:
        """Counters of the run's HF steps (``hf.*`` in the run's metrics)."""
        return {**{k: float(v) for k, v in self.totals.items()}, "damping": self.last_damping}
