"""Nastya's normalised direction Δ/(γ·n) with several optimizer parameter groups of different client learning
rates: each parameter is divided by its own group's γ (Malinovsky, Mishchenko, Richtárik, Alg. 1, l. 8: g_{t,m} is
the mean of the local gradients), checked against NumPy."""
from __future__ import annotations

import math
import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset
from helpers import LinearRegression, quiet_trainer_kwargs, regression_data
from lightning_fed import ClientUpdate, FederatedTrainer
from lightning_fed.callbacks.server_step_size import NormalizedFedAdam, ServerStepSize, normalized_direction
from lightning_fed.datamodules import ClientWork, FederatedDataModule, IIDPartitioner, LocalWork
GAMMA_W, GAMMA_B = 0.05, 0.2  # client learning rates of the weight group and of the bias group


STEPS = {0: 1, 1: 2, 2: 3}


class StepsByClient(LocalWork):
    def plan(self, cid, round_idx, num_samples):
        return ClientWork(epochs=1, batch_size=10**6, steps=STEPS[cid])


class TwoGroupRegression(LinearRegression):
    """The weight in one SGD group (γ_w), the bias in another (γ_b)."""

    def configure_optimizers(self):
        return torch.optim.SGD(
            [{"params": [self.linear.weight], "lr": GAMMA_W}, {"params": [self.linear.bias], "lr": GAMMA_B}]
        )


def _mse_grad(w, x, y):
    xb = np.hstack([x, np.ones((len(x), 1))])
    return 2.0 / len(x) * xb.T @ (xb @ w - y)


def _direction(w, x, y, gammas, n):
    """Alg. 1, l. 5-8 with per-coordinate γ: local full-batch SGD, then (x_t − x_{t,m}^n)/(γ·n) per coordinate,
    which is the mean of the n local gradients."""
    wi = w.copy()
    grads = []
    for _ in range(n):
        g = _mse_grad(wi, x, y)
        grads.append(g)
        wi = wi - gammas * g
    direction = (w - wi) / (gammas * n)
    np.testing.assert_allclose(direction, np.mean(grads, axis=0), rtol=1e-12)
    return direction


def test_unit_two_groups_each_divided_by_its_own_rate():
    rng = np.random.default_rng(0)
    deltas = [[rng.standard_normal((1, 3)), rng.standard_normal(1)] for _ in range(2)]
    updates = [
        ClientUpdate(client_id=i, delta=[torch.tensor(p) for p in d], num_samples=5, num_steps=s, loss=0.0,
                     client_lr=GAMMA_W, client_lrs=[GAMMA_W, GAMMA_B])
        for i, (d, s) in enumerate(zip(deltas, [2, 3]))
    ]
    got = normalized_direction(updates[0])
    np.testing.assert_allclose(got[0].numpy(), deltas[0][0] / (GAMMA_W * 2), rtol=1e-15)
    np.testing.assert_allclose(got[1].numpy(), deltas[0][1] / (GAMMA_B * 2), rtol=1e-15)

    eta = 0.7
    params = [torch.zeros(1, 3, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)]
    ServerStepSize(lr=eta).server_update(params, updates)
    want_w = eta * (deltas[0][0] / (GAMMA_W * 2) + deltas[1][0] / (GAMMA_W * 3)) / 2
    want_b = eta * (deltas[0][1] / (GAMMA_B * 2) + deltas[1][1] / (GAMMA_B * 3)) / 2
    np.testing.assert_allclose(params[0].numpy(), want_w, rtol=1e-14)
    np.testing.assert_allclose(params[1].numpy(), want_b, rtol=1e-14)


def test_trainer_with_two_param_groups_matches_numpy(tmp_path):
    x, y = regression_data(n=30, seed=4)
    dm = FederatedDataModule(
        TensorDataset(torch.tensor(x), torch.tensor(y)),
        partitioner=IIDPartitioner(num_clients=3, seed=0),
        clients_per_round=3,
        local_work=StepsByClient(),
    )
    dm.setup()
    parts = [dm.client_indices(c) for c in range(3)]
    torch.manual_seed(0)
    model = TwoGroupRegression()
    w = np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])
    eta, rounds = 0.3, 3
    FederatedTrainer(max_epochs=rounds, callbacks=[ServerStepSize(lr=eta)], **quiet_trainer_kwargs(tmp_path)).fit(
        model, datamodule=dm
    )
    got = np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])
    gammas = np.array([GAMMA_W] * 3 + [GAMMA_B])
    for _ in range(rounds):
        g = np.mean([_direction(w, x[parts[m]], y[parts[m]], gammas, STEPS[m]) for m in range(3)], axis=0)
        w = w - eta * g  # Alg. 1, l. 9-10
    np.testing.assert_allclose(got, w, rtol=0, atol=1e-10)


def test_parameter_without_a_rate_is_an_error_unless_it_did_not_move():
    frozen = ClientUpdate(client_id=3, delta=[torch.ones(2), torch.zeros(2)], num_samples=1, num_steps=2, loss=0.0,
                          client_lrs=[0.5, math.nan])
    out = normalized_direction(frozen)
    torch.testing.assert_close(out[0], torch.ones(2))
    torch.testing.assert_close(out[1], torch.zeros(2))
    moved = ClientUpdate(client_id=3, delta=[torch.ones(2), torch.ones(2)], num_samples=1, num_steps=2, loss=0.0,
                         client_lrs=[0.5, math.nan])
    with pytest.raises(ValueError, match=r"parameter 1 .* of client 3 has `ClientUpdate.client_lrs\[1\]` = nan"):
        normalized_direction(moved)
    wrong_length = ClientUpdate(client_id=3, delta=[torch.ones(2)], num_samples=1, num_steps=2, loss=0.0,
                                client_lrs=[0.5, 0.5])
    with pytest.raises(ValueError, match="one learning rate per parameter"):
        normalized_direction(wrong_length)
    with pytest.raises(ValueError, match=r"client_lrs\[0\]` = -0.1"):
        normalized_direction(ClientUpdate(client_id=3, delta=[torch.ones(2)], num_samples=1, num_steps=2, loss=0.0,
                                          client_lrs=[-0.1]))


def test_normalized_fedadam_uses_each_groups_rate():
    updates = [ClientUpdate(client_id=0, delta=[torch.tensor([0.1]), torch.tensor([0.4])], num_samples=1,
                            num_steps=2, loss=0.0, client_lr=0.1, client_lrs=[0.1, 0.4])]
    server = NormalizedFedAdam(lr=0.01)
    params = [torch.zeros(1, dtype=torch.float32), torch.zeros(1, dtype=torch.float32)]
    pseudo = server.server_update(params, updates)
    # both blocks have direction Δ/(γ·n) = 0.5: the same pseudo-gradient and the same Adam step
    torch.testing.assert_close(pseudo[0], pseudo[1], rtol=0, atol=0)
    torch.testing.assert_close(params[0], params[1], rtol=0, atol=0)
