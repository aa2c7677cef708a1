"""One rank's Hessian-free loop on arrays (``hf_loop``: every rank runs it on its shard of each
global batch; rank 0 evaluates and records), and what the HF and baseline fits share: the
network, its evaluation, the data order, the clock that evaluation pauses and the records."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recscale.hf.config import ACTIVATIONS, FitConfig, NetConfig
from recscale.optim import HessianFree, HessianFreeConfig, empirical_fisher_diagonal, shard

log = logging.getLogger(__name__)


def build_mlp(in_dim: int, num_classes: int, cfg: NetConfig, seed: int = 0,
              dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """Linear-activation stack ending in a linear layer to the class logits; seeded init."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        layers: list[nn.Module] = []
        d = in_dim
        for h in cfg.hidden:
            layers += [nn.Linear(d, h), ACTIVATIONS[cfg.activation]()]
            d = h
        layers.append(nn.Linear(d, num_classes))
        return nn.Sequential(*layers).to(dtype)
    finally:
        torch.random.set_rng_state(gen_state)


@torch.no_grad()
def evaluate_classifier(model: nn.Module, x: np.ndarray | Tensor, y: np.ndarray | Tensor,
                        batch_size: int = 8192) -> dict[str, float]:
    """Mean cross-entropy and error rate (fraction misclassified)."""
    x = torch.as_tensor(x)
    y = torch.as_tensor(y)
    dtype = next(model.parameters()).dtype
    total, wrong = 0.0, 0
    for lo in range(0, len(x), batch_size):
        z = model(x[lo: lo + batch_size].to(dtype))
        t = y[lo: lo + batch_size]
        total += float(F.cross_entropy(z, t, reduction="sum"))
        wrong += int((z.argmax(1) != t).sum())
    n = max(len(x), 1)
    return {"loss": total / n, "error": wrong / n}


# ------------------------------------------------------------------------------ results
@dataclass
class FitResult:
    name: str  # hf | sgd | adam
    batch_size: int
    state_dict: dict[str, Tensor]
    history: list[dict[str, float]]  # evaluation points: step, passes, wall_s, losses, error
    steps: list[dict[str, float]] = field(default_factory=list)  # HF: one row per step
    summary: dict[str, float] = field(default_factory=dict)
    world_size: int = 1

    def reach(self, target_error: float) -> dict[str, float] | None:
        """First evaluation point with validation error <= target (passes, wall_s), or None."""
        for h in self.history:
            if h["val_error"] <= target_error + 1e-12:
                return {"passes": h["passes"], "wall_s": h["wall_s"], "step": h["step"]}
        return None


class Clock:
    """Wall time of training only: evaluation pauses it."""

    def __init__(self) -> None:
        self.elapsed, self._t = 0.0, None

    def start(self) -> None:
        self._t = time.perf_counter()

    def stop(self) -> None:
        if self._t is not None:
            self.elapsed += time.perf_counter() - self._t
            self._t = None


