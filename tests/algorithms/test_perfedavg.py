"""Per-FedAvg (issue #55) against a NumPy transcription of Fallah, Mokhtari, Ozdaglar 2020, Alg. 1 — per group of the
round's batches (D, D') (FO) or (D, D', D'') (HF): w̃ = w − α∇f(w; D), w ← w − β(I − α∇²f(w; D''))∇f(w̃; D'), the
HF product exact or by the paper's finite difference; the server's uniform mean — several rounds, partial
participation, returning clients, deliberately wrong references, a resume equal to the uninterrupted run, FedAdam as
the server rule, the personal model w − α∇f(w; D_i)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from algorithms.test_ditto import GAMMA as BETA
from algorithms.test_ditto import _fit
from helpers import LinearRegression, assert_resume_equals_uninterrupted, linear_weights, mse_grad, numpy_fedadam
from lightning_fed.algorithms import PerFedAvgClient
from lightning_fed.callbacks import FedAdam, PerFedAvg

ALPHA, DELTA = 0.1, 1e-3  # β is the client learning rate


def _hessian(x):
    xb = np.hstack([x, np.ones((len(x), 1))])
    return 2.0 / len(x) * xb.T @ xb


def _perfedavg_reference(w0, x, y, dm, rounds, variant, delta=None, wrong=None, server_step=None):
    """Alg. 1, l. 5-10, batches grouped in order. ``wrong``: ``"no_hessian"`` drops HF's Hessian term (FO's step
    with HF's grouping); ``"same_batch"`` uses D for D' as well."""
    w, last = w0.copy(), {}
    size = 2 if variant == "fo" else 3
    for t in range(rounds):
        drifts = []
        for cid in dm.sample_clients(t):
            wk, batches = w.copy(), dm.client_batches(cid, t)
            for j in range(len(batches) // size):
                d, d1 = batches[size * j], batches[size * j + (0 if wrong == "same_batch" else 1)]
                adapted = wk - ALPHA * mse_grad(wk, x[d], y[d])
                g1 = mse_grad(adapted, x[d1], y[d1])
                step = g1
                if variant == "hf" and wrong != "no_hessian":
                    d2 = batches[size * j + 2]
                    if delta is None:
                        hv = _hessian(x[d2]) @ g1
                    else:
                        plus, minus = mse_grad(wk + delta * g1, x[d2], y[d2]), mse_grad(wk - delta * g1, x[d2], y[d2])
                        hv = (plus - minus) / (2 * delta)
                    step = g1 - ALPHA * hv
                wk = wk - BETA * step
            last[int(cid)] = t
            drifts.append(wk - w)
        delta_mean = np.mean(drifts, axis=0)
        w = w + delta_mean if server_step is None else server_step(w, delta_mean)
    return w, last


@pytest.mark.parametrize("variant, delta, wrong", [
    ("fo", None, None), ("hf", None, None), ("hf", DELTA, None),
    ("hf", None, "no_hessian"), ("fo", None, "same_batch"),
])
def test_perfedavg_equals_numpy_algorithm_1(tmp_path, variant, delta, wrong):
    server = PerFedAvg(alpha=ALPHA, variant=variant, delta=delta)
    x, y, dm, w0, model, _ = _fit(tmp_path, server, rounds=3)
    cohorts = [[int(c) for c in dm.sample_clients(t)] for t in range(3)]
    assert len({c for cohort in cohorts for c in cohort}) < sum(map(len, cohorts))  # some client comes back
    want_w, last = _perfedavg_reference(w0, x, y, dm, rounds=3, variant=variant, delta=delta, wrong=wrong)
    close = np.allclose(linear_weights(model), want_w, rtol=1e-9, atol=1e-12)
    assert close == (wrong is None)
    if wrong is None:
        np.testing.assert_allclose(linear_weights(model), want_w, rtol=1e-9 if delta else 1e-12, atol=1e-12)
        table = server.client_algorithm_states["PerFedAvgClient"]
        assert {c: int(table.get(c)[0]) for c in table.ids()} == last
        cid = cohorts[-1][0]  # the personal model: one step of size α on its first batch of its last round
        server.client_algorithms[0].personal_model(model, table.get(cid))
        d = dm.client_batches(cid, last[cid])[0]
        np.testing.assert_allclose(linear_weights(model), want_w - ALPHA * mse_grad(want_w, x[d], y[d]),
                                   rtol=1e-9, atol=1e-12)


def test_perfedavg_under_fedadam_equals_numpy(tmp_path):
    """Any server rule (FedAdam, Reddi et al. 2021, Alg. 2, τ = 1e-3) on the uniform mean of the clients' Δ."""
    x, y, dm, w0, model, _ = _fit(tmp_path, FedAdam(lr=0.01, weighting="uniform"), rounds=3,
                                  client_algorithms=[PerFedAvgClient(alpha=ALPHA, variant="hf")])
    want_w, _ = _perfedavg_reference(w0, x, y, dm, rounds=3, variant="hf", server_step=numpy_fedadam())
    np.testing.assert_allclose(linear_weights(model), want_w, rtol=1e-10, atol=1e-12)


def test_perfedavg_resume_equals_the_uninterrupted_run(tmp_path):
    assert_resume_equals_uninterrupted(tmp_path, _fit, lambda: PerFedAvg(alpha=ALPHA, variant="hf"), "PerFedAvgClient",
                                       linear_weights, rounds=3)


@pytest.mark.parametrize("kwargs, match", [
    ({"alpha": 0.0}, r"`alpha` must be"), ({"variant": "so"}, r"`variant` must be one of \('fo', 'hf'\)"),
    ({"variant": "fo", "delta": 1e-3}, r"`delta` is the HF variant's"),
    ({"variant": "hf", "delta": -1.0}, r"`delta` must be"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PerFedAvgClient(**kwargs)


def test_the_personal_model_needs_the_clients_data():
    half = PerFedAvgClient()
    with pytest.raises(RuntimeError, match="attached to a trainer with a FederatedDataModule"):
        half.personal_model(LinearRegression(), torch.tensor([0.0, 1.0]))


def test_the_ready_made_name_only_fixes_parts():
    from helpers import assert_ready_made_name

    assert_ready_made_name(PerFedAvg)
