"""FedBABU (issue #55) against a NumPy transcription of Oh, Kim, Yun, ICLR 2022, Alg. 1 — local updates of the body
only, the head fixed at its initialisation (ClientBodyUpdate), the body's n_i/n mean (the server line) — several
rounds, partial participation, returning clients, a resume equal to the uninterrupted run; the body under FedAdam;
the personal model (the global model fine-tuned on the client's data for τ_f epochs) evaluated into
``fed_personal_*``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from algorithms.test_fedper import BODY, GAMMA, HEAD, TwoLayer, datamodule, fit, grads, weights
from helpers import federated_fit, numpy_fedadam, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.algorithms import FedBABUClient
from lightning_fed.callbacks import FedAdam, FedBABU
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.evaluation import FederatedEvaluation


def _fedbabu_reference(w0, x, y, dm, rounds, server_step=None, train_head=False):
    """Alg. 1: ClientBodyUpdate, SGD on the body with the head θ_cls^0 fixed; the n_i/n-weighted mean of the bodies.
    ``train_head`` is the deliberately wrong variant (FedAvg: the head trained and averaged too)."""
    glob = dict(w0)
    trained = (*BODY, *HEAD) if train_head else BODY
    for t in range(rounds):
        drifts, sizes = [], []
        for cid in dm.sample_clients(t):
            w = dict(glob)
            for batch in dm.client_batches(cid, t):
                g = grads(w, x[batch], y[batch])
                w = {k: (w[k] - GAMMA * g[k] if k in trained else w[k]) for k in w}
            drifts.append({k: w[k] - glob[k] for k in trained})
            sizes.append(dm.client_num_samples(cid))
        p = np.array(sizes, dtype=float) / sum(sizes)
        delta = {k: sum(pi * d[k] for pi, d in zip(p, drifts)) for k in trained}
        if server_step is None:
            glob.update({k: glob[k] + delta[k] for k in trained})
        else:
            server_step(glob, delta)
    return glob


@pytest.mark.parametrize("wrong", [False, True], ids=["algorithm_1", "wrong_reference_head_trained"])
def test_fedbabu_equals_numpy_algorithm_1(tmp_path, wrong):
    x, y, dm = datamodule()
    cohorts = [[int(c) for c in dm.sample_clients(t)] for t in range(4)]
    assert len({c for cohort in cohorts for c in cohort}) < sum(map(len, cohorts))  # some client comes back
    w0, model, _ = fit(tmp_path, FedBABU(head=["net.1"]), rounds=4, dm=dm)
    want, got = _fedbabu_reference(w0, x, y, dm, rounds=4, train_head=wrong), weights(model)
    close = all(np.allclose(got[k], want[k], rtol=1e-12, atol=1e-13) for k in (*BODY, *HEAD))
    assert close is not wrong
    assert all(np.array_equal(got[k], w0[k]) for k in HEAD)  # the head never moves (θ_G,cls^0)


def test_fedbabus_body_under_fedadam_equals_numpy(tmp_path):
    """Composable with any server rule: FedAdam (Reddi et al. 2021, Alg. 2, τ = 1e-3) on the n_i/n body mean."""
    x, y, dm = datamodule()
    w0, model, _ = fit(tmp_path, FedAdam(lr=0.01), rounds=3, dm=dm, client_algorithms=[FedBABUClient(head=["net.1"])])
    steps = {k: numpy_fedadam() for k in BODY}  # one FedAdam state per parameter

    def adam(glob, delta):
        glob.update({k: steps[k](glob[k], delta[k]) for k in BODY})

    want, got = _fedbabu_reference(w0, x, y, dm, rounds=3, server_step=adam), weights(model)
    for k in BODY:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12)
    assert all(np.array_equal(got[k], w0[k]) for k in HEAD)


def test_fedbabu_resume_equals_the_uninterrupted_run(tmp_path):
    _, full, _ = fit(tmp_path / "a", FedBABU(head=["net.1"]), rounds=4)
    fit(tmp_path / "b", FedBABU(head=["net.1"]), rounds=2, ckpt_dir=tmp_path / "cb")
    _, resumed, _ = fit(tmp_path / "b", FedBABU(head=["net.1"]), rounds=4, ckpt_dir=tmp_path / "cb2",
                        ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    a, b = weights(full), weights(resumed)
    assert all(np.array_equal(a[k], b[k]) for k in a)


class _Evaluated(TwoLayer):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x).squeeze(-1), y))


def _loss(w, x, y):
    """The mean squared error of TwoLayer with the parameters ``w`` on (x, y)."""
    out = ((x @ w["net.0.weight"].T + w["net.0.bias"]) @ w["net.1.weight"].T + w["net.1.bias"])[:, 0]
    return float(np.mean((out - y) ** 2))


@pytest.mark.parametrize("finetune", ["head", "full"])
def test_the_personal_model_is_the_global_model_fine_tuned_for_finetune_epochs(tmp_path, finetune):
    """fed_personal_val_loss of each client = the NumPy loss on its held-out data after τ_f = 2 epochs of SGD (the
    head only, or everything) from the global model on its training batches; the global model is left unchanged."""
    x, y = regression_data(n=60, d=3, seed=1)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2, batch_size=3,
                             eval_fraction=0.25, eval_clients_per_round="all", eval_batch_size=4)
    dm.setup()
    torch.manual_seed(0)
    model = _Evaluated()
    server = FedBABU(head=["net.1"], finetune_epochs=2, finetune=finetune)
    trainer = federated_fit(tmp_path, model, dm, server, rounds=2)
    glob = weights(model)
    last = next(cb for cb in trainer.callbacks if isinstance(cb, FederatedEvaluation)).last
    trained = HEAD if finetune == "head" else (*BODY, *HEAD)
    want, plain = [], []
    for cid in last.client_ids.tolist():
        steps = 2 * math.ceil(dm.client_num_samples(cid) / 3)
        w = dict(glob)
        for batch in dm.client_personalization_batches(cid, last.round, steps):
            g = grads(w, x[batch], y[batch])
            w = {k: (w[k] - GAMMA * g[k] if k in trained else w[k]) for k in w}
        ev = dm.client_eval_indices(cid)
        want.append(_loss(w, x[ev], y[ev]))
        plain.append(_loss(glob, x[ev], y[ev]))
    np.testing.assert_allclose(last.personal["val_loss"], want, rtol=1e-9)
    np.testing.assert_allclose(last.metrics["val_loss"], plain, rtol=1e-9)
    assert not np.allclose(want, plain)
    assert all(np.array_equal(weights(model)[k], glob[k]) for k in glob)


def test_the_personal_model_needs_the_clients_data():
    with pytest.raises(ValueError, match="pass `trainer`"):
        FedBABUClient(head=["net.1"]).personal_model(TwoLayer(), None)


@pytest.mark.parametrize("kwargs, match", [
    ({"head": []}, r"`head` must be a non-empty list"),
    ({"head": [3]}, r"`head` must be a non-empty list"),
    ({"head": ["net.1"], "finetune_epochs": 0}, r"`finetune_epochs` must be an integer >= 1"),
    ({"head": ["net.1"], "finetune": "body"}, r"`finetune` must be one of \('head', 'full'\)"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedBABUClient(**kwargs)


def test_a_head_that_selects_nothing_is_refused_at_fit_start(tmp_path):
    trainer = FederatedTrainer(max_epochs=1, callbacks=[FedBABU(head=["classifier"])], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"`head` \['classifier'\] selects no parameter of TwoLayer"):
        trainer.fit(TwoLayer(), datamodule=datamodule()[2])
    assert trainer.global_step == 0


def test_the_ready_made_name_only_fixes_parts():
    from helpers import assert_ready_made_name

    assert_ready_made_name(FedBABU)


def test_the_personal_model_accessor_fine_tunes_a_copy(tmp_path):
    """lightning_fed.personal_model(trainer, c) for FedBABU: the copy fine-tuned as the NumPy reference (the round
    the trainer is at), the trainer's global model untouched."""
    from lightning_fed.personal import personal_model

    x, y, dm = datamodule()
    server = FedBABU(head=["net.1"], finetune_epochs=1)
    _, model, trainer = fit(tmp_path, server, rounds=2, dm=dm)
    glob = weights(model)
    mine = personal_model(trainer, 4)
    w = dict(glob)
    steps = math.ceil(dm.client_num_samples(4) / dm.client_work(4, trainer.current_epoch).batch_size)
    for batch in dm.client_personalization_batches(4, trainer.current_epoch, steps):
        g = grads(w, x[batch], y[batch])
        w = {k: (w[k] - GAMMA * g[k] if k in HEAD else w[k]) for k in w}
    got = weights(mine)
    assert all(np.allclose(got[k], w[k], rtol=1e-12, atol=1e-13) for k in w)
    assert not np.allclose(got["net.1.weight"], glob["net.1.weight"])
    assert all(np.array_equal(weights(model)[k], glob[k]) for k in glob)
