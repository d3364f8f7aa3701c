"""``convention="flower"`` / ``"tff"`` of the adaptive server optimizers against NumPy re-implementations of each
framework's formula, written from their sources:

* Flower: ``framework/py/flwr/server/strategy/fedadam.py`` (adap/flower @ aa9582d, ``FedAdam.aggregate_fit``,
  l. 157-186), ``fedyogi.py`` and ``fedadagrad.py`` (same method): m, v start at 0; FedAdam's
  ``eta_norm = eta·sqrt(1 − beta_2^(server_round + 1))/(1 − beta_1^(server_round + 1))`` with ``server_round``
  1, 2, ... (``Server.fit``); ``x + eta·m/(sqrt(v) + tau)``; FedAdagrad passes ``beta_1=0.0``.
* TFF: ``tensorflow_federated/python/learning/optimizers/adam.py``, ``yogi.py``, ``adagrad.py``
  (google-parfait/tensorflow-federated, ``_Adam.next`` etc.), applied to the gradient g = −Δ:
  ``acc + (g − acc)(1 − beta_1)``; Adam ``s + (g² − s)(1 − beta_2)``, Yogi ``s + (1 − beta_2)·sign(g² − s)·g²``;
  ``normalized_lr = lr·sqrt(1 − beta_2^t)/(1 − beta_1^t)``, t = 1, 2, ...; ``w − normalized_lr·acc/(sqrt(s) + eps)``;
  Adagrad ``s + g²``, ``w − lr·g/sqrt(s + eps)``, preconditioner starting at 0.1 (Yogi: 1e-6).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.callbacks import FedAdagrad, FedAdam, FedYogi
from lightning_fed.callbacks.server_step_size import NormalizedFedAdagrad, NormalizedFedAdam, NormalizedFedYogi

LR, B1, B2, TAU = 0.05, 0.9, 0.99, 1e-3


def _deltas(rounds=7, seed=0):
    """Pseudo-gradients with magnitudes that change by orders of magnitude, so Yogi's sign flips both ways."""
    rng = np.random.default_rng(seed)
    scales = [1.0, 1e-3, 2.0, 1e-2, 1e-4, 0.5, 3.0][:rounds]
    return [s * rng.standard_normal(6) for s in scales]


def _run_ours(server, deltas, x0):
    params = [torch.tensor(x0[:4].reshape(2, 2)), torch.tensor(x0[4:])]
    for d in deltas:
        update = ClientUpdate(client_id=0, delta=[torch.tensor(d[:4].reshape(2, 2)), torch.tensor(d[4:])],
                              num_samples=3, num_steps=1, loss=0.0)
        server.server_update(params, [update])  # one client: Δ_t = d exactly
    return np.concatenate([p.numpy().ravel() for p in params])


# ---------------------------------------------------------------------- NumPy re-implementations
def _flower(rule, deltas, x, eta=LR, beta_1=B1, beta_2=B2, tau=TAU):
    if rule == "adagrad":
        beta_1 = 0.0  # FedAdagrad.__init__ passes beta_1=0.0 to FedOpt
    m_t = np.zeros_like(x)
    v_t = np.zeros_like(x)
    for server_round, delta_t in enumerate(deltas, start=1):
        m_t = np.multiply(beta_1, m_t) + (1 - beta_1) * delta_t
        if rule == "adam":
            v_t = beta_2 * v_t + (1 - beta_2) * np.multiply(delta_t, delta_t)
            eta_norm = eta * np.sqrt(1 - np.power(beta_2, server_round + 1.0)) / (1 - np.power(beta_1, server_round + 1.0))
        elif rule == "yogi":
            v_t = v_t - (1.0 - beta_2) * np.multiply(delta_t, delta_t) * np.sign(v_t - np.multiply(delta_t, delta_t))
            eta_norm = eta
        else:
            v_t = v_t + np.multiply(delta_t, delta_t)
            eta_norm = eta
        x = x + eta_norm * m_t / (np.sqrt(v_t) + tau)
    return x


def _tff(rule, deltas, w, lr=LR, beta_1=B1, beta_2=B2, epsilon=TAU, initial_preconditioner_value=None):
    if rule == "adagrad":
        s = np.ones_like(w) * (0.1 if initial_preconditioner_value is None else initial_preconditioner_value)
        for delta in deltas:
            g = -delta
            s = s + np.square(g)
            w = w - lr * g / np.sqrt(s + epsilon)
        return w
    a = np.zeros_like(w)
    if rule == "adam":
        s = np.zeros_like(w)
    else:
        s = np.ones_like(w) * (1e-6 if initial_preconditioner_value is None else initial_preconditioner_value)
    for step, delta in enumerate(deltas, start=1):
        g = -delta
        a = a + (g - a) * (1 - beta_1)
        if rule == "adam":
            s = s + (np.square(g) - s) * (1 - beta_2)
        else:
            g2 = np.square(g)
            s = s + (1 - beta_2) * np.sign(g2 - s) * g2
        normalized_lr = lr * np.sqrt(1 - np.power(beta_2, step)) / (1 - np.power(beta_1, step))
        w = w - normalized_lr * a / (np.sqrt(s) + epsilon)
    return w


