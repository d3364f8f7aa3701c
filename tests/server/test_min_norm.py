"""The exact min-norm solver (FedAWARE Eq. 8, Alg. 1 l. 11) against an independent NumPy KKT enumeration."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.algorithms.fedaware import FedAWARE
from lightning_fed.server.min_norm import (
    SOLVERS,
    MinNormConvergenceWarning,
    duality_gap,
    min_norm_active_set,
    min_norm_frank_wolfe,
    min_norm_point,
    min_norm_weights,
)


def _exact(gram: np.ndarray) -> tuple[float, np.ndarray]:
    """(f*, a λ*) of min_{λ ∈ simplex} λᵀGλ: for every support S solve the KKT system of the QP restricted to the
    affine hull of S (G_S λ_S = ν1, 1ᵀλ_S = 1); keep the feasible (λ_S ≥ 0) candidate of least value. Works on
    G / max G_ii so the feasibility and tie thresholds are scale-free."""
    n = len(gram)
    g = gram / np.max(np.diag(gram))
    best_value, best = np.inf, None
    for r in range(1, n + 1):
        for support in itertools.combinations(range(n), r):
            s = list(support)
            kkt = np.zeros((r + 1, r + 1))
            kkt[:r, :r] = g[np.ix_(s, s)]
            kkt[:r, r] = -1.0
            kkt[r, :r] = 1.0
            rhs = np.zeros(r + 1)
            rhs[r] = 1.0
            try:
                sol = np.linalg.solve(kkt, rhs)[:r]
            except np.linalg.LinAlgError:
                continue
            if not np.all(np.isfinite(sol)) or np.any(sol < -1e-10):
                continue
            lam = np.zeros(n)
            lam[s] = np.clip(sol, 0, None)
            lam /= lam.sum()
            value = float(lam @ g @ lam)
            if value < best_value - 1e-13:
                best_value, best = value, lam
    return float(best @ gram @ best), best


def _instances():
    """Random vector sets: 3-7 vectors in 2-11 dims (affinely dependent when n > d + 1), shifted so the optimum
    sits on a vertex, an edge, a face or the interior; some unit-normalised as FedAWARE solves them; plus
    duplicates, collinear sets, a zero vector and extreme scales."""
    rng = np.random.default_rng(11)
    out = []
    for trial in range(150):
        n, d = int(rng.integers(3, 8)), int(rng.integers(2, 12))
        v = rng.normal(size=(n, d)) * rng.uniform(0.1, 1.0) + rng.normal(size=d) * rng.uniform(0.0, 2.0)
        if trial % 3 == 0:
            v /= np.linalg.norm(v, axis=1, keepdims=True)
        out.append(v)
    a = rng.normal(size=(3, 4))
    u = rng.normal(size=3)
    out += [
        np.vstack([a, a]),  # every vector twice
        np.vstack([rng.normal(size=(4, 3)), np.zeros((1, 3))]),  # a zero vector: the answer is 0
        np.outer(rng.uniform(0.5, 2.0, 5), u),  # collinear, one side: the shortest vector
        np.vstack([u, -2 * u, 3 * u, 0.5 * u]),  # collinear, both sides: 0 is in the hull
        np.ones((4, 3)),
        1e-8 * rng.normal(size=(6, 5)),
        1e8 * rng.normal(size=(6, 5)),
    ]
    return out


def _degenerate_six() -> np.ndarray:
    """6 unit vectors around a common direction whose min-norm point lies inside a 6-vertex face: plain
    Frank–Wolfe zig-zags and stops at its 1,000-iteration cap."""
    rng = np.random.default_rng(15)
    v = rng.normal(size=(6, 20)) * 0.3 + rng.normal(size=20)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


# ---------------------------------------------------------------------------------------------- the solver
def test_default_solver_reaches_the_exact_optimum():
    for v in _instances():
        gram = v @ v.T
        scale = np.max(np.diag(gram))
        f_star, lam_star = _exact(gram)
        with warnings.catch_warnings():
            warnings.simplefilter("error", MinNormConvergenceWarning)
            got = min_norm_point(torch.tensor(gram))
        assert got.converged
        assert got.weights.min() >= 0 and got.weights.sum() == pytest.approx(1.0, abs=1e-12)
        assert got.value - f_star <= 1e-9 * scale  # within 1e-9 of the optimum (relative to max ‖v_i‖²)
        assert 0 <= got.gap + 1e-15 * scale and got.gap <= 1e-9 * scale
        assert got.gap == pytest.approx(duality_gap(gram, got.weights), abs=1e-15 * scale)
        # the min-norm point is unique even where λ is not
        np.testing.assert_allclose(got.weights @ v, lam_star @ v, atol=1e-7 * np.sqrt(scale))
        if np.linalg.matrix_rank(np.hstack([v, np.ones((len(v), 1))])) == len(v):  # affinely independent
            np.testing.assert_allclose(got.weights, lam_star, atol=1e-7)


def test_degenerate_six_clients_plain_frank_wolfe_stops_short_exact_solver_does_not():
    v = _degenerate_six()
    gram = v @ v.T
    f_star, lam_star = _exact(gram)
    assert (lam_star > 1e-6).sum() == 6  # the optimum is interior to the 6-vertex simplex
    d_star = lam_star @ v
    with pytest.warns(MinNormConvergenceWarning, match="max_iter`=1000"):
        plain = min_norm_frank_wolfe(gram)  # the public code's solver and the earlier default
    assert plain.num_iters == 1000 and not plain.converged
    assert np.linalg.norm(plain.weights @ v - d_star) / np.linalg.norm(d_star) > 5e-4  # 8e-4: visibly off
    assert plain.gap > 1e-6 and np.abs(plain.weights - lam_star).max() > 1e-3
    exact = min_norm_point(gram)
    assert exact.converged and exact.num_iters < 20
    assert exact.value - f_star <= 1e-12
    np.testing.assert_allclose(exact.weights, lam_star, atol=1e-9)
    away = min_norm_frank_wolfe(gram, away_steps=True, tol=1e-12, max_iter=20000)
    assert away.converged and away.value - f_star <= 1e-12


def test_warns_when_a_solve_stops_at_its_cap():
    gram = _degenerate_six() @ _degenerate_six().T
    with pytest.warns(MinNormConvergenceWarning, match="max_iter`=2"):
        capped = min_norm_active_set(gram, max_iter=2)
    assert not capped.converged and capped.num_iters == 2 and capped.gap > 1e-9
    with pytest.warns(MinNormConvergenceWarning, match="max_iter`=3"):
        min_norm_point(gram, solver="frank_wolfe", max_iter=3, tol=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MinNormConvergenceWarning)
        assert min_norm_active_set(gram).converged


def test_two_vectors_and_helpers():
    a, b = np.array([3.0, 1.0]), np.array([-1.0, 0.5])
    got = min_norm_weights(np.stack([a, b]))
    gamma = np.clip(((b - a) @ b) / ((a - b) @ (a - b)), 0, 1)
    np.testing.assert_allclose(got.weights, [gamma, 1 - gamma], atol=1e-15)
    assert got.num_iters == 0 and got.converged
    assert SOLVERS == ("active_set", "frank_wolfe")
    g = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert duality_gap(g, [1.0, 0.0]) == pytest.approx(1.0) and duality_gap(g, [0.5, 0.5]) == pytest.approx(0.0)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: min_norm_point(np.eye(3), solver="qp"), "`solver`"),
        (lambda: min_norm_active_set(np.eye(3), tol=-1.0), "`tol`"),
        (lambda: min_norm_active_set(np.eye(3), tol=float("nan")), "`tol`"),
        (lambda: min_norm_active_set(np.eye(3), max_iter=0), "`max_iter`"),
        (lambda: min_norm_active_set(np.ones((2, 3))), "square"),
        (lambda: min_norm_active_set(np.array([[np.inf]])), "non-finite"),
    ],
)
def test_solver_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------------------------------------- in FedAWARE
def _run(server, x0, rounds):
    params = [torch.tensor(x0.copy())]
    for cohort in rounds:
        updates = [ClientUpdate(client_id=c, delta=[torch.tensor(d)], num_samples=10, num_steps=1, loss=0.0)
                   for c, d in cohort]
        server.server_update(params, updates)
    return params[0].numpy()


def test_fedaware_default_is_alg1_with_the_exact_weights_on_six_clients():
    """6 clients, full participation, 6 rounds, unit-normalised momenta (the defaults), α = 0.5: the model equals
    Alg. 1 with λ from the KKT enumeration; the earlier default (plain Frank–Wolfe) hits its cap and drifts."""
    rng = np.random.default_rng(0)
    d = 20
    base, x0 = rng.normal(size=d), rng.normal(size=d)
    rounds = [[(c, -0.1 * (0.3 * rng.normal(size=d) + base)) for c in range(6)] for _ in range(6)]
    m, want = np.zeros((6, d)), x0.copy()
    for cohort in rounds:  # Alg. 1, l. 8-12 with normalised momenta
        for c, delta in cohort:
            m[c] = 0.5 * m[c] + 0.5 * (-delta)
        v = m / np.linalg.norm(m, axis=1, keepdims=True)
        _, lam = _exact(v @ v.T)
        want = want - 1.0 * (lam @ v)
    server = FedAWARE(num_clients=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MinNormConvergenceWarning)
        got = _run(server, x0, rounds)
    np.testing.assert_allclose(got, want, atol=1e-12)
    np.testing.assert_allclose(server.last_weights, lam, atol=1e-9)
    assert server.solver == "active_set" and server.last_solve.gap <= 1e-9
    with pytest.warns(MinNormConvergenceWarning, match="max_iter`=1000"):
        old = _run(FedAWARE(num_clients=6, solver="frank_wolfe"), x0, rounds)
    assert np.abs(old - want).max() > 1e-4


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(solver="mgda"), "`solver`"),
        (dict(fw_away_steps=True), "`fw_away_steps` only apply to solver='frank_wolfe'"),
        (dict(fw_tol=1e-9, fw_max_iter=10), "`fw_max_iter`, `fw_tol` only apply"),
        (dict(solver="frank_wolfe", fw_away_steps="yes"), "`fw_away_steps`"),
    ],
)
def test_fedaware_solver_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedAWARE(**kwargs)


def test_fedaware_frank_wolfe_options_default_to_the_earlier_values():
    server = FedAWARE(solver="frank_wolfe")
    assert (server.fw_max_iter, server.fw_tol, server.fw_away_steps) == (1000, 1e-5, False)
