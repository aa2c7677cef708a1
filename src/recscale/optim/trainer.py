"""Train a fully connected classifier with Hessian-free or a first-order baseline, on arrays.

``fit_hessian_free`` and ``fit_baseline`` take the split dict of ``recscale.data.idx.prepare_mnist``
/ ``recscale.data.frames.prepare_speech_frames`` and return a :class:`FitResult` whose history
records training loss, validation loss and error against passes over the training data and wall
time (evaluation time excluded), and, for HF, CG iterations, damping, reduction ratio and
negative-curvature events per step. ``FitConfig.launch.world_size > 1`` runs HF data-parallel on
that many workers started by ``recscale.distributed.launch`` (torch.distributed.elastic, gloo on
CPU), the launcher DLRM training uses, with the same ``LaunchConfig``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recscale.config import Validated, check, check_choice
from recscale.distributed import LaunchConfig, launch, threads_for_run
from recscale.optim.config import HessianFreeConfig
from recscale.optim.curvature import empirical_fisher_diagonal
from recscale.optim.distributed import shard
from recscale.optim.hessian_free import HessianFree

log = logging.getLogger(__name__)

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "softplus": nn.Softplus, "sigmoid": nn.Sigmoid}
BASELINES = ("sgd", "adam", "soap")  # soap: pytorch-optimizer (the extra `second_order`)


# ----------------------------------------------------------------------------- configs
@dataclass(frozen=True)
class NetConfig(Validated):
    """Fully connected classifier: len(hidden) + 1 linear layers (default 4)."""

    hidden: tuple[int, ...] = (256, 128, 64)
    activation: Literal["relu", "tanh", "softplus", "sigmoid"] = "relu"

    def validate(self, prefix: str = "model") -> None:
        check(all(h > 0 for h in self.hidden), f"{prefix}.hidden", list(self.hidden),
              "a list of positive layer widths")
        check_choice(f"{prefix}.activation", self.activation, tuple(ACTIVATIONS))


@dataclass(frozen=True)
class FitConfig(Validated):
    """The ``train`` block: schedule shared by HF and the baselines."""

    RENAMED: ClassVar[dict[str, str]] = {
        "batch_size": "global_batch_size",
        "world_size": "launch.world_size",
        "collective_timeout_s": "launch.collective_timeout_s",
    }

    global_batch_size: int = 1000  # the gradient batch, over all workers
    curvature_batch_size: int | None = None  # HF: curvature mini-batch (null = global_batch_size)
    epochs: float = 10.0  # passes over the training split (gradient batches)
    max_steps: int | None = None
    eval_every: float = 1.0  # passes between validation evaluations
    seed: int = 0
    # HF data-parallel workers (world_size), rendezvous and deadlines: shared with DLRM training
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    num_threads: int | None = None  # per worker; null = cores / workers on this host
    progress: Literal["auto", "bar", "log", "off"] = "auto"
    dtype: Literal["float32", "float64"] = "float32"

    def validate(self, prefix: str = "train") -> None:
        check(self.global_batch_size > 0, f"{prefix}.global_batch_size", self.global_batch_size,
              "a positive integer")
        check(self.curvature_batch_size is None
              or 0 < self.curvature_batch_size <= self.global_batch_size,
              f"{prefix}.curvature_batch_size", self.curvature_batch_size,
              f"null or in [1, global_batch_size={self.global_batch_size}]")
        check(self.epochs > 0, f"{prefix}.epochs", self.epochs, "> 0")
        check(self.max_steps is None or self.max_steps > 0, f"{prefix}.max_steps",
              self.max_steps, "null or a positive integer")
        check(self.eval_every > 0, f"{prefix}.eval_every", self.eval_every, "> 0")
        check(self.num_threads is None or self.num_threads >= 1, f"{prefix}.num_threads",
              self.num_threads, "null or >= 1")
        check_choice(f"{prefix}.progress", self.progress, ("auto", "bar", "log", "off"))
        check_choice(f"{prefix}.dtype", self.dtype, ("float32", "float64"))


@dataclass(frozen=True)
class SGDConfig(Validated):
    learning_rate: float = 0.05
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0

    def validate(self, prefix: str = "baselines.sgd") -> None:
        check(self.learning_rate > 0, f"{prefix}.learning_rate", self.learning_rate, "> 0")
        check(0 <= self.momentum < 1, f"{prefix}.momentum", self.momentum, "in [0, 1)")
        check(self.weight_decay >= 0, f"{prefix}.weight_decay", self.weight_decay, ">= 0")


@dataclass(frozen=True)
class AdamConfig(Validated):
    learning_rate: float = 1e-3
    weight_decay: float = 0.0

    def validate(self, prefix: str = "baselines.adam") -> None:
        check(self.learning_rate > 0, f"{prefix}.learning_rate", self.learning_rate, "> 0")
        check(self.weight_decay >= 0, f"{prefix}.weight_decay", self.weight_decay, ">= 0")


@dataclass(frozen=True)
class SOAPConfig(Validated):
    """SOAP (Shampoo's preconditioner, Adam in its eigenbasis) from pytorch-optimizer."""

    learning_rate: float = 3e-3
    weight_decay: float = 0.0

    def validate(self, prefix: str = "baselines.soap") -> None:
        check(self.learning_rate > 0, f"{prefix}.learning_rate", self.learning_rate, "> 0")
        check(self.weight_decay >= 0, f"{prefix}.weight_decay", self.weight_decay, ">= 0")


@dataclass(frozen=True)
class BaselinesConfig(Validated):
    """The ``baselines`` block: first-order optimizers trained on the same data and network."""

    RENAMED: ClassVar[dict[str, str]] = {"batch_size": "global_batch_size"}

    optimizers: tuple[str, ...] = ("sgd", "adam")
    global_batch_size: int | None = None  # null = train.global_batch_size
    epochs: float | None = None  # null = train.epochs
    sgd: SGDConfig = field(default_factory=SGDConfig)
    adam: AdamConfig = field(default_factory=AdamConfig)
    soap: SOAPConfig = field(default_factory=SOAPConfig)

    def validate(self, prefix: str = "baselines") -> None:
        for i, name in enumerate(self.optimizers):
            check_choice(f"{prefix}.optimizers[{i}]", name, BASELINES)
        check(self.global_batch_size is None or self.global_batch_size > 0,
              f"{prefix}.global_batch_size", self.global_batch_size, "null or a positive integer")
        check(self.epochs is None or self.epochs > 0, f"{prefix}.epochs", self.epochs, "null or > 0")


# ------------------------------------------------------------------------------ network
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


class _Clock:
    """Wall time of training only: evaluation pauses it."""

    def __init__(self) -> None:
        self.elapsed, self._t = 0.0, None

    def start(self) -> None:
        self._t = time.perf_counter()

    def stop(self) -> None:
        if self._t is not None:
            self.elapsed += time.perf_counter() - self._t
            self._t = None


def _tensors(data: dict, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    return torch.as_tensor(data["x_train"]).to(dtype), torch.as_tensor(data["y_train"]).long()


def _dims(data: dict) -> tuple[int, int]:
    ys = [np.asarray(data[k]) for k in ("y_train", "y_validation", "y_test") if k in data]
    return int(np.asarray(data["x_train"]).shape[1]), int(max(int(y.max()) for y in ys if len(y)) + 1)


def _batches(n: int, batch: int, steps: int, seed: int):
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


def _n_steps(n: int, batch: int, epochs: float, max_steps: int | None) -> int:
    steps = max(1, math.ceil(epochs * n / min(batch, n)))
    return min(steps, max_steps) if max_steps else steps


class _Recorder:
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


def _progress(cfg: FitConfig, total: int, desc: str):
    from recscale.progress import Progress

    return Progress(total, desc, unit="step", mode=cfg.progress)


# ------------------------------------------------------------------------- HF training
def fit_hessian_free(data: dict, net: NetConfig, hf: HessianFreeConfig, cfg: FitConfig,
                     on_step: Callable[[int, nn.Module, Any], None] | None = None) -> FitResult:
    """Train with HessianFree; ``cfg.launch.world_size > 1`` launches that many data-parallel
    workers. ``on_step(step, model, step_info)`` is called after every step (single process only)."""
    if cfg.launch.world_size > 1:
        if on_step is not None:
            raise ValueError("on_step is only supported with train.launch.world_size=1")
        return _launch_hf(data, net, hf, cfg)
    with threads_for_run(cfg.num_threads):
        return hf_loop(data, net, hf, cfg, rank=0, world_size=1, reduce=None, on_step=on_step)


def hf_loop(data: dict, net: NetConfig, hf: HessianFreeConfig, cfg: FitConfig, *, rank: int,
            world_size: int, reduce: Callable[[Tensor], Tensor] | None,
            on_step: Callable[[int, nn.Module, Any], None] | None = None) -> FitResult:
    """One rank's HF loop (every rank runs it; rank 0 evaluates and records)."""
    dtype = getattr(torch, cfg.dtype)
    x, y = _tensors(data, dtype)
    n = len(x)
    in_dim, classes = _dims(data)
    model = build_mlp(in_dim, classes, net, cfg.seed, dtype)
    opt = HessianFree(model.parameters(), hf, reduce=reduce)
    batch = min(cfg.global_batch_size, n)
    c_batch = min(cfg.curvature_batch_size or batch, batch)
    steps = _n_steps(n, batch, cfg.epochs, cfg.max_steps)
    clock = _Clock()
    rec = _Recorder(model, data, n, cfg.eval_every, clock, enabled=rank == 0)
    rows: list[dict[str, float]] = []
    seen = 0
    rec.maybe(0, 0, force=True)
    clock.start()
    bar = _progress(cfg, steps, "hessian-free") if rank == 0 else None
    for step, idx in enumerate(_batches(n, batch, steps, cfg.seed), start=1):
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
    summary = _summary(rec.history, clock.elapsed, len(rows))
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


def _summary(history: list[dict[str, float]], wall: float, steps: int) -> dict[str, float]:
    if not history:
        return {"total_steps": float(steps), "total_wall_s": wall}
    best = min(history, key=lambda h: h["val_error"])
    last = history[-1]
    return {"total_steps": float(steps), "total_passes": last["passes"], "total_wall_s": wall,
            "final_val_error": last["val_error"], "final_val_loss": last["val_loss"],
            "best_val_error": best["val_error"], "best_val_passes": best["passes"]}


def _launch_hf(data: dict, net: NetConfig, hf: HessianFreeConfig, cfg: FitConfig) -> FitResult:
    from recscale.optim.workers import hf_fit_worker

    plain = {k: np.asarray(v) for k, v in data.items() if k.startswith(("x_", "y_"))}
    return launch(hf_fit_worker, (plain, net, hf, cfg), cfg.launch)[0]


# --------------------------------------------------------------------- first-order baselines
def fit_baseline(data: dict, net: NetConfig, name: str, baselines: BaselinesConfig,
                 cfg: FitConfig) -> FitResult:
    """SGD with momentum, Adam or SOAP on the same network, data order and evaluation schedule."""
    check_choice("baselines.optimizers", name, BASELINES)
    with threads_for_run(cfg.num_threads):
        return _fit_baseline(data, net, name, baselines, cfg)


def _fit_baseline(data: dict, net: NetConfig, name: str, baselines: BaselinesConfig,
                  cfg: FitConfig) -> FitResult:
    dtype = getattr(torch, cfg.dtype)
    x, y = _tensors(data, dtype)
    n = len(x)
    in_dim, classes = _dims(data)
    model = build_mlp(in_dim, classes, net, cfg.seed, dtype)
    if name == "sgd":
        s = baselines.sgd
        opt = torch.optim.SGD(model.parameters(), lr=s.learning_rate, momentum=s.momentum,
                              nesterov=s.nesterov and s.momentum > 0, weight_decay=s.weight_decay)
    elif name == "soap":
        try:
            from pytorch_optimizer import SOAP
        except ImportError:
            raise ValueError("baselines.optimizers: soap needs pytorch-optimizer: pip install "
                             "'recscale[second_order]'") from None
        opt = SOAP(model.parameters(), lr=baselines.soap.learning_rate,
                   weight_decay=baselines.soap.weight_decay)
    else:
        a = baselines.adam
        opt = torch.optim.Adam(model.parameters(), lr=a.learning_rate, weight_decay=a.weight_decay)
    batch = min(baselines.global_batch_size or cfg.global_batch_size, n)
    epochs = baselines.epochs or cfg.epochs
    steps = _n_steps(n, batch, epochs, None)
    clock = _Clock()
    rec = _Recorder(model, data, n, cfg.eval_every, clock)
    rec.maybe(0, 0, force=True)
    clock.start()
    seen = 0
    rows = []
    with _progress(cfg, steps, name) as bar:
        for step, idx in enumerate(_batches(n, batch, steps, cfg.seed), start=1):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            seen += len(idx)
            lv = float(loss.detach())
            rec.batch_loss(lv)
            rec.maybe(step, seen, force=step == steps)
            bar.update(step, loss=f"{lv:.4f}", val_err=f"{rec.history[-1]['val_error']:.4f}")
            if not math.isfinite(lv):
                log.warning("%s: non-finite loss at step %d; stopping", name, step)
                break
    clock.stop()
    summary = _summary(rec.history, clock.elapsed, step)
    summary["step_s_mean"] = clock.elapsed / max(step, 1)
    return FitResult(name, batch, {k: v.detach().clone() for k, v in model.state_dict().items()},
                     rec.history, rows, summary)


def load_model(result: FitResult | dict, data: dict, net: NetConfig) -> nn.Module:
    """Rebuild the trained network from a FitResult (or its state dict)."""
    state = result.state_dict if isinstance(result, FitResult) else result
    in_dim, classes = _dims(data)
    dtype = next(iter(state.values())).dtype
    model = build_mlp(in_dim, classes, net, 0, dtype)
    model.load_state_dict(state)
    return model.eval()
