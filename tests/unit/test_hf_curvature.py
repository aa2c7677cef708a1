"""Curvature-vector products against torch.autograd.functional on small nets; GN is PSD."""

import pytest
import torch
import torch.nn.functional as F
from torch.autograd.functional import hessian, jacobian

from recscale.optim import (
    empirical_fisher_diagonal,
    flatten,
    gauss_newton_operator,
    gnvp,
    hessian_operator,
    hvp,
    unflatten,
)


def _net(act=torch.nn.Tanh, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), act(), torch.nn.Linear(4, 3)).double()


def _data(n=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def _reference(model, x, y):
    """Dense Hessian and Gauss-Newton matrices from torch.autograd.functional."""
    params = [p.detach() for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]
    theta = flatten(params)

    def out(th):
        ps = dict(zip(names, unflatten(th, params)))
        return torch.func.functional_call(model, ps, (x,))

    def loss(th):
        return F.cross_entropy(out(th), y)

    H = hessian(loss, theta)
    z = out(theta).detach()
    J = jacobian(out, theta).reshape(z.numel(), -1)  # d vec(z) / d theta
    HL = hessian(lambda zz: F.cross_entropy(zz.reshape(z.shape), y), z.reshape(-1))
    return H, J.T @ HL @ J


@pytest.mark.parametrize("act", [torch.nn.Tanh, torch.nn.Softplus])
def test_graph_products_match_autograd_functional(act):
    model, (x, y) = _net(act), _data()
    H, G = _reference(model, x, y)
    params = list(model.parameters())
    v = torch.randn(H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    z = model(x)
    loss = F.cross_entropy(z, y)
    gn = gauss_newton_operator(loss, z, params)
    hv = hessian_operator(F.cross_entropy(model(x), y), params)
    torch.testing.assert_close(gn(v), G @ v, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(hv(v), H @ v, rtol=1e-10, atol=1e-12)
    # the graphs are reused: a second product on another vector is still right
    w = torch.randn_like(v)
    torch.testing.assert_close(gn(w), G @ w, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(hv(w), H @ w, rtol=1e-10, atol=1e-12)


def test_functional_products_match_autograd_functional():
    model, (x, y) = _net(), _data()
    H, G = _reference(model, x, y)
    params = list(model.parameters())
    v = torch.randn(H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    vs = unflatten(v, params)
    torch.testing.assert_close(flatten(gnvp(model, F.cross_entropy, x, y, vs)), G @ v,
                               rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(flatten(hvp(model, F.cross_entropy, x, y, vs)), H @ v,
                               rtol=1e-10, atol=1e-12)


def test_gauss_newton_is_psd_while_the_hessian_is_not():
    model, (x, y) = _net(seed=5), _data(n=20)
    H, G = _reference(model, x, y)
    assert torch.linalg.eigvalsh(G).min() >= -1e-12 * torch.linalg.eigvalsh(G).max()
    assert torch.linalg.eigvalsh(H).min() < -1e-6  # a tanh net's Hessian is indefinite here
    z = model(x)
    gn = gauss_newton_operator(F.cross_entropy(z, y), z, list(model.parameters()))
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        v = torch.randn(G.shape[0], dtype=torch.float64, generator=gen)
        assert float(v @ gn(v)) >= -1e-12


def test_relu_net_products_in_float32_match_float64():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    x, y = torch.randn(30, 6), torch.randint(0, 4, (30,))
    m64 = _clone64(model)
    v = torch.randn(sum(p.numel() for p in model.parameters()))
    z = model(x)
    z64 = m64(x.double())
    a = gauss_newton_operator(F.cross_entropy(z, y), z, list(model.parameters()))(v)
    b = gauss_newton_operator(F.cross_entropy(z64, y), z64, list(m64.parameters()))(v.double())
    torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-6)


def _clone64(model):
    import copy

    return copy.deepcopy(model).double()


def test_empirical_fisher_diagonal_matches_a_loop_over_examples():
    model, (x, y) = _net(), _data(n=9)
    diag = empirical_fisher_diagonal(model, F.cross_entropy, x, y, chunk_size=4)
    params = list(model.parameters())
    ref = [torch.zeros_like(p) for p in params]
    for i in range(len(x)):
        g = torch.autograd.grad(F.cross_entropy(model(x[i: i + 1]), y[i: i + 1]), params)
        for r, gi in zip(ref, g):
            r += gi**2 / len(x)
    for a, b in zip(diag, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)
