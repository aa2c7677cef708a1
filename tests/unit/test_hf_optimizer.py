"""HessianFree: escapes a saddle through negative curvature, Levenberg-Marquardt damping, steps."""

import math

import pytest
import torch
import torch.nn.functional as F

from recscale.config import ConfigError
from recscale.optim import HessianFree

C = 0.1  # f(x, y) = x^2 - y^2 + C (x^4 + y^4): saddle at 0, minima at x=0, y=+-sqrt(5), f=-2.5


def _saddle_run(steps=5, **kw):
    w = torch.nn.Parameter(torch.tensor([0.5, 1e-6], dtype=torch.float64))
    opt = HessianFree([w], damping=1.0, warm_start_decay=0.0, **kw)

    def closure():
        # outputs z = (x, y^2), loss convex in z: z1^2 + C z1^4 - z2 + C z2^2, so that the
        # Gauss-Newton matrix J' H_L J is PSD; the Hessian in (x, y) has curvature -2 along y
        z = torch.stack([w[0], w[1] ** 2])
        return z[0] ** 2 + C * z[0] ** 4 - z[1] + C * z[1] ** 2, z

    infos = []
    for _ in range(steps):
        opt.step(closure)
        infos.append(opt.last_step)
    with torch.no_grad():
        f = float(closure()[0])
    return w.detach(), f, opt, infos


def test_negative_curvature_escapes_the_saddle_where_gauss_newton_cg_does_not():
    w, f, opt, infos = _saddle_run(curvature="hessian", solver="cg")
    assert f < -2.49 and abs(abs(float(w[1])) - math.sqrt(5)) < 1e-3  # at a minimum
    assert opt.negative_curvature_events >= 1 and infos[0].took_negative_curvature
    assert opt.param_groups[0]["negative_curvature_steps"] >= 1

    w_gn, f_gn, opt_gn, _ = _saddle_run(curvature="gn", solver="cg")
    assert abs(float(w_gn[1])) < 0.05 and f_gn > -0.01  # still by the saddle (f = 0 there)
    assert opt_gn.negative_curvature_events == 0  # PSD curvature: never any

    # the Hessian with CG that stops at negative curvature but does not follow it stalls too
    w_tn, f_tn, opt_tn, _ = _saddle_run(curvature="hessian", negative_curvature=False)
    assert abs(float(w_tn[1])) < 0.05 and f_tn > -0.01


def test_bicgstab_on_the_indefinite_hessian_escapes_too():
    w, f, opt, _ = _saddle_run(steps=6, curvature="hessian", solver="bicgstab")
    assert f < -2.49
    assert opt.negative_curvature_events >= 1


def _quadratic_closure(w, A, b):
    def closure():
        # outputs z = w; loss 1/2 z'Az - b'z (convex in z): GN = Hessian = A
        z = w * 1.0
        return 0.5 * z @ A @ z - b @ z, z

    return closure


def test_damping_falls_after_a_good_step_and_rises_after_a_rejected_one():
    A = torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    b = torch.tensor([1.0, -1.0], dtype=torch.float64)
    w = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = HessianFree([w], damping=1.0)
    opt.step(_quadratic_closure(w, A, b))
    info = opt.last_step
    assert info.accepted and info.rho > 0.75
    assert opt.damping == pytest.approx(1.0 * 2 / 3)  # good step: lambda x 2/3

    # f(x) = sqrt(1 + x^2) from x = 2: the Newton step overshoots to a higher value (rho < 0)
    x = torch.nn.Parameter(torch.tensor([2.0], dtype=torch.float64))

    def bowl():
        return torch.sqrt(1 + x[0] ** 2)

    opt = HessianFree([x], curvature="hessian", damping=1e-3)
    opt.step(bowl)
    info = opt.last_step
    assert info.rho < 0.25 and info.accepted and info.alpha < 1  # line search shortened it
    assert opt.damping == pytest.approx(1.5e-3)  # rejected model step: lambda x 3/2
    assert float(x.detach()) < 2.0  # ... yet the loss went down

    # with no line search trials left, the step is rejected outright: parameters unchanged
    x.data.fill_(2.0)
    opt = HessianFree([x], curvature="hessian", damping=1e-3, line_search_max=0)
    opt.step(bowl)
    assert not opt.last_step.accepted and float(x.detach()) == 2.0
    assert opt.damping == pytest.approx(1.5e-3) and opt.param_groups[0]["rejected_steps"] == 1
    opt.step(bowl)  # and it keeps rising while steps fail
    assert opt.damping == pytest.approx(1.5e-3 * 1.5)


def test_one_step_solves_a_convex_quadratic():
    g = torch.Generator().manual_seed(0)
    M = torch.randn(6, 6, generator=g, dtype=torch.float64)
    A = M @ M.T + 6 * torch.eye(6, dtype=torch.float64)
    b = torch.randn(6, generator=g, dtype=torch.float64)
    w = torch.nn.Parameter(torch.zeros(6, dtype=torch.float64))
    opt = HessianFree([w], damping=1e-8, cg_residual_tol=1e-12, cg_tol=1e-12)
    opt.step(_quadratic_closure(w, A, b))
    torch.testing.assert_close(w.detach(), torch.linalg.solve(A, b), rtol=1e-6, atol=1e-8)
    assert opt.last_step.rho == pytest.approx(1.0, abs=1e-6)


