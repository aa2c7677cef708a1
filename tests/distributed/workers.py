"""Worker functions run on 2 gloo ranks by tests/distributed (importable, so spawn can start them)."""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import torch

from recscale.comm.collectives import CommStats
from recscale.config import parse
from recscale.data.batch import Batch, SparseFeatures
from recscale.distributed import LaunchConfig, WorkerContext, run_in_group, worker_entry
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.sharding import ShardingPlan, ShardSpec, TableSpec, Topology, plan_sharding
from recscale.train.runtime import build_sharded_model
from recscale.train.step import ShardedStep, make_dense_optimizer

ROWS = (40, 25, 64, 33)
DIM = 8
NUM_DENSE = 5
FEATURES = tuple(f"f{i}" for i in range(len(ROWS)))
MODEL = {"embedding_dim": DIM, "bottom_mlp": [16, DIM], "top_mlp": [16, 1]}
# shared tables: f4 looks up t2 (the table under test of the parity scenarios), f5 looks up t1;
# some features averaged
SHARED_TABLES = (0, 1, 2, 3, 2, 1)
SHARED_POOLING = ("sum", "mean", "sum", "mean", "mean", "sum")
SHARED_FEATURES = tuple(f"f{i}" for i in range(len(SHARED_TABLES)))


MODEL_DCN = {**MODEL, "interaction": "dcn", "dcn": {"num_layers": 2, "low_rank": 4}}


def make_global_batches(n: int, sizes=(7, 10), seed: int = 0, max_len: int = 3,
                        feature_tables=None, weighted: bool = False) -> list[list[dict]]:
    """n steps; per step one part per rank (uneven sizes), as plain numpy dicts; bags of 0 to
    ``max_len`` ids; ``feature_tables``: each feature's table (default one per table);
    ``weighted``: each id with a weight in [0.1, 2)."""
    rng = np.random.default_rng(seed)
    tables = list(range(len(ROWS))) if feature_tables is None else list(feature_tables)
    steps = []
    for _ in range(n):
        parts = []
        for b in sizes:
            lengths = rng.integers(0, max_len + 1, size=(len(tables), b))
            values = np.concatenate([rng.integers(0, ROWS[t], size=int(lengths[f].sum()))
                                     for f, t in enumerate(tables)])
            parts.append({"dense": rng.normal(size=(b, NUM_DENSE)).astype(np.float32),
                          "lengths": lengths, "values": values,
                          "labels": rng.integers(0, 2, b).astype(np.float32)})
            if weighted:
                parts[-1]["weights"] = rng.uniform(0.1, 2.0, len(values)).astype(np.float32)
        steps.append(parts)
    return steps


def to_batch(part: dict) -> Batch:
    b = part["dense"].shape[0]
    keys = FEATURES if len(part["lengths"]) == len(FEATURES) else SHARED_FEATURES
    return Batch(torch.from_numpy(part["dense"]),
                 SparseFeatures(keys, torch.from_numpy(part["values"]).long(),
                                torch.from_numpy(part["lengths"]).long(),
                                torch.from_numpy(part["weights"]) if "weights" in part
                                else None),
                 torch.from_numpy(part["labels"]), torch.arange(b))


def concat_parts(parts: list[dict]) -> dict:
    """The global batch a single process sees: ranks' samples in rank order."""
    lengths = np.concatenate([p["lengths"] for p in parts], axis=1)
    values, weights = [], []
    for t in range(lengths.shape[0]):
        for p in parts:
            off = np.concatenate([[0], np.cumsum(p["lengths"].reshape(-1))])
            b = p["lengths"].shape[1]
            values.append(p["values"][off[t * b]: off[(t + 1) * b]])
            if "weights" in p:
                weights.append(p["weights"][off[t * b]: off[(t + 1) * b]])
    out = {"dense": np.concatenate([p["dense"] for p in parts]), "lengths": lengths,
           "values": np.concatenate(values), "labels": np.concatenate([p["labels"] for p in parts])}
    if weights:
        out["weights"] = np.concatenate(weights)
    return out


def shard(rank, r0, rl, c0, cl) -> ShardSpec:
    return ShardSpec(rank=rank, row_offset=r0, row_length=rl, col_offset=c0, col_length=cl,
                     tier="ddr", cache_fraction=0.0, compute_cost=0.0, comms_cost=0.0,
                     storage_bytes=0.0, compute_tier_bytes=0.0)


