"""The sharded runtime's worker: what every rank runs (started by ``recscale.distributed.launch``
or by torchrun), and how the ranks' results become the run's.

Each rank reads its own contiguous share of the train rows; the global batch is the per-rank batch
x world size. At the end rank 0 gathers every table into the state_dict a single-process DLRM of
the same config would have (world-size free) and writes it; every rank learns where.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from recscale.comm import CommsConfig
from recscale.config import parse
from recscale.data.loader import LoaderConfig, make_loader, rank_row_counts
from recscale.distributed import run_in_group, threads_for_run, worker_entry
from recscale.embedding.placement import merge_tier_stats
from recscale.model.dlrm import ModelConfig
from recscale.sharding import ShardingPlan
from recscale.train.checkpoint import Checkpointer, model_fingerprint
from recscale.train.config import TrainConfig
from recscale.train.loop import SPLIT_KEYS, EpochData, run_loop, steady_per_step
from recscale.train.runtime import ShardedRuntime


def loader_data(files, train_cfg: TrainConfig, rank: int, world_size: int,
                device: torch.device) -> EpochData:
    """This rank's share of ``files``; every rank takes as many steps as the largest share. A
    resume under another world size opens the row positions it is given instead."""
    shares = rank_row_counts(files, world_size)
    cfg = LoaderConfig(batch_size=train_cfg.batch_size_per_rank, rank=rank, world_size=world_size,
                       reader_workers=train_cfg.reader_workers, prefetch=train_cfg.prefetch,
                       pin_memory=device.type == "cuda")
    steps = max(math.ceil(c / train_cfg.batch_size_per_rank) for c in shares)
    return EpochData(lambda work=None: make_loader(files, cfg, work), steps, sum(shares),
                     train_cfg.batch_size_per_rank)


def train_rank(ctx, manifest: dict, model_cfg: ModelConfig, train_cfg: TrainConfig,
               comms: CommsConfig, plan: ShardingPlan, out_dir: str, run_id: str,
               on_step=None) -> dict[str, Any]:
    """One rank's whole run, inside ``run_in_group``: its model lives and dies in here, so it
    is freed before the group is torn down, and only plain results leave. ``on_step``: see
    ``run_loop``. Under torchrun this is the caller's own process (its Kedro run): its threads
    and the memory training kept go back afterwards (``threads_for_run``)."""
    with threads_for_run(train_cfg.num_threads, ctx.local_world_size):
        return _train_rank(ctx, manifest, model_cfg, train_cfg, comms, plan, out_dir, run_id,
                           on_step)


def _train_rank(ctx, manifest, model_cfg, train_cfg, comms, plan, out_dir, run_id,
                on_step) -> dict[str, Any]:
    rt = ShardedRuntime(ctx, plan, model_cfg, train_cfg, comms)
    files = manifest["splits"]["train"]["files"]
    ckpt = None
    if train_cfg.checkpoint.dir is not None:
        ckpt = Checkpointer(train_cfg.checkpoint, run_id, ctx.rank, ctx.world_size,
                            fingerprint=model_fingerprint(manifest, model_cfg, train_cfg))
    res = run_loop(rt, loader_data(files, train_cfg, ctx.rank, ctx.world_size, ctx.device),
                   train_cfg, ckpt, on_step)
    tables_and_states = rt.model.embeddings.full_tables(dst=0)
    path = None
    if ctx.rank == 0:
        from recscale.train.api import cpu_model_from

        tables, states = tables_and_states
        state = cpu_model_from(manifest, model_cfg, train_cfg, tables, states,
                               rt.model.dense.state_dict()).state_dict()
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "dlrm_state_dict.pt")
        torch.save(state, path)
    res.state_path = path
    # every rank returns every rank's result and where the model is: the launcher of each host
    # (or each torchrun process) then has the whole run, not only its own ranks
    ranks = [None] * ctx.world_size
    dist.all_gather_object(ranks, res.__dict__, group=ctx.sparse_group)
    rt.model.embeddings.close()
    return {"ranks": dict(enumerate(ranks)), "state_path": ranks[0]["state_path"]}


@record
@worker_entry
def sharded_train_worker(manifest: dict, model_d: dict, train_d: dict, comms_d: dict,
                         plan_d: dict, out_dir: str, run_id: str = "run") -> dict[str, Any]:
    """Entry point of every worker process (picklable arguments only). -> {"ranks": {rank:
    RankResult as a dict}, "state_path": the unsharded model rank 0 wrote}."""
    train_cfg = parse(TrainConfig, train_d, "train")
    return run_in_group(train_cfg.launch, train_rank, manifest, parse(ModelConfig, model_d, "model"),
                        train_cfg, parse(CommsConfig, comms_d, "comms"),
                        ShardingPlan.from_dict(plan_d), out_dir, run_id, device=train_cfg.device)


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
    # the step it resumed from, rows replayed); see recscale.train.job
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
    }
    for rank, r in sorted(results.items()):
        steps = max(r["steps"], 1)
        # the step a rank runs: its mean after the warm-up steps (loop.WARMUP_STEPS)
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


def bytes_against_plan(extra: dict[str, float], plan: ShardingPlan) -> dict[str, float]:
    """The embedding exchanges' bytes per step, split by the plan's hosts, measured (all ranks)
    and as the planner's traffic estimate says, with measured / estimate."""
    from recscale.sharding.traffic import estimate_comm_bytes

    est = estimate_comm_bytes(plan)
    out = {}
    for side in ("intra_host", "inter_host"):
        got = extra.get(f"bytes_per_step.embedding.{side}", float("nan"))
        out[f"bytes_per_step.embedding.{side}.estimate"] = est[side]
        out[f"bytes_per_step.embedding.{side}.measured_over_estimate"] = (
            got / est[side] if est[side] else float("nan"))
    return out


def step_time_against_plan(extra: dict[str, float], plan: ShardingPlan, model_cfg: ModelConfig,
                           pipelined: bool, num_tables: int) -> tuple[dict[str, float], str]:
    """The cost model's per-rank step time for this run (``recscale.sharding.step_time``, the
    dense arch of ``model_cfg`` included) beside the measured one, with measured / predicted; and
    the plan's report followed by the table of both."""
    from recscale.sharding.report import format_step_report
    from recscale.sharding.step_time import predict_step
    from recscale.sharding.step_time import step_time_against_plan as against
    from recscale.train.calibrate import dense_spec

    pred = predict_step(plan, dense_spec(model_cfg, num_tables), pipelined)
    return against(extra, pred), plan.report() + "\n\n" + format_step_report(pred, extra)