def train_tensors(data: dict, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    return torch.as_tensor(data["x_train"]).to(dtype), torch.as_tensor(data["y_train"]).long()


def data_dims(data: dict) -> tuple[int, int]:
    ys = [np.asarray(data[k]) for k in ("y_train", "y_validation", "y_test") if k in data]
    return int(np.asarray(data["x_train"]).shape[1]), int(max(int(y.max()) for y in ys if len(y)) + 1)


def batches(n: int, batch: int, steps: int, seed: int):
    """Global batches of indices: a fresh permutation per epoch, remainder dropped."""
    gen = torch.Generator().manual_seed(seed)
    per_epoch = max(n // batch, 1)
    batch = min(batch, n)
    done = 0
    while done < steps:
        perm = torch.randperm(n, generator=gen)
        for k in range(per_epoch):
            if done >= steps:
                return
            yield perm[k * batch: (k + 1) * batch]
            done += 1


def n_steps(n: int, batch: int, epochs: float, max_steps: int | None) -> int:
    steps = max(1, math.ceil(epochs * n / min(batch, n)))
    return min(steps, max_steps) if max_steps else steps


class Recorder:
    """Evaluation points every ``eval_every`` passes (rank 0 only), with the clock paused."""

    def __init__(self, model, data, n_train, eval_every, clock, enabled=True):
        self.model, self.data, self.n, self.every, self.clock = model, data, n_train, eval_every, clock
        self.enabled = enabled
        self.history: list[dict[str, float]] = []
        self.next_at = 0.0
        self._losses: list[float] = []

    def batch_loss(self, v: float) -> None:
        self._losses.append(v)

    def maybe(self, step: int, seen: int, force: bool = False) -> None:
        passes = seen / self.n
        if not self.enabled or (passes + 1e-9 < self.next_at and not force):
            return
        self.clock.stop()
        self.model.eval()
        val = evaluate_classifier(self.model, self.data["x_validation"], self.data["y_validation"])
        self.model.train()
        train_loss = float(np.mean(self._losses)) if self._losses else float("nan")
        self._losses = []
        self.history.append({"step": step, "passes": passes, "wall_s": self.clock.elapsed,
                             "train_loss": train_loss, "val_loss": val["loss"],
                             "val_error": val["error"]})
        while self.next_at <= passes + 1e-9:
            self.next_at += self.every
        self.clock.start()


def progress_bar(cfg: FitConfig, total: int, desc: str):
    from recscale.progress import Progress

    return Progress(total, desc, unit="step", mode=cfg.progress)


def hf_loop(data: dict, net: NetConfig, hf: HessianFreeConfig, cfg: FitConfig, *, rank: int,
            world_size: int, reduce: Callable[[Tensor], Tensor] | None,
            on_step: Callable[[int, nn.Module, Any], None] | None = None) -> FitResult:
    """One rank's HF loop (every rank runs it; rank 0 evaluates and records)."""
    dtype = getattr(torch, cfg.dtype)
    x, y = train_tensors(data, dtype)
    n = len(x)
    in_dim, classes = data_dims(data)
    model = build_mlp(in_dim, classes, net, cfg.seed, dtype)
    opt = HessianFree(model.parameters(), hf, reduce=reduce)
    batch = min(cfg.global_batch_size, n)
    c_batch = min(cfg.curvature_batch_size or batch, batch)
    steps = n_steps(n, batch, cfg.epochs, cfg.max_steps)
    clock = Clock()
    rec = Recorder(model, data, n, cfg.eval_every, clock, enabled=rank == 0)
    rows: list[dict[str, float]] = []
    seen = 0
    rec.maybe(0, 0, force=True)
    clock.start()
    bar = progress_bar(cfg, steps, "hessian-free") if rank == 0 else None
    for step, idx in enumerate(batches(n, batch, steps, cfg.seed), start=1):
        t0 = time.perf_counter()
        mine = shard(idx, rank, world_size)
        c_mine = shard(idx[:c_batch], rank, world_size)
        xb, yb, xc, yc = x[mine], y[mine], x[c_mine], y[c_mine]

        def closure(xb=xb, yb=yb):
            z = model(xb)
            return F.cross_entropy(z, yb, reduction="sum") / batch, z

        def curvature_closure(xc=xc, yc=yc):
            z = model(xc)
            return F.cross_entropy(z, yc, reduction="sum") / c_batch, z

        fisher = None
        if hf.preconditioner == "fisher":
            def fisher(xc=xc, yc=yc):
                return empirical_fisher_diagonal(model, F.cross_entropy, xc, yc, scale=1.0 / c_batch)

        loss = opt.step(closure, curvature_closure if c_batch < batch else None, fisher)
        info = opt.last_step
        seen += batch
        step_s = time.perf_counter() - t0
        rows.append({"step": step, "passes": seen / n, "loss": loss, "new_loss": info.new_loss,
                     "cg_iters": info.cg_iters, "products": info.products,
                     "damping": info.damping, "rho": info.rho if math.isfinite(info.rho) else -1.0,
                     "alpha": info.alpha, "step_norm": info.step_norm,
                     "loss_evals": info.loss_evals, "accepted": float(info.accepted),
                     "negative_curvature": float(info.negative_curvature),
                     "took_negative_curvature": float(info.took_negative_curvature),
                     "negative_curvature_events": opt.negative_curvature_events,
                     "step_s": step_s, "grad_norm": info.grad_norm})
        rec.batch_loss(loss)
        if on_step is not None:
            on_step(step, model, info)
        rec.maybe(step, seen, force=step == steps)
        if bar is not None:
            last = rec.history[-1]
            bar.update(step, loss=f"{loss:.4f}", val_err=f"{last['val_error']:.4f}",
                       cg=info.cg_iters, lam=f"{info.damping:.3g}")
        if not math.isfinite(loss):
            log.warning("hessian-free: non-finite loss at step %d; stopping", step)
            break
    clock.stop()
    if bar is not None:
        bar.close()
    group = opt.param_groups[0]
    summary = summarize_fit(rec.history, clock.elapsed, len(rows))
    summary.update({
        "cg_iters_total": float(sum(r["cg_iters"] for r in rows)),
        "cg_iters_mean": float(np.mean([r["cg_iters"] for r in rows])) if rows else 0.0,
        "products_total": float(sum(r["products"] for r in rows)),
        "total_negative_curvature_events": float(group["negative_curvature_events"]),
        "total_negative_curvature_steps": float(group["negative_curvature_steps"]),
        "total_rejected_steps": float(group["rejected_steps"]),
        "final_damping": float(opt.damping),
        "step_s_mean": float(np.mean([r["step_s"] for r in rows])) if rows else 0.0,
        "world_size": float(world_size),
        "curvature_batch_size": float(c_batch),
    })
    return FitResult("hf", batch, {k: v.detach().clone() for k, v in model.state_dict().items()},
                     rec.history, rows, summary, world_size)


def summarize_fit(history: list[dict[str, float]], wall: float, steps: int) -> dict[str, float]:
    if not history:
        return {"total_steps": float(steps), "total_wall_s": wall}
    best = min(history, key=lambda h: h["val_error"])
    last = history[-1]
    return {"total_steps": float(steps), "total_passes": last["passes"], "total_wall_s": wall,
            "final_val_error": last["val_error"], "final_val_loss": last["val_loss"],
            "best_val_error": best["val_error"], "best_val_passes": best["passes"]}
