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


def _warnings_of(tmp_path, server, model, **kwargs):
    import warnings

    from lightning_fed.personal import GlobalModelPartsWarning

    *_, dm = datamodule()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(tmp_path, server, rounds=1, dm=dm, model=model, **kwargs)
    return [str(w.message) for w in caught if issubclass(w.category, GlobalModelPartsWarning)]


class WithTestStep(TwoLayer):
    def test_step(self, batch, batch_idx):
        pass


@pytest.mark.parametrize("case", ["FedPer", "FedBN_given_to_the_trainer", "test_step_only"])
def test_a_global_model_with_untrained_personal_parts_is_named_at_fit_start(tmp_path, case):
    """#55 item 3: FedBN / FedPer / FedRep's global model keeps the initial personal parts, so its val_* / test_*
    measure the shared part with an untrained head or BatchNorm: one warning at fit start names the method, the
    parts and the metrics, and where the personal models are measured."""
    from algorithms.test_fedbn import BNRegression
    from lightning_fed.algorithms import FedBNClient

    if case == "FedPer":
        messages = _warnings_of(tmp_path, FedPer(head=["net.1"]), Validated())
        assert messages == [messages[0]] and messages[0].startswith(
            "FedPer (its client half FedPerClient) keeps net.1 local: the server never trains it, so the global "
            "model holds its initial values and central validation's `val_*` (every metric validation_step logs, e.g. "
            "`val_loss`) measure the shared part with that untrained part")
        assert "`fed_personal_<metric>`" in messages[0] and "personal_model(trainer, client_id)" in messages[0]
    elif case == "FedBN_given_to_the_trainer":
        class BNValidated(BNRegression):
            def validation_step(self, batch, batch_idx):
                pass

        from algorithms.test_fedbn import _datamodule
        from lightning_fed.personal import GlobalModelPartsWarning

        *_, dm = _datamodule()
        with pytest.warns(GlobalModelPartsWarning, match=r"^The client half FedBNClient keeps every BatchNorm layer "
                                                         r"local.*`val_\*`"):
            FederatedTrainer(max_epochs=1, callbacks=[FedAvg()], client_algorithms=[FedBNClient()],
                             **quiet_trainer_kwargs(tmp_path)).fit(BNValidated(), datamodule=dm)
    else:
        messages = _warnings_of(tmp_path, FedPer(head=["net.1"]), WithTestStep())
        assert len(messages) == 1 and "and `test_*` measure" in messages[0] and "`val_*`" not in messages[0]


@pytest.mark.parametrize("server", ["Ditto", "FedAvg", "no_validation_step"])
def test_no_warning_where_the_global_model_is_the_trained_one(tmp_path, server):
    make = {"Ditto": lambda: Ditto(lam=0.5), "FedAvg": FedAvg, "no_validation_step": lambda: FedPer(head=["net.1"])}
    model = TwoLayer() if server == "no_validation_step" else Validated()
    assert _warnings_of(tmp_path, make[server](), model) == []


def test_no_warning_for_fedrod_whose_global_model_is_its_generic_model():
    """FedRoD keeps the personal head local, but it starts at 0 (enforced at fit start), so the global model is the
    paper's generic model (Chen & Chao 2022, G-FL): its `val_*` are no misreading, and no warning says otherwise."""
    import warnings

    from lightning_fed.algorithms.fedrod import FedRoD
    from lightning_fed.personal import GlobalModelPartsWarning, warn_untrained_global_parts

    def warned(server):
        trainer = FederatedTrainer(callbacks=[server], logger=False, enable_progress_bar=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warn_untrained_global_parts(trainer, Validated())
        return [w for w in caught if issubclass(w.category, GlobalModelPartsWarning)]

    assert warned(FedRoD(generic_head="net.1", personal_head="net.2")) == []
    assert len(warned(FedPer(head=["net.1"]))) == 1  # a method whose global model holds an unused part still warns


def test_ditto_with_a_frozen_encoder_after_loading_a_checkpoint(tmp_path):
    """v_k covers the federated (trained) parameters only; read back by a trainer that only loaded the checkpoint
    (no fit told Ditto's half which parameters those are), the personal models are the fit's."""
    from helpers import FrozenEncoder, federated_fit, regression_data
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
    from torch.utils.data import TensorDataset

    class Validated(FrozenEncoder):
        def validation_step(self, batch, batch_idx):
            pass

    x, y = regression_data(n=60)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), val_dataset=TensorDataset(
        torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(4, seed=0), clients_per_round=3, batch_size=5)
    trainer = federated_fit(tmp_path, Validated(), dm, Ditto(lam=0.5), 2, ckpt_dir=tmp_path / "ckpt")
    fresh = FederatedTrainer(callbacks=[Ditto(lam=0.5)], **quiet_trainer_kwargs(tmp_path / "v"))
    fresh.validate(Validated(), datamodule=dm, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"), verbose=False)
    assert trained_clients(fresh) == trained_clients(trainer) != []
    for cid in range(4):
        a, b = personal_state_dict(trainer, cid), personal_state_dict(fresh, cid)
        assert all(torch.equal(a[k], b[k]) for k in a), cid


def test_per_fedavgs_personal_model_is_one_step_on_the_clients_data(tmp_path):
    """A half whose personal model reads the client's data through the module's trainer (Per-FedAvg, Fallah et al.
    2020: w − α∇f_i(w; D_i), D_i the client's first batch of the last round it trained) works on the copy too."""
    from algorithms.test_perfedavg import ALPHA
    from helpers import mse_grad
    from lightning_fed.callbacks import PerFedAvg

    x, y, dm, w0, model, trainer = ditto_fit(tmp_path, PerFedAvg(alpha=ALPHA), rounds=3)
    w = linear_weights(model)
    last = {int(c): t for t in range(3) for c in dm.sample_clients(t)}
    for cid, t in last.items():
        batch = dm.client_batches(cid, t)[0]
        np.testing.assert_allclose(linear_weights(personal_model(trainer, cid)), w - ALPHA * mse_grad(w, x[batch], y[batch]),
                                   rtol=1e-12, atol=1e-13)
    mine = personal_model(trainer, cid)
    assert mine._trainer is None and np.array_equal(linear_weights(model), w)
