"""FedProx's client half composed with other server optimizers (issue #30): FedProx clients under FedAdam against a
NumPy transcription of Li et al. 2020, Alg. 2 (client objective F_k + μ/2‖w − w_t‖²) and Reddi et al. 2021, Alg. 2
(FedAdam, v₋₁ = τ²), with mini-batches, heterogeneous local steps and partial participation; the combinations that
cannot work refused at fit start."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from helpers import LinearRegression, linear_weights, mse_grad, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.algorithms import FedProxClient
from lightning_fed.callbacks import FedAdam, FedAvg, FedProx, FedYogi
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, SampledLocalWork


def _datamodule(seed=0):
    x, y = regression_data(n=60, d=3, seed=seed)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3,
                             local_work=SampledLocalWork(epochs=[1, 3], batch_size=[2, 5], seed=1))
    dm.setup()
    return x, y, dm


def _fedprox_fedadam_reference(w0, x, y, dm, rounds, gamma, mu, eta, beta1=0.9, beta2=0.99, tau=1e-3):
    w, m, v = w0.copy(), np.zeros_like(w0), np.full_like(w0, tau**2)
    for t in range(rounds):
        deltas, sizes = [], []
        for cid in dm.sample_clients(t):
            wk = w.copy()
            for batch in dm.client_batches(cid, t):  # Li et al. Alg. 2, l. 6: SGD on F_k + μ/2‖w − w_t‖²
                wk = wk - gamma * (mse_grad(wk, x[batch], y[batch]) + mu * (wk - w))
            deltas.append(wk - w)
            sizes.append(dm.client_num_samples(cid))
        lam = np.array(sizes, float) / sum(sizes)
        delta = (lam[:, None] * np.array(deltas)).sum(0)
        m = beta1 * m + (1 - beta1) * delta            # Reddi et al. Alg. 2, l. 11
        v = beta2 * v + (1 - beta2) * delta**2         # l. 14 (FedAdam), v₋₁ = τ²
        w = w + eta * m / (np.sqrt(v) + tau)           # l. 15
    return w


def test_fedprox_clients_under_fedadam_equal_numpy(tmp_path):
    x, y, dm = _datamodule()
    model = LinearRegression(lr=0.05)
    w0 = linear_weights(model)
    server = FedAdam(lr=0.03, client=[FedProxClient(mu=0.5)])
    FederatedTrainer(max_epochs=4, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    expected = _fedprox_fedadam_reference(w0, x, y, dm, rounds=4, gamma=0.05, mu=0.5, eta=0.03)
    np.testing.assert_allclose(linear_weights(model), expected, rtol=1e-12, atol=1e-14)
    # and it is not plain FedAdam: the proximal term moved the result
    plain = _fedprox_fedadam_reference(w0, x, y, dm, rounds=4, gamma=0.05, mu=0.0, eta=0.03)
    assert np.abs(expected - plain).max() > 1e-4


def test_fedprox_is_fedavg_with_the_fedprox_client_bit_for_bit(tmp_path):
    runs = []
    for server in (FedProx(mu=0.3, lr=0.7), FedAvg(lr=0.7, client=[FedProxClient(mu=0.3)])):
        _, _, dm = _datamodule()
        torch.manual_seed(0)
        model = LinearRegression(lr=0.05)
        FederatedTrainer(max_epochs=3, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
        runs.append(linear_weights(model))
    assert np.array_equal(runs[0], runs[1])


@pytest.mark.parametrize("bad", [0.1, ["FedProxClient"], [FedYogi()]])
def test_client_must_be_client_algorithms(bad):
    with pytest.raises(TypeError, match=r"`client\[0\]` must be a client algorithm"):
        FedAdam(client=bad if isinstance(bad, list) else [bad])


def test_the_client_algorithms_are_in_the_run_record(tmp_path):
    from lightning_fed.checkpoint import run_config

    _, _, dm = _datamodule()
    server = FedYogi(lr=0.01, client=[FedProxClient(mu=0.25)])
    trainer = FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(LinearRegression(lr=0.05), datamodule=dm)
    assert run_config(trainer)["server_optimizer.client"] == ["FedProxClient(mu=0.25)"]


def test_dp_with_fedprox_clients_equals_numpy(tmp_path):
    """DP-FedAvg (McMahan et al. 2018, Alg. 1) over FedProx clients: each client's update (after its proximal local
    steps) clipped to S, the clipped sum over C clients divided by C, σ = 0 (no noise: the clipping alone, checked
    exactly), server η = 1."""
    from lightning_fed.callbacks import DPFedAvg

    x, y, dm = _datamodule()
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    w = linear_weights(model)
    server = DPFedAvg(clip_norm=0.05, noise_multiplier=0.0, target_delta=1e-3, client=[FedProxClient(mu=0.5)])
    FederatedTrainer(max_epochs=3, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    for t in range(3):
        clipped = []
        for cid in dm.sample_clients(t):
            wk = w.copy()
            for batch in dm.client_batches(cid, t):
                wk = wk - 0.05 * (mse_grad(wk, x[batch], y[batch]) + 0.5 * (wk - w))
            d = wk - w
            clipped.append(d * min(1.0, 0.05 / np.linalg.norm(d)))
        w = w + np.sum(clipped, axis=0) / 3
    # ClipUpdates guarantees ‖clipped‖ ≤ S after rounding: when S/‖Δ‖ overshoots by an ulp it shrinks the factor by
    # 1e-6 (relative), which a NumPy norm may or may not see: agreement to 1e-5 relative
    np.testing.assert_allclose(linear_weights(model), w, rtol=1e-5, atol=1e-9)


def test_the_vectorized_executor_never_skips_a_client_algorithm(tmp_path, caplog):
    """Client halves run in the client's local steps: the vectorized executor trains such a round sequentially (the
    same weights as the sequential executor) or, with on_unsupported="raise", refuses naming them."""
    from lightning_fed.client.vectorized import VectorizedExecutor

    results = []
    for executor in ("sequential", "vectorized"):
        _, _, dm = _datamodule()
        torch.manual_seed(0)
        model = LinearRegression(lr=0.05)
        trainer = FederatedTrainer(max_epochs=2, callbacks=[FedAdam(lr=0.03, client=[FedProxClient(mu=0.5)])],
                                   client_executor=executor, **quiet_trainer_kwargs(tmp_path))
        trainer.fit(model, datamodule=dm)
        results.append(linear_weights(model))
    assert np.array_equal(results[0], results[1])
    assert "training clients sequentially because server optimizer FedAdam runs client algorithms" in caplog.text
    _, _, dm = _datamodule()
    trainer = FederatedTrainer(max_epochs=1, callbacks=[FedAdam(lr=0.03, client=[FedProxClient(mu=0.5)])],
                               client_executor=VectorizedExecutor(on_unsupported="raise"),
                               **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"client algorithms \[FedProxClient\(mu=0.5\)\]"):
        trainer.fit(LinearRegression(lr=0.05), datamodule=dm)


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`:UserWarning")
def test_with_a_frozen_encoder_the_proximal_term_anchors_the_trained_parameters(tmp_path):
    from helpers import fit_frozen_pair, same_head

    frozen, head_only, _, _ = fit_frozen_pair(tmp_path, lambda: FedProx(mu=0.5))
    assert same_head(frozen, head_only)
