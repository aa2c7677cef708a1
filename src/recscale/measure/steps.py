"""The training step itself, on one host's ranks and across the link between hosts, for the
calibration of the exchange's work and of the link.

The exchange alone (``comms.measure_exchange``) times the link while nothing else
runs, so the work a transfer does on the hosts' own cores (the network stack's copies and
interrupts, gloo's threads) hides inside its own wait. A training step overlaps transfers with
compute (the next batch's input distribution, DDP's gradient all-reduce in the backward), and
where the cores are busy that work slows the compute instead: on two namespace hosts sharing
two cores the host jobs' compute ran about 4-8 ms a step over the same job's on one host, where the
exchange-alone fit had found 0.1-1.3 ms. So the link's CPU cost (``Topology.inter_node_cpu_s``
a step, ``inter_node_cpu_bw``) is fitted on the runtime's own step: the loop, the sharded
runtime and the pipelined policy a run uses, on synthetic batches, against the step
``predict_step`` gives for the same plan on the host's calibration with the link measured and
no CPU cost (``recscale.sharding.cost_fit.fit_link_steps``).

The same steps correct the link's rate. The exchange alone across two namespace hosts moved
0.58-0.66 GB/s a rank, and the host jobs' communication came out 1.4-1.6x under what that rate
predicts (on one host the same prediction matched the 2-rank jobs' steps). So
each point also carries the step's measured communication and the prediction at link rates
``RATE_FACTORS`` x the measured one; ``recscale.sharding.cost_fit.fit_link_rate`` picks the factor whose
communication matches, and the CPU cost is fitted against the prediction at that rate.

On one host (``measure_host_steps``, in a calibration of 2 or more ranks a host) the same steps
correct the exchange's work on the ranks' cores (``exchange_bw``). The exchange alone measures
it with the ranks in lock-step and nothing to overlap; the runtime's steps on two ranks of the
2-vCPU machine came out 2.5-5.5% under their prediction at dim 128 (about on it at dim 16), in
three calibrations. ``recscale.sharding.cost_fit.fit_exchange_work`` picks the factor of ``RATE_FACTORS``
for ``exchange_bw`` whose predicted steps match (``predict_host_steps`` predicts them again on
any topology of the host, so a merge of calibrations refits it on its own constants)."""

from __future__ import annotations

import gc
import statistics
from dataclasses import replace

import torch

from recscale.comm import CommsConfig
from recscale.config import parse, to_dict
from recscale.data.batch import Batch, SparseFeatures
from recscale.measure.config import CalibrationConfig, dense_inputs, preset_shape
from recscale.model import ModelConfig, dense_model, dense_spec
from recscale.report import steady_per_step
from recscale.runconfig import TrainConfig
from recscale.sharding import TableSpec, Topology, plan_sharding
from recscale.sharding.step_time import predict_step
from recscale.train.loop import EpochData, run_loop
from recscale.train.runtime import ShardedRuntime

STEPS = 12  # per point; the loop's warm-up steps (result.WARMUP_STEPS) are left out
# the link rates each point is also predicted at, as factors of the measured one: 1/4 to 4
RATE_FACTORS = tuple(2.0 ** (k / 8) for k in range(-16, 17))


