"""TorchRec's DLRM_DCN as a bench_train.py contender, where torchrec is importable.

torchrec is not a dependency. Its PyPI wheel is pure Python, but its requirements name the CUDA
build of fbgemm_gpu, which would replace fbgemm-gpu-cpu; install it beside ours without them:

    make torchrec        # pip install --no-deps torchrec==1.8.0 and its pure-Python requirements

The model is TorchRec's own ``DLRM_DCN`` (its DenseArch, LowRankCrossNet and OverArch) in
``DLRMTrain``, with the EmbeddingBagCollection sharded by ``DistributedModelParallel`` on a
one-rank gloo group: TorchRec's production path, fbgemm's fused TBE kernels with the optimizer
fused into backward (exact SGD here, as recscale's contender), the dense parameters under
``torch.optim.SGD``. ``precision="bf16"`` runs the dense part under CPU autocast, as a TorchRec
user would.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

import torch


def available() -> str | None:
    """None when torchrec imports here, else why not (one line)."""
    try:
        import torchrec  # noqa: F401
        from torchrec.models.dlrm import DLRM_DCN  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means "not measured"
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def _group():
    import torch.distributed as dist

    if not dist.is_initialized():
        # one rank, an in-memory store: no port, nothing to wait for
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def torchrec_step(cfg: dict, lr: float, precision: str = "fp32"):
    """-> (step(batch) -> loss, convert(recscale Batch) -> TorchRec Batch) for bench_train's
    ``cfg`` (tables, dim, bottom, top, dcn)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.datasets.utils import Batch as TRBatch
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.models.dlrm import DLRM_DCN, DLRMTrain
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    _group()
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    # TorchRec's planner and DDP wrapper talk a lot on construction; a benchmark prints results
    for name in ("torchrec", "torch.fx._symbolic_trace"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torchrec\.")
    torch.manual_seed(0)
    keys = [f"f{i}" for i in range(len(cfg["tables"]))]
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=f"t{i}", embedding_dim=cfg["dim"], num_embeddings=n,
                                   feature_names=[keys[i]])
                for i, n in enumerate(cfg["tables"])],
        device=torch.device("meta"))
    model = DLRMTrain(DLRM_DCN(
        embedding_bag_collection=ebc, dense_in_features=13,
        dense_arch_layer_sizes=list(cfg["bottom"]), over_arch_layer_sizes=list(cfg["top"]),
        dcn_num_layers=cfg["dcn"]["num_layers"], dcn_low_rank_dim=cfg["dcn"]["low_rank"],
        dense_device=torch.device("cpu")))
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": lr})
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), sharders=[sharder])
    # the tables update inside backward (fused); the rest is dense
    dense = [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]
    opt = torch.optim.SGD(dense, lr=lr)
    amp = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
           else contextlib.nullcontext())

    def convert(batch):
        sp = batch.sparse
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=sp.values,
                                                  lengths=sp.lengths.reshape(-1))
        return TRBatch(dense_features=batch.dense, sparse_features=kjt, labels=batch.labels)

    def step(tr_batch):
        with amp:
            loss, _ = dmp(tr_batch)
        opt.zero_grad(set_to_none=True)
        loss.float().backward()
        opt.step()
        return loss.detach()

    return step, convert
