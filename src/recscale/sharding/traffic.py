"""Bytes the plan's embedding collectives should move per iteration, from the cost model's terms.

The planner costs communication in seconds; this gives the byte counts behind those seconds so a
run can compare them with the bytes its collective wrappers actually counted. Bytes are what
leaves each rank for other ranks (a rank's traffic to itself is free).
"""

from __future__ import annotations

from .plan import ShardingPlan
from .types import PRECISION_BYTES


def estimate_comm_bytes(plan: ShardingPlan, lengths_bytes: int = 4) -> dict[str, float]:
    """-> {"input": ids + lengths, "output": pooled forward, "output_grad": backward,
    "dp_allreduce": replicated-table gradients, "total": the sum}, summed over all ranks."""
    W = plan.world_size
    B = float(plan.batch_size_per_rank)
    opts = plan.options
    fb = PRECISION_BYTES[opts.comms.forward]
    bb = PRECISION_BYTES[opts.comms.backward]
    db = PRECISION_BYTES[opts.comms.dense_allreduce]
    ib = opts.index_bytes
    remote = (W - 1) / W  # share of the global batch that comes from other ranks
    out = {"input": 0.0, "output": 0.0, "output_grad": 0.0, "dp_allreduce": 0.0}
    for tp in plan.tables:
        F = len(tp.feature_names)
        if tp.sharding_type == "data_parallel":
            out["dp_allreduce"] += 2 * (W - 1) / W * W * tp.num_embeddings * tp.embedding_dim * db
            continue
        for s in tp.shards:
            vec = B * W * F  # pooled vectors of the global batch this shard serves
            lookups = vec * tp.pooling_factor * s.row_length / tp.num_embeddings
            out["input"] += remote * (lookups * ib + vec * lengths_bytes)
            out["output"] += remote * vec * s.col_length * fb
            out["output_grad"] += remote * vec * s.col_length * bb
    out["total"] = sum(out.values())
    return out
