"""Where a server optimizer's settings are read (lightning_fed/server/fields.py, issue #52 item 2): FedAWARE's 22 and
SCAFFOLD's 8 mirror accessors of their stage keep working with one ``DeprecationWarning`` each, naming the stage
attribute and the release that removes them, at the user's line; the package itself reads the stage (repr,
state_key, run record, HParams, checkpoints: no warning)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_fed import ClientUpdate, FederatedTrainer
from lightning_fed.algorithms.fedaware import FedAWARE
from lightning_fed.algorithms.scaffold import SCAFFOLD
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.server.fields import fields_of, has_setting, setting_value
from tests.helpers import LinearRegression, quiet_trainer_kwargs, regression_data

REMOVAL = "removed in lightning_fed 0.3.0"
MIRROR_WARNING = ".*mirrors its stage.*"

#: FedAWARE's mirrors and the stage attribute each warning names.
FEDAWARE_MIRRORS = {
    **{name: f"FedAWARE.min_norm.{name}" for name in (
        "alpha", "normalize", "alpha_convention", "fedavg_warmup", "projection", "solver", "warmup_rounds", "pairing",
        "fw_max_iter", "fw_tol", "fw_away_steps", "num_clients", "max_state_bytes")},
    "client_state": "FedAWARE.stage_state_fields(FedAWARE.min_norm)['table']",
    "client_num_samples": "FedAWARE.stage_state_fields(FedAWARE.min_norm)['client_num_samples']",
    "gram": "FedAWARE.stage_state_fields(FedAWARE.min_norm)['gram']",
    "momenta": "FedAWARE.stage_state_fields(FedAWARE.min_norm)['table'].matrix",
    "seen": "FedAWARE.stage_state_fields(FedAWARE.min_norm)['table'].present",
    "last_weights": "FedAWARE.stage_report(FedAWARE.min_norm).weights",
    "last_solve": "FedAWARE.stage_report(FedAWARE.min_norm).solve",
    "last_weighted_diversity": "FedAWARE.stage_report(FedAWARE.min_norm).diversity",
    "warming_up": "FedAWARE.min_norm.warming_up(state, FedAWARE.num_steps)",
}


def _one_mirror_warning(caught, name: str, kept: str, owner: str) -> None:
    mine = [w for w in caught if issubclass(w.category, DeprecationWarning) and "mirrors its stage" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in mine]
    message = str(mine[0].message)
    assert message.startswith(f"`{owner}.{name}` is deprecated") and REMOVAL in message and f"`{kept}`" in message
    assert mine[0].filename == __file__  # the user's line, not the property's


def _read(server, name: str, owner: str, kept: str):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(server, name)
    _one_mirror_warning(caught, name, kept, owner)
    return value


def _fedaware_after_one_round() -> FedAWARE:
    """Zeng et al. 2024, Alg. 1 on two clients with g_0 = [1, 0], g_1 = [0, 2] (g_i = −Δ_i), |D_i| = 10, α = 0.5:
    m_i = (1 − α)·g_i = [0.5, 0], [0, 1]; normalised, λ = (½, ½) (orthogonal unit vectors)."""
    updates = [ClientUpdate(0, [torch.tensor([-1.0, 0.0], dtype=torch.float64)], 10, 1, 0.0),
               ClientUpdate(1, [torch.tensor([0.0, -2.0], dtype=torch.float64)], 10, 1, 0.0)]
    server = FedAWARE(lr=1.0, num_clients=2)
    server.server_update([torch.zeros(2, dtype=torch.float64)], updates)
    return server


def test_every_fedaware_mirror_warns_once_naming_its_stage_attribute_and_reads_the_stage():
    server = _fedaware_after_one_round()
    values = {name: _read(server, name, "FedAWARE", kept) for name, kept in FEDAWARE_MIRRORS.items()}
    assert len(values) == 22
    # by hand (the docstring above), not from the stage's code
    assert np.allclose(values["momenta"].numpy(), [[0.5, 0.0], [0.0, 1.0]])
    assert np.allclose(values["gram"].numpy(), [[0.25, 0.0], [0.0, 1.0]])  # ⟨m_i, m_j⟩
    assert values["seen"].tolist() == [True, True] and values["client_num_samples"].tolist() == [10, 10]
    assert np.allclose(values["last_weights"], [0.5, 0.5])
    # Eq. 6 on the unit momenta: √((½·1 + ½·1) / ‖½e_0 + ½e_1‖²) = √(1 / ½) = √2
    assert math.isclose(values["last_weighted_diversity"], math.sqrt(2.0), rel_tol=1e-9)
    assert values["client_state"] is server.stage_state_fields(server.min_norm)["table"]
    assert values["last_solve"] is server.stage_report(server.min_norm).solve and values["warming_up"] is False
    assert (values["alpha"], values["num_clients"], values["solver"], values["max_state_bytes"]) == (0.5, 2,
                                                                                                    "active_set", "auto")


def test_fedaware_mirror_setters_warn_and_write_the_stage():
    server = FedAWARE(num_clients=2)
    with pytest.warns(DeprecationWarning, match=r"`FedAWARE\.alpha` is deprecated.*`FedAWARE\.min_norm\.alpha`"):
        server.alpha = 0.25
    assert server.min_norm.alpha == 0.25
    with pytest.warns(DeprecationWarning, match=r"`FedAWARE\.gram` is deprecated"):
        server.gram = torch.eye(2, dtype=torch.float64)
    assert torch.equal(server.stage_state_fields(server.min_norm)["gram"], torch.eye(2, dtype=torch.float64))


def _line_fit(tmp_path, server, **kwargs):
    """SCAFFOLD's docstring example: w·x ≈ y on (1, 2) and (2, 4), one client each, K = 2 local SGD steps of 0.1."""
    model = LinearRegression(in_features=1, lr=0.1)
    with torch.no_grad():
        model.linear.weight.zero_()
        model.linear.bias.zero_()
        model.linear.bias.requires_grad_(False)
    data = TensorDataset(torch.tensor([[1.0], [2.0]], dtype=torch.float64), torch.tensor([2.0, 4.0], dtype=torch.float64))
    dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=2), clients_per_round=2, batch_size=1,
                             local_epochs=2, seed=0)
    trainer = FederatedTrainer(max_epochs=1, callbacks=[server], **(quiet_trainer_kwargs(tmp_path) | kwargs))
    trainer.fit(model, datamodule=dm)
    return model


