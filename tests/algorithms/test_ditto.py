"""Ditto (issue #41) against a NumPy transcription of Li et al. 2021, Alg. 1 — the global model trained as FedAvg
(uniform mean), each client's personal model v_k stepping on its own batches towards w^t — several rounds, partial
participation, returning clients, a resume equal to the uninterrupted run; the personal steps leave the round's
logged values and the global model exactly as FedAvg's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from helpers import LinearRegression, federated_fit, linear_weights, mse_grad, regression_data
from lightning_fed.algorithms import DittoClient
from lightning_fed.callbacks import Ditto, FedAvg
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, SampledLocalWork

GAMMA = 0.05


def _datamodule():
    x, y = regression_data(n=60, d=3, seed=2)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3,
                             local_work=SampledLocalWork(epochs=[1, 2], batch_size=[3, 6], seed=1))
    dm.setup()
    return x, y, dm


def _fit(tmp_path, server, rounds, ckpt_dir=None, ckpt_path=None, **trainer_kwargs):
    x, y, dm = _datamodule()
    torch.manual_seed(0)
    model = LinearRegression(lr=GAMMA)
    w0 = linear_weights(model)
    trainer = federated_fit(tmp_path, model, dm, server, rounds, ckpt_dir, ckpt_path, **trainer_kwargs)
    return x, y, dm, w0, model, trainer


def _ditto_reference(w0, x, y, dm, rounds, lam, eta):
    """Alg. 1: l. 5 local SGD from w^t; l. 6-7 v_k ← v_k − η(∇F_k(v_k) + λ(v_k − w^t)) once per local batch (v_k
    starts from w^t the first time); l. 10 the uniform mean of the Δ_k."""
    w, v = w0.copy(), {}
    for t in range(rounds):
        drifts = []
        for cid in dm.sample_clients(t):
            wk = w.copy()
            batches = dm.client_batches(cid, t)
            for batch in batches:
                wk = wk - GAMMA * mse_grad(wk, x[batch], y[batch])
            vk = v.get(int(cid), w.copy())
            for batch in batches:
                vk = vk - eta * (mse_grad(vk, x[batch], y[batch]) + lam * (vk - w))
            v[int(cid)] = vk
            drifts.append(wk - w)
        w = w + np.mean(drifts, axis=0)
    return w, v


def test_ditto_equals_numpy_algorithm_1(tmp_path):
    server = Ditto(lam=0.5)
    x, y, dm, w0, model, _ = _fit(tmp_path, server, rounds=5)
    cohorts = [[int(c) for c in dm.sample_clients(t)] for t in range(5)]
    assert len({c for cohort in cohorts for c in cohort}) < sum(map(len, cohorts))  # some client comes back
    want_w, want_v = _ditto_reference(w0, x, y, dm, rounds=5, lam=0.5, eta=GAMMA)
    np.testing.assert_allclose(linear_weights(model), want_w, rtol=1e-12, atol=1e-13)
    table = server.client_algorithm_states["DittoClient"]
    assert sorted(table.ids()) == sorted(want_v)
    for cid, vk in want_v.items():
        np.testing.assert_allclose(table.get(cid).numpy(), vk, rtol=1e-12, atol=1e-13)
    # λ matters: a personal model far from the global one with λ = 0 (purely local)
    _, local_v = _ditto_reference(w0, x, y, dm, rounds=5, lam=0.0, eta=GAMMA)
    assert not np.allclose(local_v[cohorts[-1][0]], want_v[cohorts[-1][0]], rtol=1e-6, atol=0)


def test_the_personal_steps_leave_the_global_model_and_the_logged_values_as_fedavgs(tmp_path):
    """The issue's Ditto written by hand called training_step from finish: self.log raised (every client dropped)
    or train values were contaminated. personal_step keeps them apart: the global model and train_loss are FedAvg's
    (uniform) bit for bit, with a personal step size of its own."""
    *_, ditto, t1 = _fit(tmp_path, FedAvg(weighting="uniform"), rounds=3, client_algorithms=[DittoClient(1.0, lr=0.1)])
    *_, plain, t2 = _fit(tmp_path, FedAvg(weighting="uniform"), rounds=3)
    assert np.array_equal(linear_weights(ditto), linear_weights(plain))
    assert torch.equal(t1.callback_metrics["train_loss"], t2.callback_metrics["train_loss"])
    assert t1.callback_metrics["round_clients"] == 3


def test_ditto_resume_equals_the_uninterrupted_run(tmp_path):
    full_server = Ditto(lam=0.5)
    *_, full, _ = _fit(tmp_path / "a", full_server, rounds=4)
    _fit(tmp_path / "b", Ditto(lam=0.5), rounds=2, ckpt_dir=tmp_path / "cb")
    server = Ditto(lam=0.5)
    *_, resumed, _ = _fit(tmp_path / "b", server, rounds=4, ckpt_dir=tmp_path / "cb2",
                          ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    assert np.array_equal(linear_weights(full), linear_weights(resumed))
    ta, tb = full_server.client_algorithm_states["DittoClient"], server.client_algorithm_states["DittoClient"]
    assert sorted(ta.ids()) == sorted(tb.ids()) and all(torch.equal(ta.get(c), tb.get(c)) for c in ta.ids())


@pytest.mark.parametrize("kwargs, match", [({"lam": -1.0}, "`lam` must be"), ({"lr": 0.0}, "`lr` must be")])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DittoClient(**kwargs)


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`:UserWarning")
def test_with_a_frozen_encoder_the_personal_models_cover_only_the_trained_parameters(tmp_path):
    from helpers import fit_frozen_pair, same_head

    frozen, head_only, trainer, reference = fit_frozen_pair(tmp_path, lambda: Ditto(lam=0.5))
    assert same_head(frozen, head_only)
    table = trainer.fit_loop.server_optimizer.client_algorithm_states["DittoClient"]
    expected = reference.fit_loop.server_optimizer.client_algorithm_states["DittoClient"]
    assert table.dim == 7 and table.ids() == expected.ids()
    assert all(torch.equal(table.get(i), expected.get(i)) for i in table.ids())
    half = trainer.fit_loop.client_runner.client_halves.algorithms[0]
    encoder = frozen.encoder.weight.clone()
    half.personal_model(frozen, table.get(table.ids()[0]))  # v_k into the head; the encoder untouched
    assert torch.equal(frozen.encoder.weight, encoder) and torch.equal(frozen.head.bias, table.get(table.ids()[0])[-1:])