def layout(kind: str, rows: int, home: int, dim: int = DIM) -> tuple[str, tuple[ShardSpec, ...]]:
    """Hand-made shards of one table for a 2-rank, 1-host world (deliberately uneven/swapped)."""
    if kind == "table_wise":
        return kind, (shard(home, 0, rows, 0, dim),)
    if kind in ("row_wise", "table_row_wise"):
        block = -(-rows // 2)
        return kind, (shard(1, 0, block, 0, dim), shard(0, block, rows - block, 0, dim))
    if kind in ("column_wise", "table_column_wise"):
        return kind, (shard(1, 0, rows, 0, 4), shard(0, 0, rows, 4, dim - 4))
    if kind == "data_parallel":
        return kind, (shard(0, 0, rows, 0, dim), shard(1, 0, rows, 0, dim))
    raise ValueError(kind)


def mixed_plan(manifest: dict, kinds: list[str], batch: int, dim: int = 16) -> ShardingPlan:
    """A 2-rank plan of ``manifest``'s tables, table i laid out by hand as ``kinds[i % len(kinds)]``
    (``layout``) so every kind of piece is in one run."""
    from recscale.sharding.from_data import table_specs_from_manifest

    plan = plan_sharding(table_specs_from_manifest(manifest, dim),
                         Topology.preset("cpu-local", world_size=2), batch)
    tables = []
    for i, tp in enumerate(plan.tables):
        st, shards = layout(kinds[i % len(kinds)], tp.num_embeddings, home=i % 2, dim=dim)
        tables.append(dataclasses.replace(tp, sharding_type=st, shards=shards))
    return dataclasses.replace(plan, tables=tuple(tables))


def make_plan(kinds: list[str], dim: int | list[int] = DIM, feature_tables=None) -> ShardingPlan:
    """``dim``: one for every table, or one per table; ``feature_tables``: each feature's table
    (features named f0, f1, ...; default one per table)."""
    dims = [dim] * len(ROWS) if isinstance(dim, int) else list(dim)
    tables = list(range(len(ROWS))) if feature_tables is None else list(feature_tables)
    names = [tuple(f"f{j}" for j, t in enumerate(tables) if t == i) for i in range(len(ROWS))]
    base = plan_sharding([TableSpec(f"t{i}", r, d, feature_names=fs)
                          for i, (r, d, fs) in enumerate(zip(ROWS, dims, names))],
                         Topology.preset("cpu-local", world_size=2), 16)
    tables = []
    for i, (tp, kind) in enumerate(zip(base.tables, kinds)):
        st, shards = layout(kind, tp.num_embeddings, home=i % 2, dim=dims[i])
        tables.append(dataclasses.replace(tp, sharding_type=st, shards=shards))
    return dataclasses.replace(base, tables=tuple(tables))


@worker_entry
def parity_worker(scenarios: list[dict], steps: list[list[dict]]) -> dict:
    """For each scenario (kinds per table, embedding optimizer; optional "model" and "steps" in
    place of MODEL and ``steps``): the pooled output of the first batch and, after training on
    every step, the full tables and dense weights (rank 0)."""
    return run_in_group(LaunchConfig(collective_timeout_s=60), _parity, scenarios, steps,
                        device="auto")


def _parity(ctx: WorkerContext, scenarios: list[dict], steps: list[list[dict]]) -> dict:
    import torch.distributed as dist

    out = {}
    all_steps = steps
    for sc in scenarios:
        steps = sc.get("steps", all_steps)
        tcfg = parse(TrainConfig, {"embedding_optimizer": {"name": sc["optimizer"],
                                                           "learning_rate": 0.2},
                                   "dense_optimizer": {"name": "sgd", "learning_rate": 0.1},
                                   "seed": 3}, "train")
        stats = CommStats()
        shared = sc.get("shared", False)
        model = build_sharded_model(
            ctx, make_plan(sc["kinds"], sc.get("dims", DIM),
                           SHARED_TABLES if shared else None),
            parse(ModelConfig, sc.get("model", MODEL), "model"), tcfg, stats,
            feature_names=SHARED_FEATURES if shared else FEATURES, num_dense=NUM_DENSE,
            feature_tables=SHARED_TABLES if shared else None,
            pooling=SHARED_POOLING if shared else None)
        first = to_batch(steps[0][ctx.rank])
        with torch.no_grad():
            pooled = model.embeddings(first.sparse)
        gathered = [None] * ctx.world_size
        dist.all_gather_object(gathered, pooled.numpy())
        step = ShardedStep(model, make_dense_optimizer(model.dense_parameters(),
                                                       tcfg.dense_optimizer), ctx.world_size)
        for parts in steps:
            step(to_batch(parts[ctx.rank]))
        tables = model.embeddings.full_tables(dst=0)
        if ctx.rank == 0:
            out[sc["name"]] = {
                "pooled": np.concatenate(gathered),
                "tables": [t.numpy() for t in tables[0]],
                "dense": {k: v.detach().numpy() for k, v in model.dense.state_dict().items()},
                "bytes": stats.snapshot(),
            }
    return out


@worker_entry
def memory_worker(plan_d: dict) -> dict:
    """Embedding bytes held after construction vs the planner's estimate for this rank."""
    return run_in_group(LaunchConfig(), _memory, plan_d, device="auto")


def _memory(ctx: WorkerContext, plan_d: dict) -> dict:
    plan = ShardingPlan.from_dict(plan_d)
    model = build_sharded_model(ctx, plan, parse(ModelConfig, {}, "model"),
                                parse(TrainConfig, {}, "train"), CommStats(),
                                feature_names=tuple(t.feature_names[0] for t in plan.tables),
                                num_dense=NUM_DENSE)
    return {"measured": model.embeddings.memory_bytes()["fast"],
            "planned": plan.ranks[ctx.rank].memory(plan.topology.compute_tier)}


@worker_entry
def environment_worker(names: list[str]) -> dict[str, str | None]:
    """This worker's values of ``names`` (no process group needed)."""
    return {n: os.environ.get(n) for n in names}


@worker_entry
def modules_loaded(names: list[str]) -> list[str]:
    """Those of ``names`` this worker has imported when it starts."""
    return [n for n in names if n in sys.modules]


@worker_entry
def failing_worker() -> None:
    return run_in_group(LaunchConfig(), _failing, device="auto")


def _failing(ctx: WorkerContext) -> None:
    import torch.distributed as dist

    if ctx.rank == 1:
        raise ValueError("boom from rank 1")
    dist.barrier()


@worker_entry
def hanging_worker() -> None:
    """Rank 1 never joins the collective; rank 0 must fail after the timeout, not hang."""
    return run_in_group(LaunchConfig(collective_timeout_s=3), _hanging, device="auto")


def _hanging(ctx: WorkerContext) -> None:
    import time

    import torch.distributed as dist

    if ctx.rank == 1:
        time.sleep(120)
    dist.all_reduce(torch.ones(1), group=ctx.sparse_group)


@worker_entry
def encoded_a2a_worker(pairs: list[tuple[str, str]]) -> dict:
    """Forward values and input gradients of an encoded all-to-all vs the fp32 one."""
    return run_in_group(LaunchConfig(), _encoded_a2a, pairs, device="auto")


def _encoded_a2a(ctx: WorkerContext, pairs: list[tuple[str, str]]) -> dict:
    from recscale.comm import get_codec
    from recscale.comm.collectives import OutputExchange

    def encoded_all_to_all(x, send, recv, fwd, bwd, group, backward_scale=1.0):
        ex = OutputExchange(send, recv, fwd, bwd, group, None, "output", backward_scale)
        return ex.finish(ex.start(x))

    out = {}
    cols = 48
    send = [(3, cols), (5, cols)] if ctx.rank == 0 else [(4, cols), (2, cols)]
    recv = [(send_of(src, ctx.rank), cols) for src in range(2)]
    g = torch.Generator().manual_seed(10 + ctx.rank)
    n = sum(r for r, _ in send) * cols
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g))
    w = torch.randn(sum(r for r, _ in recv) * cols, generator=g)
    fp32 = get_codec("fp32")
    ref_x = x.clone().requires_grad_(True)
    ref_y = encoded_all_to_all(ref_x, send, recv, fp32, fp32, ctx.sparse_group)
    (ref_y * w).sum().backward()
    for fwd, bwd in pairs:
        xx = x.clone().requires_grad_(True)
        scale = 1024.0 if bwd == "fp16" else 1.0
        y = encoded_all_to_all(xx, send, recv, get_codec(fwd), get_codec(bwd),
                               ctx.sparse_group, backward_scale=scale)
        (y * w).sum().backward()
        fwd_bound = _blockwise_bound(get_codec(fwd), ref_y.detach(), recv)
        # the gradient of x is w as the peers encoded it: bound from their w, i.e. the
        # exact gradient (ref_x.grad), block by block
        bwd_bound = _blockwise_bound(get_codec(bwd), ref_x.grad, send, scale)
        out[f"{fwd}/{bwd}"] = {
            "fwd_excess": float(((y.detach() - ref_y.detach()).abs() - fwd_bound).max()),
            "bwd_excess": float(((xx.grad - ref_x.grad).abs() - bwd_bound).max()),
            "bwd_err": float((xx.grad - ref_x.grad).abs().max()),
        }
    return out


