"""APFL (issue #55) against a NumPy transcription of Deng, Kamani, Mahdavi 2020, Alg. 1 and eq. (10) — at every
local step w_i ← w_i − η∇f_i(w_i), v_i ← v_i − η·α_i∇f_i(v̄_i), α_i ← α_i − η_α⟨v_i − w_i, ∇f_i(v̄_i)⟩ on the same
mini-batch, the server's uniform mean of w — several rounds, partial participation, returning clients, a resume
equal to the uninterrupted run, FedAdam as the server rule, the personal model v̄_i = α_i v_i + (1 − α_i) w."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from algorithms.test_ditto import GAMMA, _fit
from helpers import assert_resume_equals_uninterrupted, linear_weights, mse_grad, numpy_fedadam
from lightning_fed.algorithms import APFLClient
from lightning_fed.callbacks import APFL, FedAdam, FedAvg

ETA_ALPHA = 0.05


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
    want_w, want = _apfl_reference(w0, x, y, dm, rounds=3, alpha0=0.25, server_step=numpy_fedadam())
    np.testing.assert_allclose(linear_weights(model), want_w, rtol=1e-10, atol=1e-12)
    got = _rows(server.client_algorithm_states["APFLClient"])
    for c in want:
        np.testing.assert_allclose(got[c][0], want[c][0], rtol=1e-9, atol=1e-12)
        assert abs(got[c][1] - want[c][1]) < 1e-9


def test_apfl_resume_equals_the_uninterrupted_run(tmp_path):
    assert_resume_equals_uninterrupted(tmp_path, _fit, lambda: APFL(alpha_lr=ETA_ALPHA), "APFLClient", linear_weights,
                                       rounds=3)


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


def test_the_ready_made_name_only_fixes_parts():
    from helpers import assert_ready_made_name

    assert_ready_made_name(APFL)
