"""Hessian-free dense steps in the sharded runtime (2 gloo ranks) against one process: float64
dense arch, mixed sharding plan, the products all-reduced across ranks."""

import numpy as np
import pytest
import torch

from recscale.config import parse
from recscale.distributed import LaunchConfig, launch
from recscale.embedding import EmbeddingOptimizerConfig, FusedEmbeddingBags, table_init
from recscale.model import DLRM, ModelConfig
from recscale.train.hf_step import HessianFreeStep
from recscale.train.step import make_dense_optimizer
from tests.distributed import hf_dlrm_workers as H
from tests.distributed import workers as W

pytestmark = pytest.mark.dist

HF = {"curvature": "gn", "damping": 0.5, "cg_max_iters": 30}


@pytest.fixture(scope="module")
def steps():
    return W.make_global_batches(3, seed=8)


@pytest.fixture(scope="module")
def sharded(steps):
    res = launch(H.hf_sharded_worker, (steps, HF), LaunchConfig(world_size=2,
                                                               collective_timeout_s=60))
    return res


def single_process(steps):
    tcfg = H.train_config({"name": "hessian_free", "hf": HF})
    emb = FusedEmbeddingBags(list(W.ROWS), [W.DIM] * len(W.ROWS),
                             EmbeddingOptimizerConfig("exact_sgd", 0.2),
                             initial_weights=[table_init(3, t, r, W.DIM)
                                              for t, r in enumerate(W.ROWS)])
    model = DLRM(W.NUM_DENSE, len(W.ROWS), parse(ModelConfig, W.MODEL, "model"), emb, seed=3)
    model.dense.double()
    step = HessianFreeStep(model, make_dense_optimizer(model.dense_parameters(),
                                                       tcfg.dense_optimizer))
    for parts in steps:
        step(W.to_batch(W.concat_parts(parts)))
    return ([w.detach().numpy() for w in model.embeddings.split_weights()],
            {k: v.detach().numpy() for k, v in model.dense.state_dict().items()}, step.summary())


def test_two_rank_hf_equals_one_process_in_float64(sharded, steps):
    got = sharded[0]
    tables, dense, summary = single_process(steps)
    assert got["dense"]["top.0.weight"].dtype == np.float64
    for k in dense:
        np.testing.assert_allclose(got["dense"][k], dense[k], rtol=1e-5, atol=1e-8, err_msg=k)
    for t, (a, b) in enumerate(zip(got["tables"], tables)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"table {t}")
    # the same iterations on both sides, and the weights really moved
    assert got["summary"]["cg_iters"] == summary["cg_iters"] > 0
    init = DLRM(W.NUM_DENSE, 4, parse(ModelConfig, W.MODEL, "model"), torch.nn.Identity(), seed=3)
    assert not np.allclose(got["dense"]["top.0.weight"], init.dense.top[0].weight.detach())
    # every rank holds the same dense weights; the products went through the all-reduce
    np.testing.assert_array_equal(sharded[0]["dense_per_rank"][0], sharded[0]["dense_per_rank"][1])
    calls = got["bytes"]["dense_hf_allreduce"]
    assert calls["bytes"] > 0


def test_the_sharded_tables_fused_update_does_not_depend_on_the_dense_optimizer(sharded):
    first = sharded[0]["first_step_tables"]
    for a, b in zip(first["hessian_free"], first["sgd"]):
        np.testing.assert_array_equal(a, b)


def test_train_dlrm_runs_hf_in_the_sharded_runtime_and_reports_its_steps(parquet_dataset,
                                                                         tmp_path):
    from recscale.runconfig import TrainConfig
    from recscale.sharding import Topology, plan_sharding
    from recscale.sharding.from_data import table_specs_from_manifest
    from recscale.train import train_dlrm

    tcfg = parse(TrainConfig, {"batch_size_per_rank": 500, "progress": "off", "max_steps": 3,
                               "launch": {"world_size": 2, "collective_timeout_s": 60},
                               "dense_optimizer": {"name": "hessian_free",
                                                   "curvature_batch_size": 400,
                                                   "hf": {"cg_max_iters": 10}}}, "train")
    mcfg = parse(ModelConfig, {"embedding_dim": 16, "bottom_mlp": [32, 16],
                               "top_mlp": [32, 1]}, "model")
    plan = plan_sharding(table_specs_from_manifest(parquet_dataset, 16),
                         Topology.preset("cpu-local", world_size=2), 500)
    out = train_dlrm(parquet_dataset, mcfg, tcfg, plan, str(tmp_path))
    extra = out.result.extra
    assert out.result.steps == 3 and extra["hf.steps"] == 3
    assert extra["hf.products"] >= extra["hf.cg_iters"] > 0
    assert extra["rank0.bytes_per_step.dense_hf_allreduce"] > 0
    assert "rank0.bytes_per_step.dense_allreduce" not in extra  # DDP's hook never ran