def send_of(src: int, dst: int) -> int:
    table = {0: [3, 5], 1: [4, 2]}
    return table[src][dst]


def _blockwise_bound(codec, flat, shapes, scale: float = 1.0):
    parts, off = [], 0
    for rows, cols in shapes:
        block = flat[off: off + rows * cols].view(rows, cols) * scale
        parts.append((codec.bound(block) / scale).reshape(-1))
        off += rows * cols
    return torch.cat(parts)


@worker_entry
def codec_training_worker(precisions: list[str], steps: list[list[dict]]) -> dict:
    """Train a mixed 64-dim plan a few steps with each wire precision; losses and bytes."""
    return run_in_group(LaunchConfig(collective_timeout_s=60), _codec_training, precisions, steps,
                        device="auto")


def _codec_training(ctx: WorkerContext, precisions: list[str], steps: list[list[dict]]) -> dict:
    from recscale.comm import CommsConfig

    out = {}
    dim = 64
    model_cfg = parse(ModelConfig, {"embedding_dim": dim, "bottom_mlp": [32, dim],
                                    "top_mlp": [32, 1]}, "model")
    for p in precisions:
        comms = CommsConfig(forward=p, backward=p,
                            dense_allreduce=p if p in ("fp32", "fp16", "bf16") else "bf16")
        tcfg = parse(TrainConfig, {"embedding_optimizer": {"name": "exact_rowwise_adagrad",
                                                           "learning_rate": 0.1}}, "train")
        stats = CommStats()
        model = build_sharded_model(
            ctx, make_plan(["data_parallel", "row_wise", "table_wise", "table_wise"], dim),
            model_cfg, tcfg, stats, comms, feature_names=FEATURES, num_dense=NUM_DENSE)
        step = ShardedStep(model, make_dense_optimizer(model.dense_parameters(),
                                                       tcfg.dense_optimizer), ctx.world_size)
        losses = [step(to_batch(parts[ctx.rank]))[0] for parts in steps]
        params_finite = all(torch.isfinite(q).all() for q in model.dense_parameters())
        out[p] = {"losses": losses, "finite": params_finite,
                  "bytes": {k: v["bytes"] for k, v in stats.snapshot().items()}}
    return out


