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


def _ditto_reference(w0, x, y, dm, rounds, lam, eta, start_from_initial=False, server_step=None):
    """Alg. 1: l. 5 local SGD from w^t; l. 6-7 v_k ← v_k − η(∇F_k(v_k) + λ(v_k − w^t)) once per local batch (v_k
    starts from w^t the first time, or from w^0 as the authors' code does); l. 10 the uniform mean of the Δ_k."""
    w, v = w0.copy(), {}
    for t in range(rounds):
        drifts = []
        for cid in dm.sample_clients(t):
            wk = w.copy()
            batches = dm.client_batches(cid, t)
            for batch in batches:
                wk = wk - GAMMA * mse_grad(wk, x[batch], y[batch])
            vk = v.get(int(cid), (w0 if start_from_initial else w).copy())
            for batch in batches:
                vk = vk - eta * (mse_grad(vk, x[batch], y[batch]) + lam * (vk - w))
            v[int(cid)] = vk
            drifts.append(wk - w)
        w = w + np.mean(drifts, axis=0) if server_step is None else server_step(w, np.mean(drifts, axis=0))
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


@pytest.mark.parametrize("reference", ["initial", "wrong_global"])
def test_ditto_personal_init_initial_starts_every_v_k_from_w0(tmp_path, reference):
    """personal_init="initial" (the authors' code): a client sampled for the first time in round t > 0 starts v_k
    from w^0, not w^t; equal to the NumPy reference, and unequal to the reference starting from w^t."""
    server = Ditto(lam=0.5, personal_init="initial")
    x, y, dm, w0, model, _ = _fit(tmp_path, server, rounds=4)
    first_seen = {}
    for t in range(4):
        for c in dm.sample_clients(t):
            first_seen.setdefault(int(c), t)
    assert max(first_seen.values()) > 0  # some client joins after round 0
    want_w, want_v = _ditto_reference(w0, x, y, dm, rounds=4, lam=0.5, eta=GAMMA,
                                      start_from_initial=reference == "initial")
    np.testing.assert_allclose(linear_weights(model), want_w, rtol=1e-12, atol=1e-13)
    table = server.client_algorithm_states["DittoClient"]
    late = [c for c, t in first_seen.items() if t > 0]
    got = {c: table.get(c).numpy() for c in late}
    if reference == "initial":
        for cid, vk in want_v.items():
            np.testing.assert_allclose(table.get(cid).numpy(), vk, rtol=1e-12, atol=1e-13)
    else:
        assert all(not np.allclose(got[c], want_v[c], rtol=1e-9, atol=0) for c in late)


def test_ditto_personal_init_initial_resume_equals_the_uninterrupted_run(tmp_path):
    """w^0 is recorded in round 0 and checkpointed with the chain's state: a resume at round 2 (before some client
    is first sampled) continues from it, bit for bit."""
    full_server = Ditto(lam=0.5, personal_init="initial")
    _, _, dm, w0, full, _ = _fit(tmp_path / "a", full_server, rounds=4)
    before = {int(c) for t in range(2) for c in dm.sample_clients(t)}
    assert {int(c) for c in dm.sample_clients(2)} - before  # a client first sampled after the resume
    _fit(tmp_path / "b", Ditto(lam=0.5, personal_init="initial"), rounds=2, ckpt_dir=tmp_path / "cb")
    server = Ditto(lam=0.5, personal_init="initial")
    *_, resumed, _ = _fit(tmp_path / "b", server, rounds=4, ckpt_dir=tmp_path / "cb2",
                          ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    assert np.array_equal(linear_weights(full), linear_weights(resumed))
    ta, tb = full_server.client_algorithm_states["DittoClient"], server.client_algorithm_states["DittoClient"]
    assert sorted(ta.ids()) == sorted(tb.ids()) and all(torch.equal(ta.get(c), tb.get(c)) for c in ta.ids())


def test_ditto_personal_init_initial_under_fedadam_with_its_server_half(tmp_path):
    """Any server rule with DittoInitialModel in its chain: FedAdam (Reddi et al. 2021, Alg. 2, τ = 1e-3) on the
    uniform mean of the Δ_k; v_k from w^0."""
    from lightning_fed.algorithms import DittoInitialModel
    from lightning_fed.callbacks import FedAdam
    from lightning_fed.server.aggregators import WeightedMean

    server = FedAdam(lr=0.01, weighting="uniform", aggregators=[DittoInitialModel(), WeightedMean()])
    x, y, dm, w0, model, _ = _fit(tmp_path, server, rounds=3,
                                  client_algorithms=[DittoClient(lam=0.5, personal_init="initial")])
    m, v = np.zeros_like(w0), np.full_like(w0, 1e-6)

    def adam(w, delta):
        m[:] = 0.9 * m + 0.1 * delta
        v[:] = 0.99 * v + 0.01 * delta ** 2
        return w + 0.01 * m / (np.sqrt(v) + 1e-3)

    want_w, want_v = _ditto_reference(w0, x, y, dm, rounds=3, lam=0.5, eta=GAMMA, start_from_initial=True,
                                      server_step=adam)
    np.testing.assert_allclose(linear_weights(model), want_w, rtol=1e-10, atol=1e-12)
    table = server.client_algorithm_states["DittoClient"]
    for cid, vk in want_v.items():
        np.testing.assert_allclose(table.get(cid).numpy(), vk, rtol=1e-10, atol=1e-12)


def test_ditto_personal_init_initial_without_its_server_half_is_refused_at_fit_start(tmp_path):
    from lightning_fed.callbacks import FedAdam

    with pytest.raises(ValueError, match=r"DittoClient\(lam=0.5, lr=None, personal_init='initial'\) starts each "
                                         r"personal model from w\^0, which Ditto's server half DittoInitialModel "
                                         r"keeps: give FedAdam `aggregators=\[DittoInitialModel\(\), WeightedMean"):
        _fit(tmp_path, FedAdam(lr=0.01), rounds=1, client_algorithms=[DittoClient(lam=0.5, personal_init="initial")])


def test_ditto_personal_init_default_and_bad_value():
    assert repr(Ditto(lam=0.5)) == "Ditto(lam=0.5, personal_lr=None, lr=1.0, weighting='uniform')"
    assert Ditto(lam=0.5).aggregators is None and DittoClient().personal_init == "global"
    with pytest.raises(ValueError, match=r"`personal_init` must be one of \('global', 'initial'\), got 'w0'"):
        DittoClient(personal_init="w0")


def test_ditto_initial_model_stage_without_its_client_half_is_refused_at_fit_start(tmp_path):
    from lightning_fed.algorithms import DittoInitialModel
    from lightning_fed.server.aggregators import WeightedMean

    server = FedAvg(aggregators=[DittoInitialModel(), WeightedMean()])
    with pytest.raises(ValueError, match=r"DittoInitialModel in FedAvg's `aggregators` keeps w\^0 for "
                                         r"DittoClient\(personal_init='initial'\), which this run does not have"):
        _fit(tmp_path, server, rounds=1, client_algorithms=[DittoClient(lam=0.5)])
