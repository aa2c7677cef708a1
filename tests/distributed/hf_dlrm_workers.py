"""Worker of tests/distributed/test_hf_dlrm_sharded.py (importable, so spawn can start it): the
sharded DLRM with a Hessian-free dense optimizer on 2 gloo ranks."""

from __future__ import annotations

import numpy as np
import torch

from recscale.comm.collectives import CommStats
from recscale.config import parse
from recscale.distributed import LaunchConfig, WorkerContext, run_in_group, worker_entry
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.train.hf_step import HessianFreeStep, counting_all_reduce
from recscale.train.runtime import build_sharded_model
from recscale.train.step import ShardedStep, make_dense_optimizer
from tests.distributed import workers as W

KINDS = ["data_parallel", "row_wise", "column_wise", "table_row_wise"]


def train_config(dense_optimizer: dict) -> TrainConfig:
    return parse(TrainConfig, {"embedding_optimizer": {"name": "exact_sgd", "learning_rate": 0.2},
                               "dense_optimizer": dense_optimizer, "seed": 3}, "train")


@worker_entry
def hf_sharded_worker(steps: list[list[dict]], hf: dict) -> dict:
    return run_in_group(LaunchConfig(collective_timeout_s=60), _hf_sharded, steps, hf,
                        device="auto")


def _model(ctx: WorkerContext, tcfg: TrainConfig, stats: CommStats):
    return build_sharded_model(ctx, W.make_plan(KINDS), parse(ModelConfig, W.MODEL, "model"),
                               tcfg, stats, feature_names=W.FEATURES, num_dense=W.NUM_DENSE)


def _hf_sharded(ctx: WorkerContext, steps: list[list[dict]], hf: dict) -> dict:
    out = {}
    # HF in float64 on every step; the tables (fbgemm) stay float32
    tcfg = train_config({"name": "hessian_free", "hf": hf})
    stats = CommStats()
    model = _model(ctx, tcfg, stats)
    model.dense.double()
    opt = make_dense_optimizer(model.dense_parameters(), tcfg.dense_optimizer,
                               counting_all_reduce(stats))
    step = HessianFreeStep(model, opt, ctx.world_size, sharded=True)
    for parts in steps:
        step(W.to_batch(parts[ctx.rank]))
    tables = model.embeddings.full_tables(dst=0)
    dense = {k: v.detach().numpy() for k, v in model.dense.state_dict().items()}
    # one step with SGD as the dense optimizer: the same tables as one HF step
    first = {}
    for name in ("sgd", "hessian_free"):
        cfg = train_config({"name": name, "learning_rate": 0.1, "hf": hf})
        m = _model(ctx, cfg, CommStats())
        if name == "sgd":
            s = ShardedStep(m, make_dense_optimizer(m.dense_parameters(), cfg.dense_optimizer),
                            ctx.world_size)
        else:
            o = make_dense_optimizer(m.dense_parameters(), cfg.dense_optimizer,
                                     counting_all_reduce(CommStats()))
            s = HessianFreeStep(m, o, ctx.world_size, sharded=True)
        s(W.to_batch(steps[0][ctx.rank]))
        first[name] = m.embeddings.full_tables(dst=0)
    if ctx.rank == 0:
        out = {"tables": [t.numpy() for t in tables[0]], "dense": dense,
               "summary": step.summary(), "bytes": stats.snapshot(),
               "first_step_tables": {k: [t.numpy() for t in v[0]] for k, v in first.items()}}
    # every rank's dense weights: identical steps keep them replicated
    gathered = [None] * ctx.world_size
    torch.distributed.all_gather_object(gathered, np.concatenate(
        [p.detach().reshape(-1).numpy() for p in model.dense.parameters()]))
    out["dense_per_rank"] = gathered
    return out
