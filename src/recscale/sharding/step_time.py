"""The step the trainer runs, predicted from a plan: per rank, compute and exposed communication.

The planner balances the embedding part (``ShardSpec.compute_cost`` / ``comms_cost``: the
bandwidth terms, and on a calibrated topology the per-item costs it measured, ``*_id_s``,
``*_row_s``, ``bag_s``). A training step also has fixed costs that calibration measures
(``Topology.*_op_s``, the collectives' latency), the dense arch (bottom
MLP, interaction, top MLP: forward + backward at ``Topology.dense_flops``, the interaction at
``interaction_s`` per element where calibrated, plus ``dense_op_s`` for the loss and the
optimizer step) and its gradient all-reduce, and the overlap
the runtime performs (``recscale.train.overlap``, ``train.pipeline: true``):

- the next batch's input distribution (ids and lengths all-to-alls) is started while this batch
  computes: the ids' all-to-all (its bytes and latency) is exposed only where it takes longer
  than the step's compute, except on a rank with a shard behind a slow tier's cache, which waits
  for the ids at once to name them to the cache (prefetch);
- the output exchange (pooled vectors) runs while the bottom MLP computes its forward: exposed
  only where it is longer than that.

The exchange also works on the rank's own cores (bucketing ids, packing, codecs, summing partial
rows; on a CPU gloo's copies too): ``Topology.exchange_op_s`` + bytes sent / ``exchange_bw``
count as compute, overlapped or not, and so does a reduced-precision codec's work
(``Topology.codec_s`` per element encoded or decoded), and across hosts the network stack's
(``Topology.inter_node_cpu_s`` a step, ``inter_node_cpu_bw``). A link with a rate limiter's burst
(``Topology.inter_node_burst_bytes``) sends each collective's first bytes across hosts without
waiting for its rate.

Where the runtime differs from what the planner balances, the prediction follows the runtime: a
data-parallel replica looks up the global batch (ids gathered from every rank, output gradients
exchanged after; not a local lookup + an all-reduce of the table), and the collection assembles
its pieces into the [batch, tables x dim] output once per step (``Topology.assemble_s``
per element; one process only where its tables sit in more than one tier). The update work of a
table counts its distinct ids (``TablePlan.distinct_fraction``, measured in the data): their bytes,
and ``Topology.<tier>_row_s`` each (the fused backward's sorting and per-row work).

Communication is what the runtime's ``CommStats`` measures: the embedding collectives' issue and
wait time, which includes waiting for a slower rank. So the step is the slowest rank's compute +
its exposed communication, and every other rank's communication is that step minus its compute.
DDP's gradient all-reduce (gloo: overlapped with the backward, not in ``CommStats``) counts as
compute. Without calibration the fixed costs are 0 and dense compute runs at an assumed rate
(``DEFAULT_DENSE_FLOPS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from recscale.config import check

from .cost import CostModel
from .plan import ShardingPlan
from .topology import Topology
from .types import PRECISION_BYTES, SHARDING_TYPES, TIERS

# dense FLOP/s assumed for an uncalibrated topology (forward + backward of fp32 MLPs): a few
# cores' worth on a CPU; a fraction of an A100's TF32 peak on CUDA. Assumptions, not measurements.
DEFAULT_DENSE_FLOPS = {"cpu": 2e10, "cuda": 5e13}
# collectives per step of the embedding exchange: ids, lengths, pooled vectors, their gradients
CALLS_PER_STEP = 4


@dataclass(frozen=True)
class DenseSpec:
    """The dense arch as the prediction needs it: forward FLOPs per sample (all of it and the
    bottom MLP's), and the parameters DDP all-reduces; the interaction's own share:
    ``interaction_flops_per_sample`` (part of ``flops_per_sample``) and
    ``interaction_per_sample``, the elements it works on per sample (the dot's F x F x d
    multiply-adds; cat's and the cross net's F x d concatenated values), which a calibrated
    topology costs at ``Topology.interaction_s`` each instead of at the MLPs' FLOP rate: small
    batched products and copies run far below it."""

    flops_per_sample: float
    bottom_flops_per_sample: float
    params: int
    interaction_flops_per_sample: float = 0.0
    interaction_per_sample: float = 0.0

    @classmethod
    def mlps(cls, num_dense: int, bottom: Sequence[int], top_in: int, top: Sequence[int],
             interaction_flops: float = 0.0, interaction_elements: float = 0.0,
             extra_flops: float = 0.0, extra_params: int = 0) -> DenseSpec:
        """Bottom MLP ``num_dense -> bottom``, top MLP ``top_in -> top``; the interaction's
        forward FLOPs and elements per sample; ``extra_*``: other layers (a cross net)."""
        def layers(d_in, widths):
            f = p = 0
            for w in widths:
                f += 2 * d_in * w
                p += d_in * w + w
                d_in = w
            return f, p

        bf, bp = layers(num_dense, bottom)
        tf, tp = layers(top_in, top)
        return cls(float(bf + tf + interaction_flops + extra_flops), float(bf),
                   int(bp + tp + extra_params), float(interaction_flops),
                   float(interaction_elements))

    def seconds(self, batch: float, topology: Topology, flops: float) -> float:
        """Forward + backward (2x) of ``batch`` samples at ``flops`` FLOP/s, the interaction at
        the topology's ``interaction_s`` where calibrated."""
        if topology.interaction_s > 0:
            mlp = self.flops_per_sample - self.interaction_flops_per_sample
            return batch * (3 * mlp / flops + self.interaction_per_sample * topology.interaction_s)
        return 3 * batch * self.flops_per_sample / flops


@dataclass(frozen=True)
class StepPrediction:
    """Seconds per step, per rank: ``compute`` (embeddings + dense), ``comm`` (exposed embedding
    communication, waiting for the slowest rank included), ``step`` (the same for every rank);
    ``parts``: the terms behind them, per rank (for the report)."""

    compute: tuple[float, ...]
    comm: tuple[float, ...]
    step: float
    parts: dict[str, tuple[float, ...]]


def _shard_costs(cm: CostModel, tp, s) -> tuple[float, float]:
    """(compute, comms) seconds of one shard of table plan ``tp`` under ``cm``'s topology (a
    data-parallel replica's exchange is costed by the caller)."""
    kind = SHARDING_TYPES.index(tp.sharding_type)
    k = len(tp.shards) if tp.sharding_type != "data_parallel" else 1
    c = cm.shards(kind, tp.num_embeddings, tp.pooling_factor, len(tp.feature_names),
                  s.row_length, s.col_length, k, TIERS.index(s.tier), s.cache_fraction,
                  tp.distinct_fraction)
    return float(c.compute), float(c.comms)


def _prefetches(tier: str, topo: Topology) -> bool:
    """Whether the runtime holds a shard of ``tier`` behind its software cache, which prefetches
    the next batch's rows (``embedding.placement.placement_for``: below the compute tier, except
    DDR on CUDA, which is fbgemm's managed cache)."""
    return tier != topo.compute_tier and not (topo.device == "cuda" and tier == "ddr")


def _assembly_passes(plan: ShardingPlan, tiers_on: list[set[str]]) -> np.ndarray:
    """Per rank, how many times the collection places pieces into the [B, tables x dim] output
    (``embedding.columns.place_columns``): the sharded collection once per step, whatever kinds
    of piece it receives; one process, once where its tables sit in more than one tier
    (``MultiTierEmbeddingBags``), else never (one fused module)."""
    if plan.world_size == 1:
        return np.array([float(len(tiers_on[0]) > 1)])
    return np.ones(plan.world_size)


def predict_step(plan: ShardingPlan, dense: DenseSpec | None = None, pipelined: bool = True,
                 topology: Topology | None = None) -> StepPrediction:
    """Per-rank step time of a run of ``plan`` (see the module docstring); ``topology``: cost
    the same shards on another description of the machine (e.g. the preset vs a calibrated one;
    same world size and hosts), default the plan's own."""
    topo = plan.topology if topology is None else topology
    if topology is not None:
        check(topo.world_size == plan.world_size and
              topo.local_world_size == plan.local_world_size, "topology.world_size",
              topo.world_size, f"the plan's {plan.world_size} ranks, "
              f"{plan.local_world_size} per host")
    W, B = topo.world_size, float(plan.batch_size_per_rank)
    cm = CostModel(topo, plan.batch_size_per_rank, plan.options)
    lat = topo.inter_node_lat_s if topo.num_hosts > 1 else topo.intra_node_lat_s
    f_share = (cm.fb + cm.f_extra) / max(cm.fb + cm.bb + cm.f_extra + cm.b_extra, 1e-12)
    emb = np.zeros(W)
    xbytes = np.zeros(W)  # bytes the rank sends in the exchange (input, output, gradients)
    # elements a reduced-precision codec encodes + decodes on the rank (both directions; the
    # rank's own block too: it travels through the codec like the others)
    coded = float(cm.fb < 4) + float(cm.bb < 4)
    xcodec = np.zeros(W)
    inp = np.zeros(W)
    out_fwd = np.zeros(W)
    out_bwd = np.zeros(W)
    tiers_on: list[set[str]] = [set() for _ in range(W)]
    # a rank's own shards: a lookup module per tier when they sit in more than one, whose
    # outputs (global batch x their columns) are placed together before the exchange
    local_tiers: list[set[str]] = [set() for _ in range(W)]
    local_cols = np.zeros(W)
    for tp in plan.tables:
        F = float(len(tp.feature_names))
        L = float(tp.pooling_factor)
        N = float(tp.num_embeddings)
        dp = tp.sharding_type == "data_parallel"
        for s in tp.shards:
            r = s.rank
            tiers_on[r].add(s.tier)
            if not dp:
                local_tiers[r].add(s.tier)
                local_cols[r] += F * s.col_length
            # the planner's costs (a replica's as the runtime runs it: lookups and the fused
            # update of the global batch), or the same shard's on another topology
            compute_s, comms_s = ((s.compute_cost, s.comms_cost) if topology is None
                                  else _shard_costs(cm, tp, s))
            vec = B * W * F  # pooled vectors of the global batch (every replica's too)
            ids = vec * L if dp else vec * L * s.row_length / N
            emb[r] += compute_s  # the per-item costs calibration measured included
            remote = (W - 1) / W
            if dp:  # ids gathered from every rank before, output gradients after
                if W > 1:
                    inp[r] += (ids * cm.ib + vec * 4) * cm.a2a
                    out_bwd[r] += vec * s.col_length * cm.bb * cm.a2a
                    xbytes[r] += remote * (ids * cm.ib + vec * 4 + vec * s.col_length * cm.bb)
                    # its own rows' gradients encoded once, every rank's decoded
                    xcodec[r] += float(cm.bb < 4) * (1 + 1 / W) * vec * s.col_length
                continue
            i = (ids * cm.ib + vec * 4) * cm.a2a
            xbytes[r] += remote * (ids * cm.ib + vec * 4 + vec * (
                s.col_length * (cm.fb + cm.bb) + cm.f_extra + cm.b_extra))
            xcodec[r] += 2 * coded * vec * s.col_length
            inp[r] += min(i, comms_s)
            rest = comms_s - min(i, comms_s)
            out_fwd[r] += rest * f_share
            out_bwd[r] += rest * (1 - f_share)
    for r in range(W):
        emb[r] += sum(topo.op_seconds(t) for t in tiers_on[r])
    emb += _assembly_passes(plan, tiers_on) * B * sum(
        len(tp.feature_names) * tp.embedding_dim for tp in plan.tables) * topo.assemble_s
    if W > 1:
        multi = np.array([float(len(t) > 1) for t in local_tiers])
        emb += multi * B * W * local_cols * topo.assemble_s
    if W > 1 and xbytes.any():
        emb += topo.exchange_op_s + (xbytes / topo.exchange_bw if topo.exchange_bw else 0.0)
        emb += xcodec * topo.codec_s
        if topo.num_hosts > 1:
            # exchanging with ranks on other hosts costs the host's network stack too: per step
            # and per byte of the share sent to them
            across = (W - topo.local_world_size) / (W - 1)
            emb += topo.inter_node_cpu_s + (xbytes * across / topo.inter_node_cpu_bw
                                            if topo.inter_node_cpu_bw else 0.0)
    flops = topo.dense_flops or DEFAULT_DENSE_FLOPS.get(topo.device, 2e10)
    d_fb = d_bottom = d_ar = 0.0
    if dense is not None:
        d_fb = dense.seconds(B, topo, flops)
        d_bottom = B * dense.bottom_flops_per_sample / flops
        if W > 1:
            db = PRECISION_BYTES[plan.options.comms.dense_allreduce]
            d_ar = 2 * (W - 1) / W * dense.params * db * cm.a2a * W / max(W - 1, 1) + lat
    if topo.num_hosts > 1 and topo.inter_node_burst_bytes > 0 and W > 1:
        # a rate limiter's burst (a token bucket refilled while the step computes): each
        # collective's first bytes across hosts do not wait for inter_node_bw. The share of an
        # even all-to-all's seconds spent on the bytes across hosts, then at most the burst's
        # seconds off each phase (the ids' and lengths' calls counted as one)
        across = ((W - topo.local_world_size) / W / cm.inter) / cm.a2a
        credit = topo.inter_node_burst_bytes / cm.inter
        inp, out_fwd, out_bwd = (x - np.minimum(x * across, credit) for x in (inp, out_fwd,
                                                                            out_bwd))
        if d_ar:
            d_ar -= min((d_ar - lat) * across, credit)
    dense_s = d_fb + topo.dense_op_s + d_ar  # forward + backward + fixed + all-reduce
    compute = emb + dense_s
    # each collective's latency; the ids' all-to-all's is the input distribution's, overlapped
    # with it (the lengths' count exchange is waited for as it is sent)
    calls = CALLS_PER_STEP * lat if W > 1 and any(
        t.sharding_type != "data_parallel" for t in plan.tables) else 0.0
    in_call = inp + calls / CALLS_PER_STEP
    calls -= calls / CALLS_PER_STEP
    if pipelined:
        # a rank with a shard behind a slow tier's cache names the next batch's ids to it as
        # soon as they are sent (``OverlapPolicy.ahead`` -> ``prefetch``): it waits for them then
        prefetching = np.array([any(_prefetches(t, topo) for t in ts) for ts in local_tiers])
        exposed_in = np.where(prefetching, in_call, np.maximum(in_call - compute, 0.0))
        exposed_out = np.maximum(out_fwd - 2 * d_bottom, 0.0)  # bottom forward (+ its backward)
    else:
        exposed_in, exposed_out = in_call, out_fwd
    comm_own = exposed_in + exposed_out + out_bwd + calls
    step = float(np.max(compute + comm_own))
    comm = step - compute
    parts = {"embedding": emb, "dense": np.full(W, dense_s), "input": inp, "output": out_fwd,
             "output_grad": out_bwd, "exposed": comm_own}
    return StepPrediction(tuple(float(x) for x in compute), tuple(float(x) for x in comm), step,
                          {k: tuple(float(x) for x in v) for k, v in parts.items()})
