"""Hessian-free on the DLRM's dense arch (train.dense_optimizer.name: hessian_free), one process:
one step against a float64 reference solve with the curvature matrix built explicitly, the
embeddings' fused update unchanged by the dense optimizer, and the config errors."""

import pytest
import torch
from torch.func import functional_call

from recscale.config import ConfigError, parse
from recscale.embedding import EmbeddingOptimizerConfig, FusedEmbeddingBags
from recscale.model import DLRM, ModelConfig
from recscale.runconfig import DLRMConfig, TrainConfig
from recscale.train.runtime import LocalRuntime
from tests.distributed import workers as W

EXACT = {"damping": 0.5, "cg_max_iters": 2000, "cg_tol": 1e-14, "cg_residual_tol": 1e-13,
         "warm_start_decay": 0.0, "backtracking": False}


def small_model(dtype=torch.float64) -> DLRM:
    emb = FusedEmbeddingBags(list(W.ROWS), [W.DIM] * len(W.ROWS),
                             EmbeddingOptimizerConfig("exact_sgd", 0.2), seed=3)
    model = DLRM(W.NUM_DENSE, len(W.ROWS), parse(ModelConfig, W.MODEL, "model"), emb, seed=3)
    model.dense.to(dtype)
    return model


def runtime(model, dense_optimizer: dict) -> LocalRuntime:
    tcfg = parse(TrainConfig, {"embedding_optimizer": {"name": "exact_sgd", "learning_rate": 0.2},
                               "dense_optimizer": dense_optimizer, "seed": 3}, "train")
    return LocalRuntime(model, tcfg, torch.device("cpu"))


def reference_step(model: DLRM, batch, curvature: str, damping: float, rows: int | None):
    """-(B + damping I)^-1 g with B built as a matrix in float64 (Gauss-Newton J' H_L J from the
    logits' Jacobian, or the exact Hessian), the pooled embeddings fixed at their current values;
    the curvature on the first ``rows`` rows (None: all)."""
    arch = model.dense
    names = [n for n, _ in arch.named_parameters()]
    theta = [p.detach().clone() for p in arch.parameters()]
    sizes = [t.numel() for t in theta]
    with torch.no_grad():
        pooled = model.embeddings(batch.sparse).double()
    x, y = batch.dense.double(), batch.labels.double()

    def logits(flat, lo=None):
        params = dict(zip(names, [v.view_as(t) for v, t in zip(flat.split(sizes), theta)]))
        return functional_call(arch, params, (x[:lo], pooled[:lo]))

    def loss(flat, lo=None):
        return torch.nn.functional.binary_cross_entropy_with_logits(logits(flat, lo), y[:lo])

    t0 = torch.cat([t.reshape(-1) for t in theta])
    g = torch.autograd.functional.jacobian(loss, t0)
    if curvature == "gn":
        J = torch.autograd.functional.jacobian(lambda f: logits(f, rows), t0,
                                             vectorize=True)  # [b, n]
        s = torch.sigmoid(logits(t0, rows))
        B = J.T @ torch.diag(s * (1 - s) / len(s)) @ J
    else:
        B = torch.autograd.functional.hessian(lambda f: loss(f, rows), t0, vectorize=True)
    A = B + damping * torch.eye(len(t0), dtype=torch.float64)
    assert bool(torch.all(torch.linalg.eigvalsh(A) > 0))  # the instance has one solution
    return t0, -torch.linalg.solve(A, g)


@pytest.mark.parametrize("curvature,solver,rows", [("gn", "cg", None), ("gn", "cg", 9),
                                                   ("hessian", "bicgstab", None)])
def test_one_hf_step_equals_the_float64_reference_solve(curvature, solver, rows):
    batch = W.to_batch(W.concat_parts(W.make_global_batches(1, seed=4)[0]))
    model = small_model()
    t0, step = reference_step(model, batch, curvature, EXACT["damping"], rows)
    rt = runtime(model, {"name": "hessian_free", "curvature_batch_size": rows,
                         "hf": {**EXACT, "curvature": curvature, "solver": solver}})
    rt.step.run(batch)
    info = rt.opt.last_step
    assert info.accepted and info.alpha == 1.0 and not info.negative_curvature
    t1 = torch.cat([p.detach().reshape(-1) for p in model.dense.parameters()])
    assert float(step.norm()) > 1e-3
    torch.testing.assert_close(t1 - t0, step, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("first_order", ["sgd", "adam"])
def test_the_embeddings_fused_update_does_not_depend_on_the_dense_optimizer(first_order):
    batch = W.to_batch(W.concat_parts(W.make_global_batches(1, seed=6)[0]))
    before = [w.detach().clone() for w in small_model(torch.float32).embeddings.split_weights()]
    tables = {}
    for name in (first_order, "hessian_free"):
        model = small_model(torch.float32)
        runtime(model, {"name": name, "learning_rate": 0.1}).step.run(batch)
        tables[name] = [w.detach().clone() for w in model.embeddings.split_weights()]
    assert any(not torch.equal(a, b) for a, b in zip(tables["hessian_free"], before))
    for a, b in zip(tables["hessian_free"], tables[first_order]):
        assert torch.equal(a, b)


def test_hf_steps_train_and_count_what_they_did():
    model = small_model(torch.float32)
    rt = runtime(model, {"name": "hessian_free", "hf": {"curvature": "hessian",
                                                        "solver": "bicgstab", "damping": 0.01}})
    losses = []
    for parts in W.make_global_batches(3, seed=2):
        batch = W.to_batch(W.concat_parts(parts))
        loss_sum, n = rt.step.run(batch)
        losses.append(rt.opt.last_step.new_loss <= rt.opt.last_step.loss)
        assert n == batch.batch_size
    s = rt.step.summary()
    assert all(losses) and s["steps"] == 3 and s["products"] >= s["cg_iters"] > 0
    assert s["negative_curvature_taken"] <= s["negative_curvature_met"] <= 3


def test_bad_hf_configs_fail_naming_the_key():
    hf = {"name": "hessian_free"}
    with pytest.raises(ConfigError, match=r"train\.dense_optimizer\.name='hessian_free'.*bf16"):
        parse(DLRMConfig, {"model": {"dense_precision": "bf16"},
                           "train": {"dense_optimizer": hf}}, "")
    with pytest.raises(ConfigError, match=r"train\.dense_optimizer\.curvature_batch_size=5000"):
        parse(TrainConfig, {"batch_size_per_rank": 2048, "launch": {"world_size": 2},
                            "dense_optimizer": {**hf, "curvature_batch_size": 5000}}, "train")
    with pytest.raises(ConfigError, match=r"train\.dense_optimizer\.curvature_batch_size=1001"):
        parse(TrainConfig, {"batch_size_per_rank": 2048, "launch": {"world_size": 2},
                            "dense_optimizer": {**hf, "curvature_batch_size": 1001}}, "train")
    with pytest.raises(ConfigError, match=r"train\.dense_optimizer\.hf\.preconditioner"):
        parse(TrainConfig, {"dense_optimizer": {**hf, "hf": {"preconditioner": "fisher"}}},
              "train")
    with pytest.raises(ConfigError, match=r"train\.dense_optimizer\.hf\.solver='gmres'"):
        parse(TrainConfig, {"dense_optimizer": {**hf, "hf": {"solver": "gmres"}}}, "train")
    # the runtime refuses a bf16 model too (a model config not parsed with its train block)
    emb = FusedEmbeddingBags(list(W.ROWS), [W.DIM] * 4, EmbeddingOptimizerConfig("exact_sgd"))
    model = DLRM(W.NUM_DENSE, 4, parse(ModelConfig, {**W.MODEL, "dense_precision": "bf16"},
                                       "model"), emb)
    with pytest.raises(ConfigError, match=r"train\.dense_optimizer\.name"):
        runtime(model, hf)
    # fine: first-order with bf16, HF with a curvature batch within the global batch
    parse(DLRMConfig, {"model": {"dense_precision": "bf16"},
                       "train": {"dense_optimizer": {"name": "adam"}}}, "")
    parse(TrainConfig, {"batch_size_per_rank": 2048, "launch": {"world_size": 2},
                        "dense_optimizer": {**hf, "curvature_batch_size": 4096}}, "train")