def test_trains_a_small_classifier_with_a_curvature_batch_and_the_fisher_preconditioner():
    from recscale.optim import empirical_fisher_diagonal

    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 8, generator=g)
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).long() + (x[:, 3] > 1).long()
    for precond in ("none", "fisher"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        opt = HessianFree(model.parameters(), damping=0.5, preconditioner=precond, cg_max_iters=30)

        def closure(model=model):
            z = model(x)
            return F.cross_entropy(z, y), z

        def curvature(model=model):
            z = model(x[:100])
            return F.cross_entropy(z, y[:100]), z

        def fisher(model=model):
            return empirical_fisher_diagonal(model, F.cross_entropy, x[:100], y[:100])

        losses = [opt.step(closure, curvature, fisher) for _ in range(15)]
        assert losses[-1] < 0.6 * losses[0], (precond, losses)
        assert opt.last_step.cg_iters > 0
    with pytest.raises(ValueError, match="fisher_diagonal"):
        opt.step(closure, curvature)


def test_gauss_newton_needs_the_outputs_and_configs_are_checked():
    w = torch.nn.Parameter(torch.ones(2))
    opt = HessianFree([w])
    with pytest.raises(ValueError, match=r"\(loss, outputs\)"):
        opt.step(lambda: (w**2).sum())
    with pytest.raises(ValueError, match="not computed from the outputs"):
        opt.step(lambda: ((w**2).sum(), w * 2))
    with pytest.raises(ConfigError, match=r"hessian_free.solver='lbfgs' is not allowed"):
        HessianFree([w], solver="lbfgs")
    with pytest.raises(ConfigError, match=r"hessian_free.damping_drop=1.5 is not allowed"):
        HessianFree([w], damping_drop=1.5)


def test_state_dict_round_trip_keeps_damping_counters_and_warm_start():
    A = torch.diag(torch.tensor([1.0, 10.0], dtype=torch.float64))
    b = torch.tensor([1.0, 1.0], dtype=torch.float64)
    w = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = HessianFree([w], damping=3.0)
    opt.step(_quadratic_closure(w, A, b))
    state = opt.state_dict()
    w2 = torch.nn.Parameter(w.detach().clone())
    opt2 = HessianFree([w2])
    opt2.load_state_dict(state)
    assert opt2.damping == opt.damping and opt2.param_groups[0]["steps"] == 1
    torch.testing.assert_close(opt2.state[w2]["direction"], opt.state[w]["direction"])



def test_a_warm_start_worse_than_no_step_is_shrunk_so_the_step_follows_its_model():
    # f = 1/2 w'Aw - b'w is its own quadratic model (undamped minimum -500.5 at (1000, 1)). The stored
    # direction (4000, 0) overshoots the soft axis: phi(x0) > 0 although g'x0 < 0, and one CG
    # iteration from it stays at phi > 0, so its full step raises f from 0 to about +3900.
    # Before the fix that direction was line-searched and 0.41 of it taken (f = -216, rho =
    # -inf): the MNIST batch-800 collapse, where every solve warm-started from the last failed
    # direction and never left it. Now the warm start is first shrunk to the model's minimum
    # along it (damped: (500, 0)), and the full step is taken.
    A = torch.diag(torch.tensor([1e-3, 1.0], dtype=torch.float64))
    b = torch.tensor([1.0, 1.0], dtype=torch.float64)
    w = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = HessianFree([w], damping=1e-3, cg_max_iters=1, warm_start_decay=1.0)
    opt.state[w]["direction"] = torch.tensor([4000.0, 0.0], dtype=torch.float64)
    opt.step(_quadratic_closure(w, A, b))
    info = opt.last_step
    assert info.accepted and info.alpha == 1.0  # the full step: the model holds
    assert info.rho == pytest.approx(1.0, abs=1e-9)
    assert info.new_loss < -375.0  # the damped model's minimum is -375.5


def test_cg_shrinks_or_drops_a_warm_start_no_better_than_zero():
    from recscale.optim import conjugate_gradient

    A = torch.diag(torch.tensor([1e-3, 1.0], dtype=torch.float64))
    b = torch.tensor([1.0, 1.0], dtype=torch.float64)

    def solve(x0):
        return conjugate_gradient(lambda v: A @ v, b, x0, max_iters=1)

    cold = solve(None)
    over = solve(torch.tensor([4000.0, 0.0], dtype=torch.float64))  # phi = 4000 > 0, b'x0 > 0
    assert over.phi < cold.phi < 0 and all(it.phi < 0 for it in over.iterates)
    assert over.products == cold.products + 1
    uphill = solve(torch.tensor([-5.0, 0.0], dtype=torch.float64))  # b'x0 < 0: dropped
    torch.testing.assert_close(uphill.x, cold.x)
    good = torch.tensor([900.0, 1.0], dtype=torch.float64)  # phi < 0: used as it is
    torch.testing.assert_close(solve(good).x, conjugate_gradient(
        lambda v: A @ v, b - A @ good, None, max_iters=1).x + good)
