"""DistributedDataParallel communication hooks for the dense gradients, counting their bytes.

``counting_allreduce_hook``: torch's hook for the precision (plain, fp16- or bf16-compressed
all-reduce over all ranks). ``hierarchical_allreduce_hook``: the same average in three steps,
so that only 1/local_world_size of each bucket crosses hosts: reduce-scatter inside the host,
all-reduce of each rank's slice among its peers (the ranks of the same local rank on every host),
all-gather inside the host. Bytes are those handed to each collective, in the wire precision;
the flat all-reduce counts as inter-host when its group spans hosts.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from recscale.comm.collectives import CommStats

_TORCH_HOOKS = {
    "fp32": (default_hooks.allreduce_hook, 4),
    "fp16": (default_hooks.fp16_compress_hook, 2),
    "bf16": (default_hooks.bf16_compress_hook, 2),
}
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# torch 2.13 names the single-tensor collectives *_single and warns (FutureWarning, once per rank
# and call) on the old names, which an earlier torch has alone
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def counting_allreduce_hook(stats: CommStats, precision: str, spans_hosts: bool = False):
    """torch's DDP communication hook for ``precision``, with the bytes each bucket hands to the
    all-reduce counted (inter-host when ``spans_hosts``)."""
    torch_hook, wire_bytes = _TORCH_HOOKS[precision]

    def hook(process_group, bucket):
        n = bucket.buffer().numel() * wire_bytes
        stats.add("dense_allreduce", n, 0.0, n if spans_hosts else 0)
        return torch_hook(process_group, bucket)

    return hook


def hierarchical_allreduce_hook(stats: CommStats, precision: str, host_group, peer_group,
                                local_world_size: int, world_size: int):
    """A DDP hook averaging each bucket over ``world_size`` ranks: reduce-scatter in
    ``host_group``, all-reduce in ``peer_group``, all-gather in ``host_group`` (groups from
    ``make_host_groups``; None: that step is this rank alone and is skipped). The wire precision
    is ``precision`` throughout; the bucket is divided by the world size before it is reduced,
    like torch's hooks."""
    dtype = _DTYPES[precision]
    L = local_world_size

    def hook(_process_group, bucket):
        buf = bucket.buffer()
        n = buf.numel()
        t = buf.to(dtype).div_(world_size)
        chunk = -(-n // L)
        full = t.new_zeros(chunk * L)
        full[:n] = t
        size = full.element_size()
        if host_group is not None:
            part = full.new_empty(chunk)
            _REDUCE_SCATTER(part, full, group=host_group)
            stats.add("dense_reduce_scatter", full.numel() * size, 0.0, 0)
        else:
            part = full
        if peer_group is not None:
            dist.all_reduce(part, group=peer_group)
            stats.add("dense_allreduce", part.numel() * size, 0.0, part.numel() * size)
        if host_group is not None:
            _ALL_GATHER(full, part, group=host_group)
            stats.add("dense_all_gather", part.numel() * size, 0.0, 0)
        buf.copy_(full[:n])
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut

    return hook