def measure_link_steps(ctx, cfg: CalibrationConfig, model_cfg: ModelConfig, tables: int,
                       topo: Topology) -> list[dict]:
    """Per dim of ``cfg.dims`` (each the median of ``cfg.rounds`` runs of ``STEPS`` steps, dims
    interleaved): the slowest rank's step after the warm-up (``seconds``) and the most
    communication a rank counted in it (``comm``), the step ``predict_step`` gives on ``topo``
    (``predicted``; its ``inter_node_cpu_*`` are set to 0), the same with ``topo``'s
    ``inter_node_bw`` x each of ``RATE_FACTORS`` (``predicted_by_rate``, ``comm_by_rate``: the
    most communication of a rank) and the most bytes a rank sent to other hosts a step
    (``bytes_across``). Table-wise shards
    of ``tables`` tables of ``cfg.rows`` rows, ``model_cfg``'s dense arch at each dim (DDP), the
    batch ``max(cfg.batch_sizes)`` per rank. Inside the process group of ``ctx`` (one rank per
    host)."""
    B, T = max(cfg.batch_sizes), max(tables, 2)
    topo = replace(topo, inter_node_cpu_s=0.0, inter_node_cpu_bw=0.0)
    train_cfg = _train_config(ctx, cfg)
    plans, predicted = {}, {}  # per dim: the dense arch, the plan, and the step predicted
    for d in cfg.dims:
        mcfg, plan = step_plan(model_cfg, d, T, cfg.rows, B, cfg.optimizer, topo)
        plans[d] = (mcfg, plan)
        at = at_factors(plan, dense_spec(mcfg, T, dense_inputs(cfg)), train_cfg.pipeline, topo,
                        "inter_node_bw")
        predicted[d] = (at[RATE_FACTORS.index(1.0)].step,  # at the link's measured rate
                        [p.step for p in at], [max(p.comm) for p in at])
    got = _run_steps(ctx, cfg, train_cfg, plans, T)
    return [{"dim": d, "batch": B, "tables": T, "predicted": predicted[d][0],
             "seconds": statistics.median(x[0] for x in got[d]),
             "comm": statistics.median(x[1] for x in got[d]),
             "bytes_across": statistics.median(x[2] for x in got[d]),
             "rate_factors": list(RATE_FACTORS), "predicted_by_rate": predicted[d][1],
             "comm_by_rate": predicted[d][2]} for d in cfg.dims]


def measure_host_steps(ctx, cfg: CalibrationConfig, model_cfg: ModelConfig,
                       tables: int) -> list[dict]:
    """The same steps on one host's ranks (``ctx``: the host's group; the plan on the
    ``cpu-local`` preset of its ranks, whose table-wise shards do not depend on the costs): per
    dim of ``cfg.dims``, the slowest rank's step (``seconds``) and communication (``comm``),
    each the median of ``cfg.rounds`` runs, and what ``predict_host_steps`` needs to predict
    them again on any topology of the host (a merge of calibrations predicts the median step on
    the merged fit)."""
    B, T = max(cfg.batch_sizes), max(tables, 2)
    preset = Topology.preset("cpu-local", world_size=ctx.world_size,
                             local_world_size=ctx.world_size)
    plans = {d: step_plan(model_cfg, d, T, cfg.rows, B, cfg.optimizer, preset)
             for d in cfg.dims}
    got = _run_steps(ctx, cfg, _train_config(ctx, cfg), plans, T)
    return [{"dim": d, "batch": B, "tables": T, "rows": cfg.rows, "ranks": ctx.world_size,
             "optimizer": cfg.optimizer, "num_dense": dense_inputs(cfg),
             "seconds": statistics.median(x[0] for x in got[d]),
             "comm": statistics.median(x[1] for x in got[d]),
             "model": to_dict(model_cfg)} for d in cfg.dims]


def predict_host_steps(pts: list[dict], topo: Topology,
                       factors: tuple[float, ...] = RATE_FACTORS) -> list[dict]:
    """``measure_host_steps`` points with the step ``predict_step`` gives on ``topo`` with its
    ``exchange_bw`` (the exchange's work on the ranks' cores per byte) x each of ``factors``
    (``rate_factors``, ``predicted_by_rate``; ``predicted``: at ``topo``'s own, a factor of 1)
    and the communication at ``topo``'s own (``predicted_comm``)."""
    out = []
    for p in pts:
        ranks = int(p["ranks"])
        preset = Topology.preset("cpu-local", world_size=ranks, local_world_size=ranks)
        mcfg, plan = step_plan(parse(ModelConfig, p["model"], "model"), int(p["dim"]),
                               int(p["tables"]), int(p["rows"]), int(p["batch"]),
                               p["optimizer"], preset)
        # points kept from before they recorded their dense inputs: the Criteo preset's
        num_dense = int(p.get("num_dense", preset_shape()[0]))
        at = at_factors(plan, dense_spec(mcfg, int(p["tables"]), num_dense), True, topo,
                        "exchange_bw",
                        factors)
        one = at[factors.index(1.0)]
        out.append({**p, "rate_factors": list(factors),
                    "predicted_by_rate": [a.step for a in at], "predicted": one.step,
                    "predicted_comm": max(one.comm)})
    return out