def _reddi(rule, deltas, x, bias_correction=False, beta1=B1):
    m = np.zeros_like(x)
    v = np.full_like(x, TAU**2)
    for k, d in enumerate(deltas, start=1):
        m = B1 * m + (1 - B1) * d if beta1 else d
        if rule == "adam":
            v = B2 * v + (1 - B2) * d * d
        elif rule == "yogi":
            v = v - (1 - B2) * d * d * np.sign(v - d * d)
        else:
            v = v + d * d
        if bias_correction:  # torch.optim.Adam's placement
            b2 = 0.0 if rule == "adagrad" else B2
            x = x + (LR / (1 - B1**k)) * m / (np.sqrt(v) / np.sqrt(1 - b2**k) + TAU)
        else:
            x = x + LR * m / (np.sqrt(v) + TAU)
    return x


def _make(rule, **kw):
    if rule == "adam":
        return FedAdam(lr=LR, beta1=B1, beta2=B2, tau=TAU, **kw)
    if rule == "yogi":
        return FedYogi(lr=LR, beta1=B1, beta2=B2, tau=TAU, **kw)
    return FedAdagrad(lr=LR, tau=TAU, **kw)


X0 = np.linspace(-1.0, 1.0, 6)


@pytest.mark.parametrize("rule", ["adam", "yogi", "adagrad"])
def test_flower_convention_matches_flowers_formula(rule):
    deltas = _deltas()
    got = _run_ours(_make(rule, convention="flower"), deltas, X0)
    np.testing.assert_allclose(got, _flower(rule, deltas, X0.copy()), rtol=1e-12, atol=1e-15)
    # and it is a different formula from the paper's default
    assert np.abs(got - _run_ours(_make(rule), deltas, X0)).max() > 1e-6


@pytest.mark.parametrize("rule", ["adam", "yogi", "adagrad"])
def test_tff_convention_matches_tffs_formula(rule):
    deltas = _deltas(seed=1)
    got = _run_ours(_make(rule, convention="tff"), deltas, X0)
    np.testing.assert_allclose(got, _tff(rule, deltas, X0.copy()), rtol=1e-12, atol=1e-15)
    assert np.abs(got - _run_ours(_make(rule), deltas, X0)).max() > 1e-6


@pytest.mark.parametrize("rule", ["yogi", "adagrad"])
def test_tff_initial_preconditioner_value_is_initial_accumulator(rule):
    deltas = _deltas(seed=2)
    got = _run_ours(_make(rule, convention="tff", initial_accumulator=0.3), deltas, X0)
    np.testing.assert_allclose(got, _tff(rule, deltas, X0.copy(), initial_preconditioner_value=0.3), rtol=1e-12)


def test_flower_adam_first_round_exponent_is_two():
    # Round 1 of Flower's FedAdam: m = (1−β₁)Δ, v = (1−β₂)Δ², η₁ = η·√(1−β₂²)/(1−β₁²) (server_round + 1 = 2).
    d = np.array([0.5, -2.0, 1e-3, 0.0, 4.0, -1e-2])
    got = _run_ours(_make("adam", convention="flower"), [d], X0)
    eta1 = LR * np.sqrt(1 - B2**2) / (1 - B1**2)
    want = X0 + eta1 * (1 - B1) * d / (np.sqrt((1 - B2) * d * d) + TAU)
    np.testing.assert_allclose(got, want, rtol=1e-13)


@pytest.mark.parametrize("rule", ["adam", "yogi", "adagrad"])
@pytest.mark.parametrize("bias_correction", [False, True])
def test_reddi_default_and_bias_correction_keep_their_formulas(rule, bias_correction):
    deltas = _deltas(seed=3)
    got = _run_ours(_make(rule, bias_correction=bias_correction), deltas, X0)
    np.testing.assert_allclose(got, _reddi(rule, deltas, X0.copy(), bias_correction), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("convention", ["flower", "tff"])
def test_normalized_variants_take_the_convention(convention):
    for make, rule in [(NormalizedFedAdam, "adam"), (NormalizedFedYogi, "yogi"), (NormalizedFedAdagrad, "adagrad")]:
        kwargs = dict(lr=LR, tau=TAU, convention=convention)
        if rule != "adagrad":
            kwargs.update(beta1=B1, beta2=B2)
        server = make(**kwargs)
        assert server.convention == convention and server.rule == rule
        if rule == "adagrad":
            assert server.beta1 == 0.0


def test_bad_convention_arguments_are_errors():
    with pytest.raises(ValueError, match=r"`convention` must be one of \('reddi', 'flower', 'tff'\), got 'keras'"):
        FedAdam(convention="keras")
    with pytest.raises(ValueError, match="`bias_correction=True` is the torch-style correction"):
        FedAdam(bias_correction=True, convention="flower")
    with pytest.raises(ValueError, match="starts the second moment v at 0"):
        FedYogi(convention="flower", initial_accumulator=1e-6)
    with pytest.raises(ValueError, match="starts the second moment v at 0"):
        FedAdam(convention="tff", initial_accumulator=0.1)
    with pytest.raises(ValueError, match="has no momentum"):
        FedAdagrad(convention="tff", beta1=0.9)
    with pytest.raises(ValueError, match="has no momentum"):
        NormalizedFedAdagrad(convention="flower", beta1=0.5)
    assert FedAdagrad().beta1 == 0.9 and FedAdagrad(convention="flower").beta1 == 0.0
    assert FedAdam(convention="flower").initial_accumulator == 0.0
    assert FedYogi(convention="tff").initial_accumulator == 1e-6
    assert FedAdagrad(convention="tff").initial_accumulator == 0.1
    assert FedAdam().initial_accumulator == pytest.approx(1e-6)  # τ² (Reddi et al.)
