"""LG-FedAvg (issue #55) against a NumPy transcription of Liang et al. 2020, Alg. 1 — each client's local
representation (the body) kept per client, body and global head trained jointly at every local step, the head
averaged uniformly over the round's cohort (the authors' main_lg.py) — several rounds, partial participation,
returning clients, a resume equal to the uninterrupted run; the head under FedAdam; the personal model."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.test_fedper import BODY, GAMMA, HEAD, TwoLayer, datamodule, fit, grads, weights
from helpers import assert_resume_equals_uninterrupted, numpy_fedadam
from lightning_fed.algorithms import LGFedAvgClient
from lightning_fed.callbacks import FedAdam, LGFedAvg


def _lgfedavg_reference(w0, x, y, dm, rounds, shared=HEAD, server_step=None):
    """Alg. 1: every local step updates the client's own body θ_m^ℓ and the head θ^g together; the server's head is
    the uniform mean over S_t (``shared=HEAD + BODY``: the body averaged too, a deliberately wrong variant)."""
    glob, own = dict(w0), {}
    for t in range(rounds):
        drifts = []
        for cid in dm.sample_clients(t):
            w = {**glob, **own.get(int(cid), {})}
            for batch in dm.client_batches(cid, t):
                g = grads(w, x[batch], y[batch])
                w = {k: w[k] - GAMMA * g[k] for k in w}
            own[int(cid)] = {k: w[k] for k in BODY if k not in shared}
            drifts.append({k: w[k] - glob[k] for k in shared})
        delta = {k: np.mean([d[k] for d in drifts], axis=0) for k in shared}
        if server_step is None:
            glob.update({k: glob[k] + delta[k] for k in shared})
        else:
            server_step(glob, delta)
    return glob, own


@pytest.mark.parametrize("reference", ["paper", "wrong_body_averaged"])
def test_lgfedavg_equals_numpy_algorithm_1(tmp_path, reference):
    x, y, dm = datamodule()
    server = LGFedAvg(body=["net.0"])
    w0, model, _ = fit(tmp_path, server, rounds=4, dm=dm)
    cohorts = [[int(c) for c in dm.sample_clients(t)] for t in range(4)]
    assert len({c for cohort in cohorts for c in cohort}) < sum(map(len, cohorts))  # some client comes back
    want, own = _lgfedavg_reference(w0, x, y, dm, rounds=4, shared=HEAD if reference == "paper" else HEAD + BODY)
    got = weights(model)
    close = all(np.allclose(got[k], want[k], rtol=1e-9, atol=1e-12) for k in HEAD)
    assert close == (reference == "paper")  # FedAvg over the whole model is not LG-FedAvg
    assert all(np.array_equal(got[k], w0[k]) for k in BODY)  # the global body never moves
    table = server.client_algorithm_states["LGFedAvgClient"]
    if reference == "paper":
        assert sorted(table.ids()) == sorted(own)
        for cid, body in own.items():
            np.testing.assert_allclose(table.get(cid).numpy(), np.concatenate([body[k].ravel() for k in BODY]),
                                       rtol=1e-12, atol=1e-13)
        # the personal model: the client's own body under the current global head
        half = server.client_algorithms[0]
        half.personal_model(model, table.get(cohorts[-1][0]))
        mine = weights(model)
        assert all(np.array_equal(mine[k], got[k]) for k in HEAD)
        np.testing.assert_allclose(mine["net.0.weight"], own[cohorts[-1][0]]["net.0.weight"], rtol=1e-12)


def test_lgfedavgs_head_under_fedadam_equals_numpy(tmp_path):
    """Composable with any server rule: FedAdam (Reddi et al. 2021, Alg. 2, τ = 1e-3) on the uniform head mean."""
    x, y, dm = datamodule()
    server = FedAdam(lr=0.01, weighting="uniform")
    w0, model, _ = fit(tmp_path, server, rounds=3, dm=dm, client_algorithms=[LGFedAvgClient(body=["net.0"])])
    steps = {k: numpy_fedadam() for k in HEAD}

    def adam(glob, delta):
        glob.update({k: steps[k](glob[k], delta[k]) for k in HEAD})

    want, _ = _lgfedavg_reference(w0, x, y, dm, rounds=3, server_step=adam)
    got = weights(model)
    for k in HEAD:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12)
    assert all(np.array_equal(got[k], w0[k]) for k in BODY)


def test_lgfedavg_resume_equals_the_uninterrupted_run(tmp_path):
    def fit_rounds(path, server, rounds, ckpt_dir=None, ckpt_path=None):
        return fit(path, server, rounds, ckpt_dir=ckpt_dir, ckpt_path=ckpt_path)

    assert_resume_equals_uninterrupted(tmp_path, fit_rounds, lambda: LGFedAvg(body=["net.0"]), "LGFedAvgClient",
                                       weights)


@pytest.mark.parametrize("body, error, match", [
    ([], ValueError, r"`body` must name at least one"),
    ([3], TypeError, r"`names` must be a list of tensor or submodule names"),
])
def test_bad_body_is_refused(body, error, match):
    with pytest.raises(error, match=match):
        LGFedAvgClient(body=body)


def test_a_body_that_selects_nothing_is_refused_at_fit_start(tmp_path):
    from helpers import quiet_trainer_kwargs
    from lightning_fed import FederatedTrainer

    trainer = FederatedTrainer(max_epochs=1, callbacks=[LGFedAvg(body=["encoder"])], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"keeps nothing of TwoLayer"):
        trainer.fit(TwoLayer(), datamodule=datamodule()[2])
    assert trainer.global_step == 0


def test_the_ready_made_name_only_fixes_parts():
    from helpers import assert_ready_made_name

    assert_ready_made_name(LGFedAvg)
