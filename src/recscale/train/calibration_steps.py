"""The training step itself across the link between hosts, for the link's calibration.

The exchange alone (``calibration_comms._measure_exchange``) times the link while nothing else
runs, so the work a transfer does on the hosts' own cores (the network stack's copies and
interrupts, gloo's threads) hides inside its own wait. A training step overlaps transfers with
compute (the next batch's input distribution, DDP's gradient all-reduce in the backward), and
where the cores are busy that work slows the compute instead: on two namespace hosts sharing
two cores the host jobs' compute ran about 4-8 ms a step over the same job's on one host, where the
exchange-alone fit had found 0.1-1.3 ms. So the link's CPU cost (``Topology.inter_node_cpu_s``
a step, ``inter_node_cpu_bw``) is fitted on the runtime's own step: the loop, the sharded
runtime and the pipelined policy a run uses, on synthetic batches, against the step
``predict_step`` gives for the same plan on the host's calibration with the link measured and
no CPU cost (``calibration_fits.fit_link_steps``).

The same steps correct the link's rate. The exchange alone across two namespace hosts moved
0.58-0.66 GB/s a rank, and the host jobs' communication came out 1.4-1.6x under what that rate
predicts (on one host the same prediction matched the 2-rank jobs' steps). So
each point also carries the step's measured communication and the prediction at link rates
``RATE_FACTORS`` x the measured one; ``calibration_fits.fit_link_rate`` picks the factor whose
communication matches, and the CPU cost is fitted against the prediction at that rate."""

from __future__ import annotations

import gc
import statistics
from dataclasses import replace

import torch

from recscale.data.criteo import NUM_DENSE
from recscale.model import ModelConfig
from recscale.sharding import Topology
from recscale.train.calibration_config import CalibrationConfig

STEPS = 12  # per point; the loop's warm-up steps (loop.WARMUP_STEPS) are left out
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
    import torch.distributed as dist

    from recscale.comm import CommsConfig
    from recscale.config import parse
    from recscale.data.batch import Batch, SparseFeatures
    from recscale.sharding import TableSpec, plan_sharding
    from recscale.sharding.step_time import predict_step
    from recscale.train.calibrate import dense_model, dense_spec
    from recscale.train.config import TrainConfig
    from recscale.train.loop import EpochData, run_loop, steady_per_step
    from recscale.train.runtime import ShardedRuntime

    W, B, T = ctx.world_size, max(cfg.batch_sizes), max(tables, 2)
    topo = replace(topo, inter_node_cpu_s=0.0, inter_node_cpu_bw=0.0)
    names = tuple(f"f{i}" for i in range(T))
    g = torch.Generator().manual_seed(1000 + ctx.rank)
    batches = [Batch(torch.randn(B, NUM_DENSE, generator=g),
                     SparseFeatures(names, torch.randint(0, cfg.rows, (T * B,), generator=g),
                                    torch.ones(T, B, dtype=torch.int64)),
                     torch.randint(0, 2, (B,), generator=g).float(),
                     torch.arange(i * B, (i + 1) * B))
               for i in range(STEPS)]
    train_cfg = parse(TrainConfig, {
        "batch_size_per_rank": B, "max_steps": STEPS, "progress": "off", "log_every": 10 * STEPS,
        "num_threads": cfg.num_threads, "checkpoint": {"dir": None},
        "embedding_optimizer": {"name": cfg.optimizer}, "launch": {"world_size": W}}, "train")
    plans, predicted = {}, {}  # per dim: the dense arch, the plan, and the step predicted
    for d in cfg.dims:
        mcfg = dense_model(model_cfg, d)
        specs = [TableSpec(f"t{i}", cfg.rows, d, 1.0, feature_names=(names[i],),
                           constraints={"sharding_types": ["table_wise"]}) for i in range(T)]
        plans[d] = (mcfg, plan_sharding(specs, topo, B, optimizer=cfg.optimizer,
                                        comms=CommsConfig()))
        at = [predict_step(plans[d][1], dense_spec(mcfg, T), train_cfg.pipeline,
                           topology=replace(topo, inter_node_bw=topo.inter_node_bw * f))
              for f in RATE_FACTORS]
        predicted[d] = (at[RATE_FACTORS.index(1.0)].step,  # at the link's measured rate
                        [p.step for p in at], [max(p.comm) for p in at])
    got: dict[int, list[tuple[float, float, float]]] = {d: [] for d in cfg.dims}
    for _ in range(cfg.rounds):
        for d in cfg.dims:
            mcfg, plan = plans[d]
            rt = ShardedRuntime(ctx, plan, mcfg, train_cfg, CommsConfig(), feature_names=names,
                                num_dense=NUM_DENSE)
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
    return [{"dim": d, "batch": B, "tables": T, "predicted": predicted[d][0],
             "seconds": statistics.median(x[0] for x in got[d]),
             "comm": statistics.median(x[1] for x in got[d]),
             "bytes_across": statistics.median(x[2] for x in got[d]),
             "rate_factors": list(RATE_FACTORS), "predicted_by_rate": predicted[d][1],
             "comm_by_rate": predicted[d][2]} for d in cfg.dims]