def test_every_scaffold_mirror_warns_once_naming_its_stage_attribute_and_reads_the_stage(tmp_path):
    server = SCAFFOLD()
    _line_fit(tmp_path, server)
    state = "SCAFFOLD.stage_state_fields(SCAFFOLD.control_stage)"
    # Karimireddy et al. 2020, Alg. 1 l. 12 (option II): c_i⁺ = c_i − c + (x − y_i)/(K·η_l) with c = c_i = 0:
    # client (1, 2): y = 0.72, client (2, 4): y = 1.92 (the docstring's hand computation); c = mean of the Δc_i
    by_hand = {0: -0.72 / 0.2, 1: -1.92 / 0.2}
    controls = _read(server, "client_controls", "SCAFFOLD", f"{state}['table'].rows()")
    assert sorted(round(float(v[0]), 10) for v in controls.values()) == sorted(round(v, 10) for v in by_hand.values())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mine = sorted(round(server.client_control(i)[0].item(), 10) for i in (0, 1))
    assert mine == sorted(round(v, 10) for v in by_hand.values())
    assert len([w for w in caught if "mirrors its stage" in str(w.message)]) == 2  # one per read
    _one_mirror_warning(caught[:1], "client_control", "SCAFFOLD.control_stage.client_control(SCAFFOLD, client_id)",
                        "SCAFFOLD")
    control = _read(server, "state", "SCAFFOLD", f"{state}['control']")["control"]
    assert math.isclose(control[0].item(), sum(by_hand.values()) / 2, rel_tol=1e-12)
    assert _read(server, "num_clients", "SCAFFOLD", "SCAFFOLD.control_stage.num_clients") == 2
    table = _read(server, "client_state", "SCAFFOLD", f"{state}['table']")
    assert table is server.stage_state_fields(server.control_stage)["table"]
    # the three setters
    with pytest.warns(DeprecationWarning, match=r"`SCAFFOLD\.num_clients` is deprecated"):
        server.num_clients = 3
    assert server.control_stage.num_clients == 3
    with pytest.warns(DeprecationWarning, match=r"`SCAFFOLD\.state` is deprecated"):
        server.state = {"control": [torch.ones(1, dtype=torch.float64)]}
    assert server.stage_state_fields(server.control_stage)["control"][0].item() == 1.0
    with pytest.warns(DeprecationWarning, match=r"`SCAFFOLD\.client_state` is deprecated"):
        server.client_state = None
    assert server.stage_state_fields(server.control_stage)["table"] is None


def test_the_package_reads_the_stages_and_never_warns(tmp_path):
    """repr, state_key, the run record, TensorBoard's HParams and the checkpoints of FedAWARE and SCAFFOLD fits: no
    mirror read (a mirror's warning is an error here)."""
    from lightning_fed.checkpoint import object_settings
    from lightning_fed.tensorboard import federated_hparams

    x, y = regression_data(n=40, d=3)
    data = TensorDataset(torch.tensor(x), torch.tensor(y))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=MIRROR_WARNING, category=DeprecationWarning)
        fedaware = FedAWARE(alpha=0.3, warmup_rounds=1)
        dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=4), clients_per_round=2, batch_size=10)
        trainer = FederatedTrainer(max_epochs=2, callbacks=[fedaware],
                                   **(quiet_trainer_kwargs(tmp_path) | dict(enable_checkpointing=True)))
        trainer.fit(LinearRegression(), datamodule=dm)  # a checkpoint each round: the run record, the state
        settings, hparams = object_settings(fedaware), federated_hparams(trainer)
        text = (repr(fedaware), fedaware.state_key)
        _line_fit(tmp_path / "scaffold", SCAFFOLD(), enable_checkpointing=True)
    assert settings["alpha"] == 0.3 and settings["warmup_rounds"] == 1 and settings["num_clients"] == 4
    assert hparams["server_optimizer/alpha"] == 0.3
    assert "alpha=0.3" in text[0] and "'alpha': 0.3" in text[1]


def test_setting_value_reads_a_setting_where_its_class_says_it_lives():
    server = FedAWARE(alpha=0.3)
    assert setting_value(server, "alpha") == 0.3 and setting_value(server, "lr") == 1.0
    assert has_setting(server, "pairing") and not has_setting(server, "no_such_setting")
    assert fields_of(server, ("alpha", "weighting", "a=min_norm.alpha")) == [("alpha", 0.3), ("weighting",
                                                                                             "num_samples"), ("a", 0.3)]