@worker_entry
def row_recording_train_worker(manifest: dict, model_d: dict, train_d: dict, comms_d: dict,
                               plan_d: dict, out_dir: str, run_id: str = "run",
                               observer=None) -> dict:
    """``sharded_train_worker`` that also writes the row ids of every step this rank trains to
    ``out_dir/rows-<run_id>-a<elastic attempt>-rank<r>-<i>.npy`` (i: the attempt's i-th step),
    each as the step ends, so a killed attempt leaves the steps it finished."""
    import inspect

    from recscale.train import rank
    from recscale.train.step import ShardedStep

    os.makedirs(out_dir, exist_ok=True)
    tag = f"rows-{run_id}-a{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}-rank{os.environ['RANK']}"
    run, calls = ShardedStep.run, [0]

    def recording(self, batch, started=None):
        out = run(self, batch, started)
        np.save(os.path.join(out_dir, f"{tag}-{calls[0]:05d}.npy"), batch.row_ids.cpu().numpy())
        calls[0] += 1
        return out

    ShardedStep.run = recording  # in this worker process only
    try:
        return inspect.unwrap(rank.sharded_train_worker)(manifest, model_d, train_d, comms_d,
                                                            plan_d, out_dir, run_id, observer)
    finally:
        ShardedStep.run = run


@worker_entry
def plan_diverging_train_worker(manifest: dict, model_d: dict, train_d: dict, comms_d: dict,
                                plan_d: dict, out_dir: str, run_id: str = "run",
                                observer=None) -> dict:
    """``sharded_train_worker`` whose rank 1 was handed another plan of the same tables
    (``out_dir/other_plan.json``), as a host of another CPU may plan when a job replans."""
    import inspect
    import json

    from recscale.train import rank

    if os.environ["RANK"] == "1":
        with open(os.path.join(out_dir, "other_plan.json")) as f:
            plan_d = json.load(f)
    return inspect.unwrap(rank.sharded_train_worker)(manifest, model_d, train_d, comms_d,
                                                        plan_d, out_dir, run_id, observer)
