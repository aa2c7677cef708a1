"""The collectives between a host's ranks (gloo all-to-all and all-reduce of several sizes) and
the sharded runtime's own embedding exchange (forward + backward), inside a process group: what
the machine's measurement fits the links and the exchange's work to (``link.py`` runs the same
across hosts)."""

from __future__ import annotations

import time

import torch

from recscale.data.batch import SparseFeatures
from recscale.measure.config import CalibrationConfig
from recscale.measure.timing import median_time
from recscale.sharding import Topology


# --- collectives -------------------------------------------------------------------------------------
def measure_comms(sizes, reps, collectives=("all_to_all", "all_reduce")) -> list[dict]:
    """Inside the group: all-to-all and all-reduce of each size (the slowest rank's time)."""
    import torch.distributed as dist

    out = []
    W = dist.get_world_size()
    for nbytes in sizes:
        n = max(nbytes // 4, W)
        n -= n % W
        x = torch.randn(n)
        y = torch.empty_like(x)
        for name, fn in (("all_to_all", lambda x=x, y=y: dist.all_to_all_single(y, x)),
                         ("all_reduce", lambda y=y: dist.all_reduce(y))):
            if name not in collectives:
                continue
            dist.barrier()
            t = torch.tensor([median_time(lambda i, fn=fn: fn(), reps)])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            out.append({"collective": name, "bytes": n * 4, "seconds": float(t)})
    return out


def measure_exchange(ctx, cfg: CalibrationConfig, tables: int, gap_s: float = 0.0,
                      extra_dims: tuple[int, ...] = ()) -> list[dict]:
    """The sharded runtime's own embedding exchange (table-wise shards over the host's ranks,
    forward + backward): per step, seconds, the collectives' seconds as ``CommStats`` counts them
    (what a training run reports as communication), calls and bytes sent, in all and per
    collective (``by_call``: name -> [calls per step, bytes per call]). ``gap_s``: a pause before
    the forward and before the backward (not counted in ``seconds``); ``extra_dims``: dims
    measured besides the config's (fp32)."""
    from recscale.comm import CommsConfig
    from recscale.comm.collectives import CommStats
    from recscale.embedding.sharded import ShardedEmbeddingCollection
    from recscale.embedding.tbe import EmbeddingOptimizerConfig
    from recscale.sharding import TableSpec, plan_sharding

    W, B = ctx.world_size, max(cfg.batch_sizes)
    T = max(tables, 2)  # the run's tables: its messages are the size a step sends
    names = tuple(f"f{i}" for i in range(T))
    out = []
    g = torch.Generator().manual_seed(ctx.rank)
    # every dim and their mean in fp32 (16 and 128 too when fewer than three), the widest again
    # in fp16 (the
    # codecs' cost); each point over 3 x reps steps (the steps are short)
    dims = sorted({*cfg.dims, 4 * round(sum(cfg.dims) / len(cfg.dims) / 4)})
    if len(dims) < 3:  # a fixed and a per-byte cost need sizes apart
        dims = sorted({*dims, 16, 128})
    dims = sorted({*dims, *extra_dims})
    reps = max(3 * cfg.reps, 7)
    for d, prec in [(d, "fp32") for d in dims] + [(max(dims), "fp16")]:
        comms = CommsConfig(forward=prec, backward=prec)
        tables = [TableSpec(f"t{i}", cfg.rows, d, 1.0, feature_names=(names[i],),
                            constraints={"sharding_types": ["table_wise"]}) for i in range(T)]
        plan = plan_sharding(tables, Topology.preset("cpu-local", world_size=W,
                                                     local_world_size=W), B,
                             optimizer=cfg.optimizer, comms=comms)
        stats = CommStats()
        emb = ShardedEmbeddingCollection(plan, names, EmbeddingOptimizerConfig(name=cfg.optimizer),
                                         ctx.rank, W, group=ctx.sparse_group, stats=stats,
                                         comms=comms)
        batches = [SparseFeatures(names, torch.randint(0, cfg.rows, (T * B,), generator=g),
                                  torch.ones(T, B, dtype=torch.int64))
                   for _ in range(reps + 1)]
        marks = []

        def step(i, emb=emb, batches=batches, stats=stats, marks=marks):
            if i == 0:
                marks.append((stats.total_seconds, sum(stats.calls.values()),
                              sum(stats.bytes_sent.values()), dict(stats.calls),
                              dict(stats.bytes_sent)))
            if gap_s:
                time.sleep(gap_s)
            out = emb(batches[i + 1])
            if gap_s:
                time.sleep(gap_s)
            out.sum().backward()

        t = max(median_time(step, reps) - 2 * gap_s, 0.0)
        s0, c0, b0, calls0, bytes0 = marks[0]
        n = reps
        by_call = {}
        for name, calls in stats.calls.items():
            k = calls - calls0.get(name, 0)
            if k:
                by_call[name] = [k / n, (stats.bytes_sent[name] - bytes0.get(name, 0)) / k]
        # the ids this rank looks up: its T / W tables for the global batch
        # uniform ids: a table's owner sees W x B of them, distinct in expectation as below
        distinct = T / W * cfg.rows * (1.0 - (1.0 - 1.0 / cfg.rows) ** (W * B))
        out.append({"dim": d, "precision": prec, "batch": B, "tables": T, "seconds": t,
                    "distinct": distinct,
                    "comm_seconds": (stats.total_seconds - s0) / n,
                    "calls": (sum(stats.calls.values()) - c0) / n,
                    "bytes": (sum(stats.bytes_sent.values()) - b0) / n, "by_call": by_call})
        emb.close()
        del emb
    return out
