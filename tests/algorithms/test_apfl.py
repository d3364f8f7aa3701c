"""APFL (issue #55) against a NumPy transcription of Deng, Kamani, Mahdavi 2020, Alg. 1 and eq. (10) — at every
local step w_i ← w_i − η∇f_i(w_i), v_i ← v_i − η·α_i∇f_i(v̄_i), α_i ← α_i − η_α⟨v_i − w_i, ∇f_i(v̄_i)⟩ on the same
mini-batch, the server's uniform mean of w — several rounds, partial participation, returning clients, a resume
equal to the uninterrupted run, FedAdam as the server rule, the personal model v̄_i = α_i v_i + (1 − α_i) w."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from helpers import LinearRegression, federated_fit, linear_weights, mse_grad, regression_data
from lightning_fed.algorithms import APFLClient
from lightning_fed.callbacks import APFL, FedAdam, FedAvg
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, SampledLocalWork

GAMMA, ETA_ALPHA = 0.05, 0.03


def _datamodule():
    x, y = regression_data(n=60, d=3, seed=3)
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


def _apfl_reference(w0, x, y, dm, rounds, alpha0, variant="paper", server_step=None):
    """Alg. 1 / eq. (10), every right-hand side at the step's start; α projected onto [0, 1]; a client's first round
    starts v from w^t. ``variant="wrong_v_gradient"`` steps v by ∇f(v̄) without the chain rule's factor α."""
    w, state = w0.copy(), {}
    for t in range(rounds):
        drifts = []
        for cid in dm.sample_clients(t):
            wk = w.copy()
            v, a = state.get(int(cid), (w.copy(), alpha0))
            for batch in dm.client_batches(cid, t):
                xb, yb = x[batch], y[batch]
                g = mse_grad(a * v + (1 - a) * wk, xb, yb)
                a_next = min(1.0, max(0.0, a - ETA_ALPHA * float((v - wk) @ g)))
                v = v - GAMMA * (1.0 if variant == "wrong_v_gradient" else a) * g
                wk = wk - GAMMA * mse_grad(wk, xb, yb)
                a = a_next
            state[int(cid)] = (v, a)
            drifts.append(wk - w)
        delta = np.mean(drifts, axis=0)
        w = w + delta if server_step is None else server_step(w, delta)
    return w, state


def _rows(table):
    return {c: (table.get(c).numpy()[:-1], float(table.get(c)[-1])) for c in table.ids()}


@pytest.mark.parametrize("variant", ["paper", "wrong_v_gradient"])
def test_apfl_equals_numpy_algorithm_1(tmp_path, variant):
    server = APFL(alpha=0.25, alpha_lr=ETA_ALPHA)
    x, y, dm, w0, model, _ = _fit(tmp_path, server, rounds=4)
    cohorts = [[int(c) for c in dm.sample_clients(t)] for t in range(4)]
    assert len({c for cohort in cohorts for c in cohort}) < sum(map(len, cohorts))  # some client comes back
    want_w, want = _apfl_reference(w0, x, y, dm, rounds=4, alpha0=0.25, variant=variant)
    np.testing.assert_allclose(linear_weights(model), want_w, rtol=1e-12, atol=1e-13)  # w: plain local SGD + mean
    got = _rows(server.client_algorithm_states["APFLClient"])
    assert sorted(got) == sorted(want)
    close = all(np.allclose(got[c][0], want[c][0], rtol=1e-9, atol=1e-12) and abs(got[c][1] - want[c][1]) < 1e-9
                for c in want)
    assert close == (variant == "paper")
    if variant == "paper":
        alphas = [a for _, a in want.values()]
        assert 0.0 in alphas and any(0.0 < a < 0.25 for a in alphas)  # α adapted: projected onto 0 and not
        half = server.client_algorithms[0]
        cid = cohorts[-1][0]
        half.personal_model(model, server.client_algorithm_states["APFLClient"].get(cid))  # v̄ = αv + (1 − α)w
        v, a = want[cid]
        np.testing.assert_allclose(linear_weights(model), a * v + (1 - a) * want_w, rtol=1e-9, atol=1e-12)


def test_apfl_with_a_fixed_alpha_and_the_global_model_as_fedavgs(tmp_path):
    """adaptive=False keeps α; the personal steps leave the global model and the logged train loss FedAvg's."""
    server = FedAvg(weighting="uniform")
    *_, model, t1 = _fit(tmp_path, server, rounds=3, client_algorithms=[APFLClient(alpha=0.5, adaptive=False)])
    *_, plain, t2 = _fit(tmp_path, FedAvg(weighting="uniform"), rounds=3)
    assert np.array_equal(linear_weights(model), linear_weights(plain))
    assert torch.equal(t1.callback_metrics["train_loss"], t2.callback_metrics["train_loss"])
    table = server.client_algorithm_states["APFLClient"]
    assert all(float(table.get(c)[-1]) == 0.5 for c in table.ids())


def test_apfl_under_fedadam_equals_numpy(tmp_path):
    """Any server rule on w (Alg. 1's mean replaced by FedAdam, Reddi et al. 2021, Alg. 2, τ = 1e-3)."""
    server = FedAdam(lr=0.01, weighting="uniform")
    x, y, dm, w0, model, _ = _fit(tmp_path, server, rounds=3,
                                  client_algorithms=[APFLClient(alpha=0.25, alpha_lr=ETA_ALPHA)])
    m, v = np.zeros_like(w0), np.full_like(w0, 1e-6)

    def adam(w, delta):
        m[:] = 0.9 * m + 0.1 * delta
        v[:] = 0.99 * v + 0.01 * delta ** 2
        return w + 0.01 * m / (np.sqrt(v) + 1e-3)

    want_w, want = _apfl_reference(w0, x, y, dm, rounds=3, alpha0=0.25, server_step=adam)
    np.testing.assert_allclose(linear_weights(model), want_w, rtol=1e-10, atol=1e-12)
    got = _rows(server.client_algorithm_states["APFLClient"])
    for c in want:
        np.testing.assert_allclose(got[c][0], want[c][0], rtol=1e-9, atol=1e-12)
        assert abs(got[c][1] - want[c][1]) < 1e-9


def test_apfl_resume_equals_the_uninterrupted_run(tmp_path):
    full_server = APFL(alpha_lr=ETA_ALPHA)
    *_, full, _ = _fit(tmp_path / "a", full_server, rounds=4)
    _fit(tmp_path / "b", APFL(alpha_lr=ETA_ALPHA), rounds=2, ckpt_dir=tmp_path / "cb")
    server = APFL(alpha_lr=ETA_ALPHA)
    *_, resumed, _ = _fit(tmp_path / "b", server, rounds=4, ckpt_dir=tmp_path / "cb2",
                          ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    assert np.array_equal(linear_weights(full), linear_weights(resumed))
    ta, tb = full_server.client_algorithm_states["APFLClient"], server.client_algorithm_states["APFLClient"]
    assert sorted(ta.ids()) == sorted(tb.ids()) and all(torch.equal(ta.get(c), tb.get(c)) for c in ta.ids())


@pytest.mark.parametrize("kwargs, match", [
    ({"alpha": 1.0}, r"`alpha` must be a finite number in \[0.0, 1.0\)"),
    ({"alpha": -0.1}, r"`alpha` must be"),
    ({"adaptive": "yes"}, r"`adaptive` must be a bool"),
    ({"lr": 0.0}, r"`lr` must be"),
    ({"alpha_lr": -1.0}, r"`alpha_lr` must be"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        APFLClient(**kwargs)
