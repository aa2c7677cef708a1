"""A run's result from its ranks' (``RankResult`` dicts, one per rank, from ``recscale.train.result``):
its counters, rank 0's history, and the metrics a run logs (per-rank time split after the
warm-up steps, bytes per collective and split by the plan's hosts, tiers)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recscale.embedding.tier_placement import merge_tier_stats

# the byte totals a rank's ``bytes_per_step`` also carries, split by the plan's hosts (between
# ranks of one host / of different hosts): not collectives, so left out of sums over them
SPLIT_KEYS = ("intra_host", "inter_host", "embedding.intra_host", "embedding.inter_host")


def steady_per_step(total: float, warmup_total: float, steps: int, warmup_steps: int) -> float:
    """A rank's per-step mean of ``total`` (seconds over its ``steps``) after its warm-up steps
    (``warmup_total`` over ``warmup_steps``) where it took more steps than those, else over all
    of them: the step it runs."""
    warm = warmup_steps if steps > warmup_steps else 0
    return (total - (warmup_total if warm else 0.0)) / max(steps - warm, 1)


@dataclass
class TrainResult:
    """The run's counters and metrics (``extra``: per-rank time split, bytes, tiers, ...)."""

    steps: int = 0
    samples: int = 0
    step_seconds: float = 0.0
    wall_seconds: float = 0.0
    final_loss: float = float("nan")
    history: dict[str, list[dict]] | None = None
    extra: dict[str, float] | None = None
    checkpoints: tuple[str, ...] = ()
    resumed_samples: int = 0  # samples trained before the checkpoint this run resumed from
    # a job across hosts: one record per attempt of the worker group (world size, replanned,
    # the step it resumed from, rows replayed); see recscale.train.job_worker
    transitions: list[dict] | None = None

    @property
    def samples_per_s(self) -> float:
        new = self.samples - self.resumed_samples
        return new / self.step_seconds if self.step_seconds > 0 else float("nan")


def _sent(r: dict) -> float:
    """A rank's bytes per step over all its collectives (the host split left out)."""
    return sum(v for k, v in r["bytes_per_step"].items() if k not in SPLIT_KEYS)


def summarize(results: dict[int, dict]) -> TrainResult:
    """Per-rank results (RankResult dicts) -> the run's result: its counters, rank 0's history,
    and metrics (``extra``: per-rank time split per step after the warm-up steps, bytes per
    collective, bytes split into ``bytes_per_step.intra_host`` / ``inter_host`` (all ranks) and
    per rank, tiers)."""
    r0 = results[min(results)]
    step_s = max(r["step_seconds"] for r in results.values())
    new_samples = sum(r["samples"] - r["resumed_samples"] for r in results.values())
    out = {
        "steps": r0["steps"],
        "samples": sum(r["samples"] for r in results.values()),
        "step_seconds": step_s,
        "wall_seconds": max(r["wall_seconds"] for r in results.values()),
        "samples_per_s": new_samples / step_s if step_s else float("nan"),
        "final_loss": r0["final_loss"],
        "bytes_per_step": float(np.sum([_sent(r) for r in results.values()])),
        "checkpoints_written": len(r0["checkpoints"]),
        "checkpoint_failures": r0["checkpoint_failures"],
        "checkpoint_seconds": r0["checkpoint_seconds"],
        "resumed": int(r0["resumed_from"] is not None),
        "resharded": int(r0["resharded"]),
        "resharded_from": r0["resharded_from"],  # the checkpoint's world size (0: none)
        "reshard_step": r0["reshard_step"],
        "reshard_rows_remaining": r0["reshard_rows_remaining"],
        "initialised_from_checkpoint": int(r0["initialised_from"] is not None),
        "resumed_samples": sum(r["resumed_samples"] for r in results.values()),
        # train.validation / train.early_stopping (rank 0's: every rank takes the same decisions)
        "validation_points": r0.get("validation_points", 0),
        "validation_seconds": r0.get("validation_seconds", 0.0),
        "best_step": r0.get("best_step", 0),
        "best_validation_value": r0.get("best_value", float("nan")),
        "stopped_early_at": r0.get("stopped_early_at", 0),
        "pruned_at": r0.get("pruned_at", 0),
        "restored_best": int(bool(r0.get("restored_best", False))),
        "average_decay": r0.get("average_decay", 0.0),  # train.average, "auto" resolved
    }
    for rank, r in sorted(results.items()):
        steps = max(r["steps"], 1)
        # the step a rank runs: its mean after the warm-up steps (result.WARMUP_STEPS)
        out[f"rank{rank}.step_ms"] = 1e3 * steady_per_step(
            r["step_seconds"], r["warmup_seconds"], r["steps"], r["warmup_steps"])
        out[f"rank{rank}.comm_ms"] = 1e3 * steady_per_step(
            r["comm_seconds"], r["warmup_comm_seconds"], r["steps"], r["warmup_steps"])
        out[f"rank{rank}.compute_ms"] = out[f"rank{rank}.step_ms"] - out[f"rank{rank}.comm_ms"]
        out[f"rank{rank}.warmup_ms"] = 1e3 * r["warmup_seconds"] / max(r["warmup_steps"], 1)
        out[f"rank{rank}.bytes_sent_per_step"] = _sent(r)
        out[f"rank{rank}.embedding_bytes"] = r["embedding_bytes"]
        out[f"rank{rank}.planned_embedding_bytes"] = r["planned_bytes"]
        out[f"rank{rank}.data_wait_ms"] = 1e3 * r["data_wait_seconds"] / steps
        for k, v in r["bytes_per_step"].items():
            out[f"rank{rank}.bytes_per_step.{k}"] = v
        for k, v in r["tier_stats"].items():
            out[f"rank{rank}.tiers.{k}"] = v
    for key in SPLIT_KEYS:  # bytes between ranks of one plan host / of different hosts
        out[f"bytes_per_step.{key}"] = float(sum(r["bytes_per_step"].get(key, 0.0)
                                                 for r in results.values()))
    out.update({f"hf.{k}": v for k, v in r0.get("dense_optimizer", {}).items()})
    tiers = merge_tier_stats([r["tier_stats"] for r in results.values() if r["tier_stats"]])
    out.update({f"tiers.{k}": v for k, v in tiers.items()})
    return TrainResult(out["steps"], out["samples"], step_s, out["wall_seconds"],
                       out["final_loss"], r0["history"], out, tuple(r0["checkpoints"]),
                       out["resumed_samples"])
