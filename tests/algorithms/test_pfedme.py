"""pFedMe (issue #55) against a NumPy transcription of Dinh, Tran, Nguyen 2020, Alg. 1 — per local step K inner
steps θ ← θ − ν(∇f_i(θ; D) + λ(θ − w)) on the step's mini-batch (θ warm-started, from w_t at the round's start),
then w ← w − ηλ(w − θ̃); the server's β-mixing x ← (1 − β)x + β·mean w — several rounds, partial participation,
returning clients, deliberately wrong references, a resume equal to the uninterrupted run, FedAdam on the
pseudo-gradient, the personal model θ̃."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.test_ditto import GAMMA, _fit
from helpers import assert_resume_equals_uninterrupted, linear_weights, mse_grad, numpy_fedadam
from lightning_fed.algorithms import PFedMeClient
from lightning_fed.callbacks import FedAdam, FedAvg, PFedMe

LAM, NU, K, BETA = 2.0, 0.05, 3, 1.5


def _pfedme_reference(w0, x, y, dm, rounds, beta=BETA, variant="paper", server_step=None):
    """Alg. 1, l. 4-11. ``variant``: ``"wrong_cold_start"`` starts every inner solve from w_{i,r} instead of the
    previous θ̃; ``"wrong_no_mixing"`` replaces l. 11's β-mixing by the plain mean."""
    x_glob, personal = w0.copy(), {}
    for t in range(rounds):
        drifts = []
        for cid in dm.sample_clients(t):
            w, theta = x_glob.copy(), x_glob.copy()
            for batch in dm.client_batches(cid, t):
                if variant == "wrong_cold_start":
                    theta = w.copy()
                for _ in range(K):
                    theta = theta - NU * (mse_grad(theta, x[batch], y[batch]) + LAM * (theta - w))
                w = w - GAMMA * LAM * (w - theta)
            personal[int(cid)] = theta
            drifts.append(w - x_glob)
        mean_w = x_glob + np.mean(drifts, axis=0)
        if server_step is not None:
            x_glob = server_step(x_glob, mean_w - x_glob)
        else:
            x_glob = mean_w if variant == "wrong_no_mixing" else (1 - beta) * x_glob + beta * mean_w
    return x_glob, personal


@pytest.mark.parametrize("variant", ["paper", "wrong_cold_start", "wrong_no_mixing"])
def test_pfedme_equals_numpy_algorithm_1(tmp_path, variant):
    server = PFedMe(lam=LAM, inner_steps=K, personal_lr=NU, lr=BETA)
    x, y, dm, w0, model, _ = _fit(tmp_path, server, rounds=4)
    cohorts = [[int(c) for c in dm.sample_clients(t)] for t in range(4)]
    assert len({c for cohort in cohorts for c in cohort}) < sum(map(len, cohorts))  # some client comes back
    want_x, want = _pfedme_reference(w0, x, y, dm, rounds=4, variant=variant)
    table = server.client_algorithm_states["PFedMeClient"]
    assert sorted(table.ids()) == sorted(want)
    close = np.allclose(linear_weights(model), want_x, rtol=1e-9, atol=1e-12) and all(
        np.allclose(table.get(c).numpy(), want[c], rtol=1e-9, atol=1e-12) for c in want)
    assert close == (variant == "paper")
    if variant == "paper":
        np.testing.assert_allclose(linear_weights(model), want_x, rtol=1e-12, atol=1e-13)
        half = server.client_algorithms[0]
        half.personal_model(model, table.get(cohorts[-1][0]))  # the personal model is θ̃
        np.testing.assert_allclose(linear_weights(model), want[cohorts[-1][0]], rtol=1e-12, atol=1e-13)


def test_the_server_rule_sgd_with_lr_beta_is_the_beta_mixing(tmp_path):
    """l. 11 is FedAvg(lr=β, uniform) exactly: the ready-made name and the half under that rule agree bit for bit."""
    *_, a, _ = _fit(tmp_path, PFedMe(lam=LAM, inner_steps=K, personal_lr=NU, lr=BETA), rounds=3)
    *_, b, _ = _fit(tmp_path, FedAvg(lr=BETA, weighting="uniform"), rounds=3,
                    client_algorithms=[PFedMeClient(lam=LAM, inner_steps=K, personal_lr=NU)])
    assert np.array_equal(linear_weights(a), linear_weights(b))


def test_pfedme_under_fedadam_equals_numpy(tmp_path):
    """Any server rule on the pseudo-gradient mean_i w_{i,R} − x (FedAdam, Reddi et al. 2021, Alg. 2, τ = 1e-3)."""
    x, y, dm, w0, model, _ = _fit(tmp_path, FedAdam(lr=0.01, weighting="uniform"), rounds=3,
                                  client_algorithms=[PFedMeClient(lam=LAM, inner_steps=K, personal_lr=NU)])
    want_x, _ = _pfedme_reference(w0, x, y, dm, rounds=3, server_step=numpy_fedadam())
    np.testing.assert_allclose(linear_weights(model), want_x, rtol=1e-10, atol=1e-12)


def test_pfedme_resume_equals_the_uninterrupted_run(tmp_path):
    assert_resume_equals_uninterrupted(tmp_path, _fit, lambda: PFedMe(lam=LAM, inner_steps=K, personal_lr=NU, lr=BETA),
                                       "PFedMeClient", linear_weights, rounds=3)


@pytest.mark.parametrize("kwargs, match", [
    ({"lam": 0.0}, r"`lam` must be"), ({"inner_steps": 0}, r"`inner_steps` must be"),
    ({"personal_lr": -1.0}, r"`personal_lr` must be"), ({"lr": 0.0}, r"`lr` must be"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PFedMe(**kwargs)


def test_the_ready_made_name_only_fixes_parts():
    from helpers import assert_ready_made_name

    assert_ready_made_name(PFedMe)


def test_the_inner_steps_equal_the_plain_out_of_place_loop_bit_for_bit():
    """Issue #55's cost change (Alg. 1, l. 6-8): the K inner steps by one ``PointGradients`` with in-place θ updates
    give the θ̃ and the gradient λ(w − θ̃) of the plain loop — a fresh copy of the model per gradient and
    θ ← θ − ν·(∇f(θ) + λ(θ − w)) out of place — bit for bit, over 2 local steps (the second warm-started from the
    first's θ̃), with BatchNorm and a metric the training step updates."""
    from types import SimpleNamespace

    import torch

    from helpers import MetricBNClassifier, classifier_batches, gradient_at_copy
    from lightning_fed.algorithms.pfedme import PFedMeClient

    model, batches, lam, nu, k = MetricBNClassifier().train(), classifier_batches(2), 15.0, 0.05, 3
    half = PFedMeClient(lam=lam, inner_steps=k, personal_lr=nu)
    half.start(model, SimpleNamespace(parameters=lambda m: list(m.parameters()), client_batches=lambda: batches),
               None)
    theta = [p.detach().clone() for p in model.parameters()]
    for batch in batches:
        w = [p.detach().clone() for p in model.parameters()]
        for _ in range(k):
            g = gradient_at_copy(model, theta, batch)
            theta = [t - nu * (gi + lam * (t - wi)) for t, gi, wi in zip(theta, g, w)]
        half.before_optimizer_step(model, None)
        assert all(torch.equal(a, b) for a, b in zip(half._theta, theta))
        assert all(torch.equal(p.grad, lam * (wi - t)) for p, wi, t in zip(model.parameters(), w, theta))
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(0.01 * p.grad)  # l. 8: the client's SGD step