def at_factors(plan, dense, pipelined: bool, topo: Topology, field: str,
               factors: tuple[float, ...] = RATE_FACTORS) -> list:
    """``predict_step`` of ``plan`` on ``topo`` with its constant ``field`` x each of
    ``factors`` (the grid a steps' fit picks from)."""
    value = getattr(topo, field)
    return [predict_step(plan, dense, pipelined, topology=replace(topo, **{field: value * f}))
            for f in factors]


def step_plan(model_cfg: ModelConfig, dim: int, tables: int, rows: int, batch: int,
              optimizer: str, topo: Topology):
    """(the dense arch at ``dim``, the plan) of the calibration's steps: ``tables`` tables of
    ``rows`` rows, table-wise shards over ``topo``'s ranks, ``batch`` samples per rank."""
    mcfg = dense_model(model_cfg, dim)
    specs = [TableSpec(f"t{i}", rows, dim, 1.0, feature_names=(f"f{i}",),
                       constraints={"sharding_types": ["table_wise"]}) for i in range(tables)]
    return mcfg, plan_sharding(specs, topo, batch, optimizer=optimizer, comms=CommsConfig())


def _train_config(ctx, cfg: CalibrationConfig):
    return parse(TrainConfig, {
        "batch_size_per_rank": max(cfg.batch_sizes), "max_steps": STEPS, "progress": "off",
        "log_every": 10 * STEPS, "num_threads": cfg.num_threads, "checkpoint": {"dir": None},
        "embedding_optimizer": {"name": cfg.optimizer},
        "launch": {"world_size": ctx.world_size}}, "train")


def _run_steps(ctx, cfg: CalibrationConfig, train_cfg, plans: dict, T: int
               ) -> dict[int, list[tuple[float, float, float]]]:
    """Per dim of ``plans`` (dim -> (dense arch, plan)), ``cfg.rounds`` runs of ``STEPS`` steps
    on synthetic batches (dims interleaved): per run the slowest rank's steady step, the most
    communication a rank counted in it and the most bytes a rank sent to other hosts."""
    import torch.distributed as dist

    B = max(cfg.batch_sizes)
    names = tuple(f"f{i}" for i in range(T))
    g = torch.Generator().manual_seed(1000 + ctx.rank)
    num_dense = dense_inputs(cfg)
    batches = [Batch(torch.randn(B, num_dense, generator=g),
                     SparseFeatures(names, torch.randint(0, cfg.rows, (T * B,), generator=g),
                                    torch.ones(T, B, dtype=torch.int64)),
                     torch.randint(0, 2, (B,), generator=g).float(),
                     torch.arange(i * B, (i + 1) * B))
               for i in range(STEPS)]
    got: dict[int, list[tuple[float, float, float]]] = {d: [] for d in plans}
    for _ in range(cfg.rounds):
        for d, (mcfg, plan) in plans.items():
            rt = ShardedRuntime(ctx, plan, mcfg, train_cfg, CommsConfig(), feature_names=names,
                                num_dense=num_dense)
            res = run_loop(rt, EpochData(lambda work=None: iter(batches), STEPS), train_cfg)
            rt.model.embeddings.close()
            del rt  # the DDP replica goes while the group is alive
            gc.collect()
            step = steady_per_step(res.step_seconds, res.warmup_seconds, res.steps,
                                   res.warmup_steps)
            comm = steady_per_step(res.comm_seconds, res.warmup_comm_seconds, res.steps,
                                   res.warmup_steps)
            mine = torch.tensor([step, comm, res.bytes_per_step.get("inter_host", 0.0)],
                                dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            got[d].append((float(mine[0]), float(mine[1]), float(mine[2])))
    return got
