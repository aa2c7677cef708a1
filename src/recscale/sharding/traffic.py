"""Bytes the plan's embedding collectives should move per iteration, from the cost model's terms.

The planner costs communication in seconds; this gives the byte counts behind those seconds so a
run can compare them with the bytes its collective wrappers actually counted. Bytes are what
leaves each rank for other ranks (a rank's traffic to itself is free), split into intra-host and
inter-host by the plan's topology (``local_world_size``), for the exchanges as the runtime builds
them: flat all-to-alls for table_wise / row_wise / column_wise, and for the host-bound types
(table_row_wise / table_column_wise) the two-stage exchange of ``recscale.embedding.hierarchical``
(ids cross hosts once per (sample host, owning host) and are spread inside the owning host;
pooled vectors are reduced or assembled inside the owning host and cross hosts once per sample).
Estimates assume every rank has ``batch_size_per_rank`` samples and ``pooling_factor`` ids per
sample and feature, spread over row blocks in proportion to their rows.
"""

from __future__ import annotations

from .plan import ShardingPlan
from .types import PRECISION_BYTES

HIER_TYPES = ("table_row_wise", "table_column_wise")
KEYS = ("input", "output", "output_grad", "dp_input", "dp_output_grad")


def estimate_comm_bytes(plan: ShardingPlan, lengths_bytes: int = 4) -> dict[str, float]:
    """-> {"input": ids + lengths, "output": pooled forward, "output_grad": backward,
    "dp_input" / "dp_output_grad": the replicated tables' exchanges, "total": the sum}, summed over
    all ranks; and the split of each into ``<key>.intra_host`` / ``<key>.inter_host``, with totals
    ``intra_host`` and ``inter_host``. Replicated (data-parallel) tables are served as the runtime
    serves them: every rank sends its ids and lengths of all of them to every other rank (each
    replica looks up the global batch), and after the backward its rows of their output gradient
    (one row of all their columns per sample, in the backward wire precision), so that every
    replica applies the same full-batch update; no table is all-reduced."""
    W, L = plan.world_size, plan.local_world_size
    H = W // L
    B = float(plan.batch_size_per_rank)
    opts = plan.options
    fb = PRECISION_BYTES[opts.comms.forward]
    bb = PRECISION_BYTES[opts.comms.backward]
    ib = opts.index_bytes
    lb = lengths_bytes
    intra = {k: 0.0 for k in KEYS}
    inter = {k: 0.0 for k in KEYS}
    total = {k: 0.0 for k in KEYS}

    def add(key: str, n_intra: float, n_inter: float, whole: float | None = None) -> None:
        total[key] += n_intra + n_inter if whole is None else whole
        intra[key] += n_intra
        inter[key] += n_inter

    dp_cols = 0  # the replicated tables' output columns: their gradient rows travel together
    for tp in plan.tables:
        F = len(tp.feature_names)
        P = tp.pooling_factor
        if tp.sharding_type == "data_parallel":
            n = W * (W - 1) * F * B * (lb + P * ib)  # every rank's to every other rank
            near = (L - 1) / (W - 1) if W > 1 else 0.0
            add("dp_input", n * near, n - n * near, n)
            dp_cols += F * tp.embedding_dim
            continue
        if tp.sharding_type in HIER_TYPES and H > 1:  # on one host the two stages are flat
            # stage A / A': every rank off the owning host, once per table
            add("input", 0.0, (W - L) * F * B * (lb + P * ib))
            add("output", 0.0, (W - L) * F * B * tp.embedding_dim * fb)
            add("output_grad", 0.0, (W - L) * F * B * tp.embedding_dim * bb)
            for s in tp.shards:  # stage B / B': the other L - 1 intermediates of the host
                vec = (L - 1) * H * B * F
                add("input", vec * (lb + P * ib * s.row_length / tp.num_embeddings), 0.0)
                add("output", vec * s.col_length * fb, 0.0)
                add("output_grad", vec * s.col_length * bb, 0.0)
            continue
        remote = (W - 1) / W  # share of the global batch that comes from other ranks
        near = (L - 1) / (W - 1) if W > 1 else 0.0  # of those, the share from the shard's host
        for s in tp.shards:
            vec = B * W * F  # pooled vectors of the global batch this shard serves
            lookups = vec * tp.pooling_factor * s.row_length / tp.num_embeddings
            for key, n in (("input", remote * (lookups * ib + vec * lb)),
                           ("output", remote * vec * s.col_length * fb),
                           ("output_grad", remote * vec * s.col_length * bb)):
                add(key, n * near, n - n * near, n)
    if dp_cols and W > 1:
        row = dp_cols * bb + (8.0 if opts.comms.backward == "int8" else 0.0)  # + scale, bias
        n = W * (W - 1) * B * row
        near = (L - 1) / (W - 1)
        add("dp_output_grad", n * near, n - n * near, n)
    out: dict[str, float] = {k: total[k] for k in KEYS}
    out["total"] = sum(out.values())
    for k in KEYS:
        out[f"{k}.intra_host"] = intra[k]
        out[f"{k}.inter_host"] = inter[k]
    out["intra_host"] = sum(intra.values())
    out["inter_host"] = sum(inter.values())
    return out
