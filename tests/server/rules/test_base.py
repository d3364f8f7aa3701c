"""Each server rule of lightning_fed.server.rules against NumPy formulas written here from the papers."""

import math

import numpy as np
import pytest
import torch

from lightning_fed.server.rules import LAMB, SGD, Adagrad, Adam, AdaptiveStepSize, Momentum, Yogi

ROUNDS = 4


def _deltas(seed=0, shape=(3,)):
    rng = np.random.default_rng(seed)
    return [rng.normal(scale=0.3, size=shape) for _ in range(ROUNDS)]


def _run(rule, x0, deltas):
    params = [torch.tensor(x0, dtype=torch.float64)]
    state = rule.init(params)
    for t, d in enumerate(deltas, start=1):
        state = rule.update(params, [torch.tensor(d)], state, t)
    return params[0].numpy(), state


def test_sgd_is_fedavg_server_step():
    """Reddi et al. 2021, Alg. 1, l. 11 with ServerOpt = SGD: x_{t+1} = x_t + η Δ_t."""
    x0, ds = np.ones(3), _deltas()
    got, _ = _run(SGD(lr=0.7), x0, ds)
    np.testing.assert_allclose(got, x0 + 0.7 * sum(ds), rtol=0, atol=1e-14)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_heavy_ball_and_nesterov(nesterov):
    """torch.optim.SGD on g = −Δ: b_t = μ b_{t−1} + g_t; heavy ball x −= η b_t; Nesterov x −= η (g_t + μ b_t)."""
    x, b, mu, lr = np.ones(3), np.zeros(3), 0.9, 0.5
    ds = _deltas(1)
    for d in ds:
        g = -d
        b = mu * b + g
        x = x - lr * ((g + mu * b) if nesterov else b)
    got, state = _run(Momentum(lr=lr, momentum=mu, nesterov=nesterov), np.ones(3), ds)
    np.testing.assert_allclose(got, x, rtol=0, atol=1e-14)
    np.testing.assert_allclose(state.momentum_buffer[0].numpy(), b, rtol=0, atol=1e-14)


def _reddi(second, ds, lr=0.1, b1=0.9, b2=0.99, tau=1e-3, v0=None):
    """Reddi et al. 2021, Alg. 2, l. 11-15 (v_{−1} = τ² by default)."""
    x, m = np.zeros(3), np.zeros(3)
    v = np.full(3, tau**2 if v0 is None else v0)
    for d in ds:
        m = b1 * m + (1 - b1) * d  # l. 11
        if second == "adagrad":
            v = v + d**2  # l. 12
        elif second == "yogi":
            v = v - (1 - b2) * d**2 * np.sign(v - d**2)  # l. 13
        else:
            v = b2 * v + (1 - b2) * d**2  # l. 14
        x = x + lr * m / (np.sqrt(v) + tau)  # l. 15
    return x, m, v


@pytest.mark.parametrize("cls,second", [(Adam, "adam"), (Yogi, "yogi"), (Adagrad, "adagrad")])
def test_adaptive_rules_follow_reddi_alg2(cls, second):
    ds = _deltas(2)
    x, m, v = _reddi(second, ds)
    got, state = _run(cls(lr=0.1), np.zeros(3), ds)
    np.testing.assert_allclose(got, x, rtol=1e-12, atol=0)
    np.testing.assert_allclose(state.exp_avg[0].numpy(), m, rtol=1e-12, atol=0)
    np.testing.assert_allclose(state.exp_avg_sq[0].numpy(), v, rtol=1e-12, atol=0)


def test_adam_flower_convention_step_size():
    """Flower's FedAdam: m, v from 0, x += η √(1 − β₂^{k+1})/(1 − β₁^{k+1}) m/(√v + τ), k = server round ≥ 1."""
    ds, lr, b1, b2, tau = _deltas(3), 0.1, 0.9, 0.99, 1e-3
    x, m, v = np.zeros(3), np.zeros(3), np.zeros(3)
    for k, d in enumerate(ds, start=1):
        m = b1 * m + (1 - b1) * d
        v = b2 * v + (1 - b2) * d**2
        x = x + lr * math.sqrt(1 - b2 ** (k + 1)) / (1 - b1 ** (k + 1)) * m / (np.sqrt(v) + tau)
    got, _ = _run(Adam(lr=lr, convention="flower"), np.zeros(3), ds)
    np.testing.assert_allclose(got, x, rtol=1e-12, atol=0)


def test_lamb_follows_you_et_al_alg2():
    """You et al. 2020, Alg. 2 on g = −Δ, one layer: bias-corrected Adam ratio r, x −= η ‖x‖/‖r‖ r (λ = 0)."""
    ds, lr, b1, b2, eps = _deltas(4), 0.01, 0.9, 0.999, 1e-6
    x0 = np.array([3.0, 4.0, 1.0])
    x, m, v = x0.copy(), np.zeros(3), np.zeros(3)
    for t, d in enumerate(ds, start=1):
        g = -d
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        r = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        x = x - lr * np.linalg.norm(x) / np.linalg.norm(r) * r
    got, _ = _run(LAMB(lr=lr), x0, ds)
    np.testing.assert_allclose(got, x, rtol=1e-12, atol=0)


def test_adaptive_stepsize_follows_malitsky_mishchenko_alg1():
    """Malitsky & Mishchenko 2020, Alg. 1: η_t = min(√(1+θ_{t−1}) η_{t−1}, ‖x_t − x_{t−1}‖ / (2‖g_t − g_{t−1}‖))."""
    a = np.array([1.0, 3.0])  # f(x) = ½ Σ a x², Δ = −∇f = −a x
    rule, params = AdaptiveStepSize(lr=0.05), [torch.tensor([1.0, 1.0], dtype=torch.float64)]
    state = rule.init(params)
    x, eta, theta, x_prev, g_prev = np.array([1.0, 1.0]), None, math.inf, None, None
    for t in range(1, 6):
        g = a * x
        if eta is None:
            new_eta, new_theta = 0.05, math.inf
        else:
            first = math.sqrt(1 + theta) * eta if math.isfinite(theta) else math.inf
            new_eta = min(first, np.linalg.norm(x - x_prev) / (2 * np.linalg.norm(g - g_prev)))
            new_theta = new_eta / eta
        x_prev, g_prev, eta, theta = x.copy(), g, new_eta, new_theta
        x = x - eta * g
        state = rule.update(params, [-torch.tensor(a) * params[0]], state, t)
        assert state.eta == pytest.approx(eta, rel=1e-12)
    np.testing.assert_allclose(params[0].numpy(), x, rtol=1e-12, atol=0)


@pytest.mark.parametrize("make,match", [
    (lambda: SGD(lr=0), "`lr`"), (lambda: Momentum(momentum=1.0), "`momentum`"),
    (lambda: Momentum(nesterov="yes"), "`nesterov`"), (lambda: Adam(convention="keras"), "`convention`"),
    (lambda: Adagrad(beta1=0.5, convention="tff"), "`beta1`"), (lambda: LAMB(phi_min=2.0, phi_max=1.0), "`phi_max`"),
    (lambda: AdaptiveStepSize(lr=-1.0), "`lr`"),
])
def test_rules_reject_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()
