"""lightning_fed.personal (issue #55, item 4): client c's personal model through one call, the same for every method,
against the NumPy transcriptions of the papers' algorithm boxes in tests/algorithms (FedPer: Arivazhagan et al.
2019, Alg. 1; FedRep: Collins et al. 2021, Alg. 1; FedBN: Li et al. 2021, Alg. 1; Ditto: Li et al. 2021, Alg. 1)
— after fit, after trainer.validate(ckpt_path=...) in a new trainer, for a half given to the server optimizer and
one given to the trainer; a client never trained gets the global model, or an error on request."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from algorithms.test_ditto import _ditto_reference, _fit as ditto_fit
from algorithms.test_fedbn import BN, SHARED, _fedbn_reference, _fit as fedbn_fit, _numpy
from algorithms.test_fedper import HEAD, TwoLayer, _fedper_reference, datamodule, fit, weights
from algorithms.test_fedrep import _fedrep_reference
from helpers import linear_weights, quiet_trainer_kwargs
from lightning_fed import FederatedTrainer, personal_model, personal_state_dict, trained_clients
from lightning_fed.algorithms import FedRepClient
from lightning_fed.callbacks import Ditto, FedAvg, FedBN, FedPer
from lightning_fed.checks import ArgumentError

pytestmark = pytest.mark.filterwarnings("ignore:The client half\\(s\\)", "ignore:You passed in a `val_dataloader`")


def _assert_model(model, want):
    got = {**weights(model), **{n: b.detach().numpy() for n, b in model.named_buffers()}}
    assert sorted(want) == sorted(k for k in got if k in want)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-12, atol=1e-13, err_msg=k)


def test_fedper_personal_models_equal_numpy_and_leave_the_global_model(tmp_path):
    x, y, dm = datamodule()
    w0, model, trainer = fit(tmp_path, FedPer(head=["net.1"]), rounds=3, dm=dm)
    glob, own = _fedper_reference(w0, x, y, dm, rounds=3)
    before = weights(model)
    assert trained_clients(trainer) == sorted(own) and len(own) < dm.num_clients
    for cid in range(dm.num_clients):
        mine = personal_model(trainer, cid)
        assert mine is not model and type(mine) is TwoLayer and mine._trainer is None
        _assert_model(mine, {**glob, **own.get(cid, {k: w0[k] for k in HEAD})})  # never trained: the initial head
    assert all(np.array_equal(v, weights(model)[k]) for k, v in before.items())
    mine = personal_model(trainer, sorted(own)[0])
    with torch.no_grad():
        mine.net[0].weight.add_(1.0)  # a copy: the trainer's model is untouched
    assert np.array_equal(weights(model)["net.0.weight"], before["net.0.weight"])


def test_fedrep_half_given_to_the_trainer_is_found(tmp_path):
    """The half given as FederatedTrainer(client_algorithms=[...]) (not the server optimizer's): its table is read."""
    x, y, dm = datamodule()
    w0, _, trainer = fit(tmp_path, FedAvg(weighting="uniform"), rounds=3, dm=dm,
                         client_algorithms=[FedRepClient(head=["net.1"], head_steps=2)])
    glob, own = _fedrep_reference(w0, x, y, dm, rounds=3, head_steps=2)
    for cid, head in own.items():
        _assert_model(personal_model(trainer, cid), {**glob, **head})


def test_fedbn_personal_models_hold_the_clients_batchnorm_layers(tmp_path):
    server = FedBN()
    x, y, dm, w0, model, trainer = fedbn_fit(tmp_path, server, rounds=3)
    glob, own = _fedbn_reference(w0, x, y, dm, rounds=3)
    for cid, bn in own.items():
        got = _numpy(personal_model(trainer, cid))
        for k in (*SHARED, *BN):
            np.testing.assert_allclose(got[k], {**glob, **bn}[k], rtol=1e-12, atol=1e-13, err_msg=k)
    state = personal_state_dict(trainer, sorted(own)[0])
    assert sorted(state) == sorted(model.state_dict())
    np.testing.assert_allclose(state["net.1.running_mean"].numpy(), own[sorted(own)[0]]["net.1.running_mean"],
                               rtol=1e-12, atol=1e-13)


def test_ditto_personal_models_are_v_k_and_the_global_model_for_the_others(tmp_path):
    x, y, dm, w0, model, trainer = ditto_fit(tmp_path, Ditto(lam=0.5), rounds=3)
    want_w, want_v = _ditto_reference(w0, x, y, dm, rounds=3, lam=0.5, eta=0.05)
    for cid in range(dm.num_clients):
        got = linear_weights(personal_model(trainer, cid))
        np.testing.assert_allclose(got, want_v.get(cid, want_w), rtol=1e-12, atol=1e-13)


def test_fedavgs_personal_model_is_the_global_model_for_every_client(tmp_path):
    w0, model, trainer = fit(tmp_path, FedAvg(), rounds=2)
    assert trained_clients(trainer) == []
    for cid in (0, 5):
        mine = personal_model(trainer, cid, untrained="raise")  # no per-client state: nothing to refuse
        assert mine is not model
        _assert_model(mine, weights(model))


class Validated(TwoLayer):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y))


def test_after_loading_a_checkpoint_the_personal_models_are_the_fits(tmp_path):
    x, y, dm = datamodule()
    w0, _, trainer = fit(tmp_path, FedPer(head=["net.1"]), rounds=3, dm=dm, ckpt_dir=tmp_path / "ckpt")
    glob, own = _fedper_reference(w0, x, y, dm, rounds=3)
    *_, dm2 = datamodule()
    dm2.val_dataset = dm2.train_dataset
    for run in ("validate", "test"):
        fresh = FederatedTrainer(callbacks=[FedPer(head=["net.1"])], **quiet_trainer_kwargs(tmp_path / run))
        model = Validated()
        model.test_step = model.validation_step
        dm2.test_dataset = dm2.train_dataset
        getattr(fresh, run)(model, datamodule=dm2, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"), verbose=False)
        assert trained_clients(fresh) == sorted(own)
        for cid, head in own.items():
            _assert_model(personal_model(fresh, cid), {**glob, **head})


def test_an_untrained_client_is_refused_on_request_and_bad_arguments_are_named(tmp_path):
    x, y, dm = datamodule()
    w0, _, trainer = fit(tmp_path, FedPer(head=["net.1"]), rounds=1, dm=dm)
    never = next(c for c in range(dm.num_clients) if c not in trained_clients(trainer))
    with pytest.raises(ArgumentError, match=rf"Client {never} has no personal state \(never trained: no row in "
                                            r"FedPerClient's per-client table; 3 client\(s\) have one\)"):
        personal_model(trainer, never, untrained="raise")
    with pytest.raises(ArgumentError, match=r"`client_id` must be an integer in \[0, 6\)"):
        personal_model(trainer, 6)
    with pytest.raises(ArgumentError, match=r"`client_id` must be an integer >= 0, got -1"):
        personal_model(trainer, -1)
    with pytest.raises(ArgumentError, match=r"`untrained` must be one of \('global', 'raise'\), got 'skip'"):
        personal_state_dict(trainer, 0, untrained="skip")
