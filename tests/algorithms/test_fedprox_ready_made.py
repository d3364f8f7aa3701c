"""FedProx end to end against a NumPy transcription of Li et al. 2020, Alg. 2 (client objective
F_k + μ/2‖w − w_t‖²), and its edge cases."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from helpers import (
    PLAIN_TRAINER_EMPTY_VAL, LinearRegression, SmallClassifier, classification_dataset, quiet_trainer_kwargs,
    regression_data)
from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import FedAvg
from lightning_fed.algorithms.fedprox import FedProx
from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule, IIDPartitioner


def _weights(model: LinearRegression) -> np.ndarray:
    return np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])


def _mse_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """∇_w mean((x·w[:-1] + w[-1] − y)²)."""
    xb = np.hstack([x, np.ones((len(x), 1))])
    return 2.0 / len(x) * xb.T @ (xb @ w - y)


def _datamodule(x, y, num_clients, clients_per_round, local_epochs):
    dm = FederatedDataModule(
        TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(num_clients=num_clients, seed=0),
        clients_per_round=clients_per_round, batch_size=1000, local_epochs=local_epochs,  # full batch
    )
    dm.setup()
    return dm


def _reference(w0, x, y, dm, rounds, local_steps, client_lr, mu, server_lr, weighting, momentum=0.0):
    """Li et al. 2020, Alg. 2: each sampled device runs `local_steps` full-batch (heavy-ball) SGD steps on
    h_k(w) = F_k(w) + μ/2‖w − w_t‖²; the server moves by η times the weighted mean of w_k − w_t."""
    w = w0.copy()
    for t in range(rounds):
        cohort = dm.sample_clients(t)
        deltas, sizes = [], []
        for cid in cohort:
            idx = dm.client_indices(cid)
            wk, buf = w.copy(), None
            for _ in range(local_steps):
                g = _mse_grad(wk, x[idx], y[idx]) + mu * (wk - w)
                buf = g if buf is None else momentum * buf + g
                wk = wk - client_lr * (buf if momentum else g)
            deltas.append(wk - w)
            sizes.append(len(idx))
        lam = np.array(sizes, float) if weighting == "num_samples" else np.ones(len(cohort))
        lam = lam / lam.sum()
        w = w + server_lr * (lam[:, None] * np.array(deltas)).sum(0)
    return w


@pytest.mark.parametrize(
    "num_clients,per_round,weighting", [(3, 3, "num_samples"), (5, 2, "uniform")], ids=["full", "partial-uniform"]
)
def test_fedprox_matches_numpy_alg2(tmp_path, num_clients, per_round, weighting):
    x, y = regression_data(n=40, seed=3)
    dm = _datamodule(x, y, num_clients, per_round, local_epochs=4)
    torch.manual_seed(0)
    model = LinearRegression(lr=0.1)
    w0 = _weights(model)
    server = FedProx(mu=0.8, lr=0.7, weighting=weighting)
    FederatedTrainer(max_epochs=2, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    want = _reference(w0, x, y, dm, rounds=2, local_steps=4, client_lr=0.1, mu=0.8, server_lr=0.7, weighting=weighting)
    np.testing.assert_allclose(_weights(model), want, rtol=0, atol=1e-10)
    fedavg = _reference(w0, x, y, dm, 2, local_steps=4, client_lr=0.1, mu=0.0, server_lr=0.7, weighting=weighting)
    assert np.abs(want - fedavg).max() > 1e-3, "the proximal term must matter in this test"


def test_proximal_gradient_goes_through_the_client_optimizer(tmp_path):
    """With SGD momentum the corrected gradient ∇F_k + μ(w − w_t) is what enters the momentum buffer."""

    class Momentum(LinearRegression):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    x, y = regression_data(n=30, seed=4)
    dm = _datamodule(x, y, num_clients=3, clients_per_round=3, local_epochs=3)
    torch.manual_seed(1)
    model = Momentum(lr=0.05)
    w0 = _weights(model)
    FederatedTrainer(max_epochs=2, callbacks=[FedProx(mu=2.0)], **quiet_trainer_kwargs(tmp_path)).fit(
        model, datamodule=dm
    )
    want = _reference(w0, x, y, dm, 2, 3, client_lr=0.05, mu=2.0, server_lr=1.0, weighting="num_samples", momentum=0.9)
    np.testing.assert_allclose(_weights(model), want, rtol=0, atol=1e-10)


def _classifier_run(tmp_path, server):
    torch.manual_seed(0)
    model = SmallClassifier(dropout=0.2)
    data, val = classification_dataset(n=240, n_val=40)
    dm = FederatedDataModule(
        data, val_dataset=val, partitioner=DirichletPartitioner(num_clients=8, alpha=0.5, seed=0),
        clients_per_round=3, batch_size=8, local_epochs=2,
    )
    FederatedTrainer(max_epochs=2, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    return model


def test_mu_zero_is_fedavg_exactly(tmp_path):
    a = _classifier_run(tmp_path / "a", FedProx(mu=0.0))
    b = _classifier_run(tmp_path / "b", FedAvg())
    c = _classifier_run(tmp_path / "c", FedProx(mu=0.5))
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert any(not torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


@pytest.mark.filterwarnings(PLAIN_TRAINER_EMPTY_VAL)
def test_plain_trainer_is_refused(tmp_path):
    """Under a plain lightning.Trainer (centralized) the callback would silently do nothing: refused (issue #11.2)."""
    x, y = regression_data(n=20)
    dm = _datamodule(x, y, num_clients=2, clients_per_round=1, local_epochs=1)
    trainer = L.Trainer(max_epochs=1, callbacks=[FedProx(mu=5.0)], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(RuntimeError, match="FederatedTrainer"):
        trainer.fit(LinearRegression(lr=0.1), datamodule=dm)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"mu": -0.1}, r"`mu` must be a finite number >= 0, got -0.1"),
        ({"mu": float("nan")}, r"`mu` must be a finite number >= 0, got nan"),
        ({"mu": float("inf")}, r"`mu` must be a finite number >= 0, got inf"),
        ({"mu": True}, r"`mu` must be a finite number >= 0, got True"),
        ({"mu": "0.1"}, r"`mu` must be a finite number >= 0, got '0.1'"),
        ({"mu": 0.1, "lr": 0.0}, r"`lr` must be a finite number > 0, got 0.0"),
        ({"mu": 0.1, "weighting": "mean"}, r"`weighting` must be one of .*got 'mean'"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedProx(**kwargs)


def test_mu_is_required_and_shown():
    with pytest.raises(TypeError):
        FedProx()  # type: ignore[call-arg]
    assert repr(FedProx(mu=0.01, lr=0.5)) == "FedProx(mu=0.01, lr=0.5, weighting='num_samples')"
    assert FedProx(mu=0.01).state_key != FedProx(mu=0.1).state_key
