"""CG solves SPD systems, Bi-CG-STAB solves indefinite ones; negative curvature is reported."""

import torch

from recscale.optim import backtrack_schedule, bicgstab, conjugate_gradient


def _spd(n, cond=100.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    eig = torch.logspace(0, torch.log10(torch.tensor(cond)).item(), n, dtype=torch.float64)
    return q @ torch.diag(eig) @ q.T, torch.randn(n, generator=g, dtype=torch.float64)


def _indefinite(n, seed=0, symmetric=True):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    eig = torch.linspace(0.5, 5.0, n, dtype=torch.float64)
    eig[: n // 3] *= -1  # a third of the spectrum negative
    A = q @ torch.diag(eig) @ q.T
    if not symmetric:
        A = A + 0.3 * torch.triu(torch.randn(n, n, generator=g, dtype=torch.float64), 1)
    return A, torch.randn(n, generator=g, dtype=torch.float64)


def _rel_residual(A, x, b):
    return float((A @ x - b).norm() / b.norm())


def test_cg_solves_spd_systems_to_tolerance():
    A, b = _spd(40)
    res = conjugate_gradient(lambda v: A @ v, b, max_iters=200, progress_tol=None,
                             residual_tol=1e-10)
    assert res.stop_reason == "residual"
    assert _rel_residual(A, res.x, b) <= 1e-10
    assert not res.hit_negative_curvature
    # the model value it reports is phi(x) = x'Ax/2 - b'x
    assert abs(res.phi - float(0.5 * res.x @ A @ res.x - b @ res.x)) < 1e-9


def test_preconditioned_cg_converges_in_fewer_iterations_on_a_badly_scaled_system():
    g = torch.Generator().manual_seed(1)
    d = torch.logspace(0, 4, 60, dtype=torch.float64)
    B = torch.randn(60, 60, generator=g, dtype=torch.float64) * 0.01
    A = torch.diag(d) + B @ B.T
    b = torch.randn(60, generator=g, dtype=torch.float64)
    plain = conjugate_gradient(lambda v: A @ v, b, max_iters=500, progress_tol=None, residual_tol=1e-8)
    pre = conjugate_gradient(lambda v: A @ v, b, precond=torch.diag(A), max_iters=500,
                             progress_tol=None, residual_tol=1e-8)
    assert _rel_residual(A, pre.x, b) <= 1e-8 and _rel_residual(A, plain.x, b) <= 1e-8
    assert pre.iterations < plain.iterations / 2


def test_warm_start_from_the_solution_needs_no_iteration():
    A, b = _spd(20)
    x = torch.linalg.solve(A, b)
    res = conjugate_gradient(lambda v: A @ v, b, x0=x, progress_tol=None, residual_tol=1e-8)
    assert res.iterations == 0 and res.products == 1


def test_martens_rule_stops_early_and_keeps_backtracking_iterates():
    A, b = _spd(300, cond=1e6, seed=2)
    save = backtrack_schedule(300)
    res = conjugate_gradient(lambda v: A @ v, b, max_iters=300, progress_tol=5e-3, save=save)
    assert res.stop_reason == "martens" and 10 < res.iterations < 300
    its = [it.iteration for it in res.iterates]
    assert its == sorted(its) and its[-1] == res.iterations
    assert set(its[:-1]) <= save and {1, 2, 3, 4, 5} <= set(its)
    phis = [it.phi for it in res.iterates]  # CG decreases the quadratic model monotonically
    assert all(a >= b - 1e-9 for a, b in zip(phis, phis[1:]))


def test_cg_stops_at_negative_curvature_and_returns_the_direction():
    A, b = _indefinite(30)
    res = conjugate_gradient(lambda v: A @ v, b, max_iters=100, progress_tol=None)
    assert res.stop_reason == "negative_curvature" and res.hit_negative_curvature
    p = res.negative_direction
    assert float(p @ A @ p) <= 0
    assert abs(res.negative_curvature - float(p @ A @ p / (p @ p))) < 1e-10


def test_bicgstab_solves_indefinite_systems_to_tolerance():
    for symmetric in (True, False):
        A, b = _indefinite(40, seed=3, symmetric=symmetric)
        res = bicgstab(lambda v, A=A: A @ v, b, max_iters=500, tol=1e-10)
        assert res.stop_reason == "residual", (symmetric, res.stop_reason)
        assert _rel_residual(A, res.x, b) <= 1e-10
    # CG on the same symmetric indefinite system gives up at the first negative curvature
    A, b = _indefinite(40, seed=3)
    cg = conjugate_gradient(lambda v: A @ v, b, max_iters=500, progress_tol=None)
    assert cg.stop_reason == "negative_curvature" and _rel_residual(A, cg.x, b) > 1e-3


def test_bicgstab_with_preconditioner_and_negative_curvature_detection():
    A, b = _indefinite(30, seed=4)
    res = bicgstab(lambda v: A @ v, b, precond=torch.ones(30, dtype=torch.float64), tol=1e-10,
                   max_iters=300)
    assert _rel_residual(A, res.x, b) <= 1e-10
    res = bicgstab(lambda v: A @ v, b, stop_on_negative_curvature=True, max_iters=300)
    assert res.hit_negative_curvature
    d = res.negative_direction
    assert float(d @ A @ d) <= 0
