"""Comparison chart of optimizers: validation error against passes and against wall time."""

from __future__ import annotations

from collections.abc import Sequence

from recscale.hf.loop import FitResult


def comparison_figure(results: Sequence[FitResult], title: str = "", target_error: float | None = None):
    """A matplotlib Figure with three panels: validation error vs passes over the training data,
    vs training wall time, and training loss vs passes."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = {"hf": "tab:blue", "sgd": "tab:orange", "adam": "tab:green"}
    batches = sorted({r.batch_size for r in results})
    styles = ["-", "--", ":", "-."]
    for r in results:
        label = f"{r.name} (batch {r.batch_size}" + (f", {r.world_size} ranks)" if r.world_size > 1 else ")")
        kw = dict(marker=".", ms=4, label=label, color=colors.get(r.name),
                  ls=styles[batches.index(r.batch_size) % len(styles)])
        h = r.history
        axes[0].plot([p["passes"] for p in h], [100 * p["val_error"] for p in h], **kw)
        axes[1].plot([p["wall_s"] for p in h], [100 * p["val_error"] for p in h], **kw)
        tl = [(p["passes"], p["train_loss"]) for p in h if p["train_loss"] == p["train_loss"]]
        axes[2].plot([a for a, _ in tl], [b for _, b in tl], **kw)
    axes[1].set_xscale("symlog", linthresh=1.0)
    for ax, xl in zip(axes, ("passes over the training data", "training wall time (s, symlog)",
                             "passes over the training data")):
        ax.set_xlabel(xl)
        ax.grid(alpha=0.3)
        if target_error is not None and ax is not axes[2]:
            ax.axhline(100 * target_error, color="grey", ls="--", lw=0.8)
    axes[0].set_ylabel("validation error (%)")
    axes[1].set_ylabel("validation error (%)")
    axes[2].set_ylabel("training loss (batch mean)")
    axes[2].set_yscale("log")
    for ax in axes[:2]:
        ax.set_ylim(0, min(100, max(5, ax.get_ylim()[1])))
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def comparison_image(results: Sequence[FitResult], title: str = "", target_error: float | None = None):
    """The comparison chart as a PIL image (what pillow.ImageDataset saves)."""
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    fig = comparison_figure(results, title, target_error)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    buf.seek(0)
    image = Image.open(buf)
    image.load()
    return image
