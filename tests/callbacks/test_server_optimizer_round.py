"""ServerOptimizer.round_step / undo_round_step: the federated loop's server step (issue #52) — no step without
updates, the round's weights, pseudo-gradient and gradient diversity against NumPy, and the undo of a step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.callbacks import FedAdam, FedAvg


def _updates():
    return [ClientUpdate(0, [torch.tensor([1.0, 0.0])], 1, 1, 0.0), ClientUpdate(1, [torch.tensor([0.0, 2.0])], 3, 1, 0.0)]


def test_round_step_returns_the_rounds_weights_pseudo_gradient_and_diversity():
    server, params = FedAvg(lr=1.0), [torch.zeros(2)]
    assert server.round_step(params, []) is None and server.num_steps == 0 and params[0].tolist() == [0.0, 0.0]
    step = server.round_step(params, _updates())
    w = np.array([0.25, 0.75])
    g = np.array([[1.0, 0.0], [0.0, 2.0]])
    mean = w @ g  # Δ_t = [0.25, 1.5]; D = √(Σ w_i‖g_i‖² / ‖Δ_t‖²) (Zeng et al. 2024, Eq. 3)
    np.testing.assert_allclose(step.weights.numpy(), w)
    np.testing.assert_allclose(step.pseudo_gradient[0].numpy(), mean)
    np.testing.assert_allclose(params[0].numpy(), mean)
    np.testing.assert_allclose(step.gradient_diversity(), np.sqrt((w * (g ** 2).sum(1)).sum() / (mean ** 2).sum()))
    assert step.releases_buffers and server.num_steps == 1


def test_undo_round_step_puts_back_the_state_from_before_the_step():
    server, params = FedAdam(lr=0.1), [torch.zeros(2)]
    server.round_step(params, _updates())
    before = {k: [t.clone() for t in v] for k, v in server.state.items()}
    step = server.round_step(params, _updates(), snapshot=True)
    assert server.num_steps == 2
    server.undo_round_step(params, step)
    assert server.num_steps == 1 and server.round_report is None
    assert all(torch.equal(a, b) for k in before for a, b in zip(server.state[k], before[k]))
    with pytest.raises(RuntimeError, match=r"undo_round_step: this round_step kept no snapshot"):
        server.undo_round_step(params, server.round_step(params, _updates()))
