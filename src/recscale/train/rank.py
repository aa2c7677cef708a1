"""The sharded runtime's worker: what every rank runs (started by ``recscale.distributed.launch``
or by torchrun; the job worker across hosts runs ``train_rank`` too). The ranks' results become
the run's in ``recscale.report.summarize``.

Each rank reads its own contiguous share of the train rows; the global batch is the per-rank batch
x world size. At the end rank 0 gathers every table into the state_dict a single-process DLRM of
the same config would have (world-size free) and writes it; every rank learns where.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from recscale.comm import CommsConfig
from recscale.config import parse
from recscale.data.loader import (
    LoaderConfig,
    count_rows,
    empty_batch,
    make_loader,
    rank_row_counts,
)
from recscale.data.schema import FittedSchema
from recscale.data.unknown_ids import router_for
from recscale.data.work import rows, share
from recscale.distributed import run_in_group, threads_for_run, worker_entry
from recscale.model import ModelConfig, cpu_model_from
from recscale.runconfig import TrainConfig, recipe_for
from recscale.sharding import ShardingPlan
from recscale.train.checkpoint import Checkpointer, model_fingerprint
from recscale.train.loop import EpochData, run_loop
from recscale.train.runtime import ShardedRuntime
from recscale.train.validation import ValidationData

log = logging.getLogger(__name__)


def loader_data(manifest: dict, train_cfg: TrainConfig, rank: int, world_size: int,
                device: torch.device) -> EpochData:
    """This rank's share of the manifest's train split; every rank takes as many steps as the
    largest share. A resume under another world size opens the row positions it is given
    instead. A share of the ids goes to their table's unknown row as ``train.unknown_ids``
    says (``recscale.data.unknown_ids``): here, before any input distribution, by each row's
    own number, so every world size and resume routes the same ids."""
    files = manifest["splits"]["train"]["files"]
    fitted = FittedSchema.of(manifest)
    route = router_for(manifest, train_cfg.unknown_ids, train_cfg.seed)
    shares = rank_row_counts(files, world_size)
    cfg = LoaderConfig(batch_size=train_cfg.batch_size_per_rank, rank=rank, world_size=world_size,
                       reader_workers=train_cfg.reader_workers, prefetch=train_cfg.prefetch,
                       pin_memory=device.type == "cuda", table_rows=fitted.feature_rows())
    steps = max(math.ceil(c / train_cfg.batch_size_per_rank) for c in shares)
    return EpochData(lambda work=None: make_loader(files, cfg, work, route), steps, sum(shares),
                     train_cfg.batch_size_per_rank,
                     empty=empty_batch(fitted.sparse_names, fitted.num_dense,
                                       bool(fitted.weighted)))


def validation_data(manifest: dict, train_cfg: TrainConfig, rank: int, world_size: int
                    ) -> ValidationData | None:
    """This rank's share of the validation split (its first ``train.validation.max_rows`` rows
    when set), read as it was preprocessed: no id is routed to an unknown row. None when
    validation is off or the split has no rows."""
    split = manifest["splits"].get("validation")
    if not train_cfg.validation.enabled or split is None or not split.get("rows"):
        return None
    files = split["files"]
    total = count_rows(files)
    vcfg = train_cfg.validation
    n = total if vcfg.max_rows is None else min(total, vcfg.max_rows)
    fitted = FittedSchema.of(manifest)
    batch = vcfg.batch_size or train_cfg.batch_size_per_rank
    cfg = LoaderConfig(batch_size=batch, reader_workers=1, prefetch=2,
                       table_rows=fitted.feature_rows())
    mine = share(n, rank, world_size)
    steps = max(math.ceil(rows(share(n, k, world_size)) / batch) for k in range(world_size))
    return ValidationData(lambda: make_loader(files, cfg, mine), steps, n,
                          empty_batch(fitted.sparse_names, fitted.num_dense,
                                      bool(fitted.weighted)))


def train_rank(ctx, manifest: dict, model_cfg: ModelConfig, train_cfg: TrainConfig,
               comms: CommsConfig, plan: ShardingPlan, out_dir: str, run_id: str,
               on_step=None, observer=None) -> dict[str, Any]:
    """One rank's whole run, inside ``run_in_group``: its model lives and dies in here, so it
    is freed before the group is torn down, and only plain results leave. ``on_step``: see
    ``run_loop``; ``observer``: see ``ValidationData``. Under torchrun this is the caller's own process (its Kedro run): its threads
    and the memory training kept go back afterwards (``threads_for_run``)."""
    with threads_for_run(train_cfg.num_threads, ctx.local_world_size):
        return _train_rank(ctx, manifest, model_cfg, train_cfg, comms, plan, out_dir, run_id,
                           on_step, observer)


def agreed_plan(ctx, plan: ShardingPlan) -> ShardingPlan:
    """Rank 0's plan, on every rank. The ranks of a job across hosts replan each on its own
    when the world size changes (``recscale.train.job_worker``), and the planner's float results
    can differ in the last bit between CPUs (numpy's exp, log and power round otherwise on
    AVX-512 than on AVX2), so hosts of different CPUs could shard the same tables two ways and
    exchange rows the others do not expect. Every rank trains rank 0's plan; a rank whose own
    plan differed says so."""
    if ctx.world_size == 1:
        return plan
    box = [plan.to_dict() if ctx.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=ctx.sparse_group)
    if ctx.rank == 0:
        return plan
    ours = ShardingPlan.from_dict(box[0])
    if ours != plan:
        log.warning("rank %d planned the tables otherwise than rank 0 (another CPU rounds the "
                    "planner's costs otherwise); it trains rank 0's plan", ctx.rank)
    return ours


def _train_rank(ctx, manifest, model_cfg, train_cfg, comms, plan, out_dir, run_id,
                on_step, observer=None) -> dict[str, Any]:
    fitted = FittedSchema.of(manifest)
    plan = agreed_plan(ctx, plan)
    rt = ShardedRuntime(ctx, plan, model_cfg, train_cfg, comms,
                        feature_names=fitted.sparse_names, num_dense=fitted.num_dense,
                        feature_tables=fitted.feature_tables(), pooling=fitted.pooling())
    ckpt = None
    if train_cfg.checkpoint.dir is not None:
        ckpt = Checkpointer(train_cfg.checkpoint, run_id, ctx.rank, ctx.world_size,
                            fingerprint=model_fingerprint(manifest, model_cfg, train_cfg))
    data = loader_data(manifest, train_cfg, ctx.rank, ctx.world_size, ctx.device)
    data.validation = validation_data(manifest, train_cfg, ctx.rank, ctx.world_size)
    if data.validation is not None:  # rank 0 calls it; every rank takes its answer
        data.validation.observer = observer
    res = run_loop(rt, data, train_cfg, ckpt, on_step)
    tables_and_states = rt.model.embeddings.full_tables(dst=0)
    path = None
    if ctx.rank == 0:
        tables, states = tables_and_states
        state = cpu_model_from(recipe_for(manifest, model_cfg, train_cfg), tables, states,
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
                         plan_d: dict, out_dir: str, run_id: str = "run",
                         observer=None) -> dict[str, Any]:
    """Entry point of every worker process (picklable arguments only). -> {"ranks": {rank:
    RankResult as a dict}, "state_path": the unsharded model rank 0 wrote}."""
    train_cfg = parse(TrainConfig, train_d, "train")
    return run_in_group(train_cfg.launch, train_rank, manifest, parse(ModelConfig, model_d, "model"),
                        train_cfg, parse(CommsConfig, comms_d, "comms"),
                        ShardingPlan.from_dict(plan_d), out_dir, run_id, observer=observer,
                        device=train_cfg.device)
