"""Pictures of a run: loss and throughput over training, ROC (AUC) and calibration of one or
more models on the same rows, AUC across retrains. Each function returns a matplotlib Figure
(object-oriented API, no pyplot state, no display backend); the Kedro layer logs them to MLflow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from recscale.evaluate.curves import calibration_bins, roc_curve
from recscale.evaluate.metrics import auc_score


def _figure(width: float = 6.4, height: float = 4.2):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def history_figure(points: Sequence[Mapping], ylabel: str, title: str, xlabel: str = "training step"):
    """A metric history ([{step, value}], as the trainer records it) as a line."""
    fig, ax = _figure()
    if points:
        pts = sorted(points, key=lambda d: d["step"])
        ax.plot([d["step"] for d in pts], [d["value"] for d in pts], marker=".", lw=1.2)
    else:
        ax.text(0.5, 0.5, "no points recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    return fig


def loss_figure(history: Mapping[str, Sequence[Mapping]], title: str = "training loss",
                best_step: int | None = None):
    """The training loss, and the validation log loss beside it when the run validated
    (``validation.log_loss``), with the best validation step marked."""
    fig = history_figure(history.get("loss", []), "BCE loss (mean over the interval)", title)
    val = sorted(history.get("validation.log_loss", []), key=lambda d: d["step"])
    if val:
        ax = fig.axes[0]
        if ax.lines:
            ax.lines[0].set_label("train (interval mean)")
        ax.plot([d["step"] for d in val], [d["value"] for d in val], marker="o", lw=1.2,
                label="validation")
        if best_step:
            ax.axvline(best_step, color="grey", ls="--", lw=0.8, label=f"best step {best_step}")
        ax.legend(fontsize=8)
    return fig


def throughput_figure(history: Mapping[str, Sequence[Mapping]], title: str = "training throughput"):
    return history_figure(history.get("samples_per_s", []), "samples / s (in the step)", title)


def roc_figure(scored: Mapping[str, tuple[np.ndarray, np.ndarray]], title: str = "ROC"):
    """ROC curves of several models on the same rows: {name: (labels, probs)}."""
    fig, ax = _figure(5.2, 4.8)
    for name, (y, p) in scored.items():
        fpr, tpr = roc_curve(y, p)
        ax.plot(fpr, tpr, lw=1.5, label=f"{name} (AUC {auc_score(y, p):.4f})")
    ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=0.8, label="chance")
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title=title,
           xlim=(0, 1), ylim=(0, 1))
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def calibration_figure(scored: Mapping[str, tuple[np.ndarray, np.ndarray]], bins: int = 10,
                       title: str = "calibration"):
    """Observed click rate against mean predicted probability, equal-count bins."""
    fig, ax = _figure(5.2, 4.8)
    top = 0.0
    for name, (y, p) in scored.items():
        pred, obs, _ = calibration_bins(y, p, bins)
        ratio = float(np.mean(p) / np.mean(y)) if np.mean(y) > 0 else float("nan")
        ax.plot(pred, obs, marker="o", ms=4, lw=1.2, label=f"{name} (mean pred / CTR {ratio:.3f})")
        top = max(top, float(pred.max()), float(obs.max()))
    top = min(1.0, top * 1.05 + 1e-3)
    ax.plot([0, top], [0, top], color="grey", ls="--", lw=0.8, label="perfect")
    ax.set(xlabel="mean predicted click probability", ylabel="observed click rate", title=title,
           xlim=(0, top), ylim=(0, top))
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def auc_history_figure(rows: Sequence[Mapping], title: str = "AUC across retrains"):
    """One point per retrain: {label, challenger_auc, champion_auc (or None), promoted}."""
    fig, ax = _figure(max(6.4, 0.6 * len(rows) + 3), 4.2)
    x = np.arange(len(rows))
    ax.plot(x, [r["challenger_auc"] for r in rows], marker="o", label="challenger (new model)")
    champ = [(i, r["champion_auc"]) for i, r in enumerate(rows) if r.get("champion_auc") is not None]
    if champ:
        ax.plot([i for i, _ in champ], [a for _, a in champ], marker="s", ls="--",
                label="champion, same rows")
    for i, r in enumerate(rows):
        ax.annotate("promoted" if r["promoted"] else "kept champion", (i, r["challenger_auc"]),
                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    ax.set_xticks(x, [str(r["label"]) for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="AUC on the held-out tail of the newest day", title=title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig
