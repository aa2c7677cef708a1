"""DCN-v2 interaction: the cross layer against its formula in float64, the model's gradients
against finite differences, bf16, and config errors that name the key."""

import numpy as np
import pytest
import torch
from torch.func import functional_call

from recscale.config import ConfigError, parse
from recscale.embedding import EmbeddingOptimizerConfig
from recscale.model import DenseArch, ModelConfig, build_dlrm, interaction_dim
from recscale.model.dcn import LowRankCrossNet
from tests.unit.test_model import random_sparse

DCN = {"embedding_dim": 4, "bottom_mlp": [6, 4], "top_mlp": [5, 1], "interaction": "dcn",
       "dcn": {"num_layers": 3, "low_rank": 2}}


def reference_cross(x0: np.ndarray, us, vs, bs) -> np.ndarray:
    """x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l, per sample, in float64 numpy."""
    out = np.empty_like(x0)
    for i, row0 in enumerate(x0):
        x = row0.copy()
        for u, v, b in zip(us, vs, bs):
            x = row0 * (u @ (v @ x) + b) + x
        out[i] = x
    return out


def test_cross_layers_equal_the_formula_in_float64():
    torch.manual_seed(0)
    net = LowRankCrossNet(7, num_layers=3, low_rank=3).double()
    with torch.no_grad():  # non-zero biases so their place in the formula is tested
        for u in net.up:
            u.bias.normal_()
    x0 = torch.randn(5, 7, dtype=torch.float64)
    want = reference_cross(x0.numpy(), [u.weight.detach().numpy() for u in net.up],
                           [v.weight.detach().numpy() for v in net.down],
                           [u.bias.detach().numpy() for u in net.up])
    np.testing.assert_allclose(net(x0).detach().numpy(), want, rtol=1e-12, atol=1e-12)


def test_dcn_dense_arch_gradients_match_finite_differences():
    cfg = parse(ModelConfig, DCN, "model")
    torch.manual_seed(1)
    arch = DenseArch(3, 2, cfg).double()
    assert interaction_dim(cfg, 2) == 4 + 2 * 4
    names = [n for n, _ in arch.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in arch.parameters())
    dense = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    emb = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)

    def f(d, e, *ps):
        return functional_call(arch, dict(zip(names, ps)), (d, e))

    # logits are returned as float32 by design: check the float64 graph beneath
    arch.forward = lambda d, e: arch.top(arch.interact(arch.bottom(d), e)).squeeze(1)
    assert torch.autograd.gradcheck(f, (dense, emb, *params), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_dcn_dlrm_trains_in_fp32_and_bf16():
    rows = [30, 20]
    rng = np.random.default_rng(0)
    sp = random_sparse(rng, rows, 16, max_len=5)
    dense = torch.randn(16, 3)
    outs = {}
    for prec in ("fp32", "bf16"):
        cfg = parse(ModelConfig, {**DCN, "dense_precision": prec}, "model")
        model = build_dlrm(cfg, rows, 3, EmbeddingOptimizerConfig("exact_sgd", 0.1), seed=4)
        logits = model(dense, sp)
        assert logits.dtype == torch.float32 and logits.shape == (16,)
        logits.sum().backward()
        assert all(p.grad is not None and p.grad.dtype == torch.float32
                   for p in model.dense_parameters())
        outs[prec] = logits.detach()
    torch.testing.assert_close(outs["bf16"], outs["fp32"], rtol=0.05, atol=0.05)


@pytest.mark.parametrize("params,match", [
    ({"interaction": "dcn", "dcn": {"num_layers": 0}}, r"model\.dcn\.num_layers=0"),
    ({"interaction": "dcn", "dcn": {"low_rank": -1}}, r"model\.dcn\.low_rank=-1"),
    ({"interaction": "dcn", "dcn": {"rank": 4}}, r"unknown key model\.dcn\.rank"),
])
def test_bad_dcn_keys_are_named(params, match):
    with pytest.raises(ConfigError, match=match):
        parse(ModelConfig, params, "model")


def _cross_inputs(seed: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(6, 9, dtype=dtype, generator=g)
    net = LowRankCrossNet(9, num_layers=3, low_rank=4).to(dtype)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, dtype=dtype, generator=g) * 0.5)
    return net, x0


def test_fused_cross_backward_equals_autograd_of_the_plain_layers():
    """The fused node's hand-written backward against autograd through x0 * (U V x + b) + x."""
    net, x0 = _cross_inputs(2)
    x0.requires_grad_(True)
    upstream = torch.randn(6, 9, dtype=torch.float64)
    params = list(net.parameters())
    got = torch.autograd.grad(net(x0), [x0, *params], upstream)

    def plain(x0):
        x = x0
        for v, u in zip(net.down, net.up):
            x = x0 * u(v(x)) + x
        return x

    want = torch.autograd.grad(plain(x0), [x0, *params], upstream)
    for name, a, b in zip(["x0"] + [n for n, _ in net.named_parameters()], got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)


def test_fused_cross_supports_double_backward():
    """Hessian-vector products differentiate the gradient (create_graph): gradgradcheck."""
    net, x0 = _cross_inputs(3)
    params = [p.detach().clone().requires_grad_(True) for p in net.parameters()]
    names = [n for n, _ in net.named_parameters()]
    x0.requires_grad_(True)

    def f(x, *ps):
        return functional_call(net, dict(zip(names, ps)), (x,))

    assert torch.autograd.gradgradcheck(f, (x0, *params), eps=1e-6, atol=1e-6, rtol=1e-5)
    # and the differentiable gradient is the fused one
    upstream = torch.randn(6, 9, dtype=torch.float64)
    fast = torch.autograd.grad(f(x0, *params), [x0, *params], upstream)
    graph = torch.autograd.grad(f(x0, *params), [x0, *params], upstream, create_graph=True)
    for a, b in zip(fast, graph):
        torch.testing.assert_close(a, b.detach(), rtol=1e-12, atol=1e-12)


def test_cross_under_bf16_autocast_runs_in_bf16_with_fp32_gradients():
    net, x0 = _cross_inputs(4, torch.float32)
    x0.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x0)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x0.grad.dtype == torch.float32
    assert all(p.grad.dtype == torch.float32 for p in net.parameters())
    want = torch.from_numpy(reference_cross(
        x0.detach().double().numpy(), [u.weight.detach().double().numpy() for u in net.up],
        [v.weight.detach().double().numpy() for v in net.down],
        [u.bias.detach().double().numpy() for u in net.up]))
    # bf16 keeps 8 bits: the whole output within 2% of the float64 formula's (by norm)
    assert (out.double() - want).norm() / want.norm() < 0.02
