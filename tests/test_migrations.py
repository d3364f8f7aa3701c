"""The one migration table (issue #30, item 4): every older checkpoint format is upgraded in one place, before the
callbacks are restored; the classes read only today's layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import TensorDataset

from helpers import LinearRegression, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import SCAFFOLD, FedAWARE, FedLAMB
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.migrations import CHECKPOINT_FORMAT, MIGRATIONS, checkpoint_format, migrate_checkpoint, upgrade_server_state


def test_the_table_covers_every_format_below_the_current_one():
    assert sorted(MIGRATIONS) == list(range(CHECKPOINT_FORMAT))


def test_fedaware_layout_before_the_table_becomes_a_dense_table():
    momenta = torch.arange(6, dtype=torch.float64).reshape(3, 2)
    seen = torch.tensor([True, False, True])
    old = {"num_steps": 2, "state": {}, "fedaware": {"num_clients": 3, "momenta": momenta, "seen": seen,
                                                    "client_num_samples": None, "gram": None}}
    new = upgrade_server_state(old)
    assert "momenta" not in new["fedaware"] and "seen" not in new["fedaware"] and new["fedaware"]["num_clients"] == 3
    table = new["client_state"]
    assert table["dense"] and table["num_clients"] == 3 and table["dim"] == 2
    assert torch.equal(table["rows"], momenta) and torch.equal(table["present"], seen)
    assert "client_state" not in old  # the saved dict is not modified


def test_scaffold_without_n_is_refused_naming_it():
    with pytest.raises(ValueError, match="client control variates but no `num_clients`"):
        upgrade_server_state({"num_steps": 1, "state": {}, "client_controls": {0: torch.ones(2)}})


def test_a_newer_format_is_refused():
    with pytest.raises(ValueError, match="format 6, newer than this version's 5"):
        migrate_checkpoint({"lightning_fed": {"format": 6}})


def _run(tmp_path, folder, epochs, ckpt=None, make_server=lambda: SCAFFOLD(lr=0.8)):
    x, y = regression_data(n=40, d=3, seed=4)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2,
                             batch_size=4, local_epochs=2)
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    server = make_server()
    saver = ModelCheckpoint(dirpath=str(tmp_path / folder), save_last=True, every_n_epochs=1)
    FederatedTrainer(max_epochs=epochs, callbacks=[server, saver],
                     **(quiet_trainer_kwargs(tmp_path / folder) | {"enable_checkpointing": True})).fit(
        model, datamodule=dm, ckpt_path=ckpt)
    return model, server


@pytest.mark.parametrize("fmt", [1, 3])
def test_a_format_1_scaffold_checkpoint_with_the_old_layout_resumes_bit_for_bit(tmp_path, fmt):
    """A checkpoint as an older version wrote it (format 1, SCAFFOLD's c_i under "client_controls"; format 3, #41:
    c under "state", the c_i in "client_state", N in "num_clients") resumes through the trainer exactly like
    today's (format 4: the control stage's state under "aggregators")."""
    full, full_server = _run(tmp_path, "full", 4)
    _run(tmp_path, "old", 2)
    path = tmp_path / "old" / "last.ckpt"
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint_format(checkpoint) == CHECKPOINT_FORMAT == 5
    checkpoint["lightning_fed"]["format"] = fmt
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("SCAFFOLD")]
    state = checkpoint["callbacks"][key]
    (stage,) = state.pop("aggregators")  # SCAFFOLD's layout before #41 (format 4), then before the table (format 2)
    table = stage["table"]["client_state_table"]
    state.update(state={"control": stage["control"]}, num_clients=table["num_clients"])
    if fmt == 1:
        state["client_controls"] = dict(table["rows"])
    else:
        state["client_state"] = table
    torch.save(checkpoint, path)
    resumed, server = _run(tmp_path, "old", 4, ckpt=str(path))
    for p, q in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert server.client_controls.keys() == full_server.client_controls.keys()
    for k, v in full_server.client_controls.items():
        assert np.array_equal(server.client_controls[k].numpy(), v.numpy())


def _resume_from_an_older_layout(tmp_path, make_server, prefix, rewrite, fmt):
    """Run 4 rounds straight, and 2 rounds saved then rewritten by ``rewrite(state)`` (the server optimizer's
    callback state, whose key starts with ``prefix``) into format ``fmt``'s layout and resumed to 4: the resumed
    weights equal the uninterrupted run's bit for bit. Returns both server optimizers (uninterrupted, resumed)."""
    full, full_server = _run(tmp_path, "full", 4, make_server=make_server)
    _run(tmp_path, "old", 2, make_server=make_server)
    path = tmp_path / "old" / "last.ckpt"
    checkpoint = torch.load(path, weights_only=True)
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith(prefix)]
    rewrite(checkpoint["callbacks"][key])
    checkpoint["lightning_fed"]["format"] = fmt
    torch.save(checkpoint, path)
    resumed, server = _run(tmp_path, "old", 4, ckpt=str(path), make_server=make_server)
    for p, q in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    return full_server, server


def test_41_a_format_3_fedaware_checkpoint_resumes_bit_for_bit_and_is_saved_one_way(tmp_path):
    """#41: FedAWARE's stage state is saved one way, the composed layout (under "aggregators"; no "fedaware", no
    "client_state"); a format-3 checkpoint (the momenta in "client_state", |D_i| and the Gram matrix in "fedaware")
    resumes through the trainer exactly like today's."""
    def to_format_3(state):
        assert "fedaware" not in state and "client_state" not in state and set(state["aggregators"][0]) == {
            "table", "client_num_samples", "gram"}
        (stage,) = state.pop("aggregators")
        state["client_state"] = stage["table"]["client_state_table"]
        state["fedaware"] = {"num_clients": 4, "client_num_samples": stage["client_num_samples"], "gram": stage["gram"]}

    full_server, server = _resume_from_an_older_layout(
        tmp_path, lambda: FedAWARE(lr=0.8, alpha=0.3), "FedAWARE", to_format_3, fmt=3)
    assert server.num_steps == 4
    for name in ("momenta", "seen", "gram", "client_num_samples"):
        assert torch.equal(getattr(server, name), getattr(full_server, name)), name


def test_41_a_format_3_fedlamb_checkpoint_resumes_bit_for_bit_and_is_saved_one_way(tmp_path):
    """#41: Fed-LAMB's max-moment stage state (v̂, m̄) is saved one way, under "aggregators"; a format-3 checkpoint
    (v̂ and m̄ under "state") resumes through the trainer exactly like today's."""
    def to_format_3(state):
        assert state["state"] == {} and set(state["aggregators"][0]) == {"second_moment", "first_moment"}
        (stage,) = state.pop("aggregators")
        state["state"] = dict(stage)

    full_server, server = _resume_from_an_older_layout(
        tmp_path, lambda: FedLAMB(lr=1.0, client_lr=0.01, first_moment="average"), "FedLAMB", to_format_3, fmt=3)
    for name in ("second_moment", "first_moment"):
        for a, b in zip(full_server.state[name], server.state[name]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.fixture(scope="module")
def saved_record(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("record")
    _run(tmp, "run", 1)
    return tmp / "run" / "last.ckpt"


@pytest.mark.parametrize("edit, field, expected", [
    (lambda r: r.update(format="two"), "format is 'two'", "an integer >= 1"),
    (lambda r: r.update(format=None), "format is None", "an integer >= 1"),
    (lambda r: r.update(run_config=["seed", 0]), "run_config is ['seed', 0]", "a dict of setting name"),
    (lambda r: r.update(server_optimizer_state_key=3), "server_optimizer_state_key is 3", "a string"),
    (lambda r: r.update(privacy="none"), "privacy is 'none'", "a dict with 'previous'"),
    (lambda r: r["privacy"].update(previous={"rounds": 1}), "privacy['previous'] is {'rounds': 1}", "a list"),
    ("list", "checkpoint['lightning_fed'] is [2]", "a dict (the run record)"),
])
def test_43_a_malformed_record_is_refused_naming_the_file_and_the_field(tmp_path, saved_record, edit, field, expected):
    """#43 case 4: a record of the wrong layout is one ValueError naming the file, the field and what was expected
    (before: a raw ValueError from int('two') or an AttributeError of a list)."""
    checkpoint = torch.load(saved_record, weights_only=True)
    if edit == "list":
        checkpoint["lightning_fed"] = [2]
    else:
        edit(checkpoint["lightning_fed"])
    path = tmp_path / "bad.ckpt"
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match="malformed lightning_fed record") as info:
        _run(tmp_path, "resumed", 2, ckpt=str(path))
    message = str(info.value)
    assert str(path) in message and field in message and expected in message, message
    assert message.count(". ") == 0  # one sentence


def test_41_positional_client_half_state_is_named_by_the_resuming_runs_halves():
    """#41 (format 2 → 3): the client halves' tables were keyed by position; they are keyed by the half's name, taken
    from the halves of the run resuming them (the only meaning such a key had); an unknown position is refused."""
    from lightning_fed.migrations import name_client_states

    checkpoint = {"lightning_fed": {"format": 2}, "callbacks": {"FedAvg{}": {"num_steps": 1, "state": {},
                                                                             "client_algorithms": {"1": {"rows": 7}}}}}
    migrate_checkpoint(checkpoint, client_halves=["FedProxClient", "FedDynClient"])
    assert checkpoint["callbacks"]["FedAvg{}"]["client_algorithms"] == {"FedDynClient": {"rows": 7}}
    assert checkpoint["lightning_fed"]["format"] == CHECKPOINT_FORMAT
    with pytest.raises(ValueError, match=r"client half at position 1 .* has the client halves \['FedDynClient'\]"):
        name_client_states({"1": {}}, ["FedDynClient"])


@pytest.mark.parametrize("store", ["memory", "disk"])
@pytest.mark.parametrize("method", ["SCAFFOLD", "FedDyn"])
def test_42_a_format_4_checkpoint_resumes_bit_for_bit_into_either_store(tmp_path, method, store):
    """#42: format 5 adds the on-disk store's manifest; a format-4 checkpoint (every per-client table's rows in it,
    the layout the memory store still writes) upgrades unchanged and resumes exactly, into the memory store or moved
    row by row into the disk store."""
    from lightning_fed.callbacks import FedDyn

    def make(store="memory"):
        if method == "SCAFFOLD":
            return SCAFFOLD(lr=0.8, client_state_store=store)
        return FedDyn(alpha=0.1, client_state_store=store)

    full, full_server = _run(tmp_path, "full", 4, make_server=make)
    _run(tmp_path, "old", 2, make_server=make)
    path = tmp_path / "old" / "last.ckpt"
    checkpoint = torch.load(path, weights_only=True)
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith(method)]
    state = checkpoint["callbacks"][key]
    table = state["aggregators"][0]["table"]["client_state_table"] if method == "SCAFFOLD" else \
        state["client_algorithms"]["FedDynClient"]
    assert set(table) == {"num_clients", "dim", "dense", "dtype", "present", "rows"}  # format 4's table layout
    checkpoint["lightning_fed"]["format"] = 4
    torch.save(checkpoint, path)
    upgraded = torch.load(path, weights_only=True)
    assert migrate_checkpoint(upgraded) == 4 and upgraded["lightning_fed"]["format"] == 5
    assert upgraded["callbacks"][key].keys() == state.keys()
    resumed, server = _run(tmp_path, "old", 4, ckpt=str(path), make_server=lambda: make(store))
    for p, q in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    a, b = (s.client_state if method == "SCAFFOLD" else s.client_algorithm_states["FedDynClient"]
            for s in (full_server, server))
    assert b.store == store and a.ids() == b.ids()
    for i in a.ids():
        assert torch.equal(a.get(i), b.get(i))


def test_every_moved_ready_made_name_is_the_same_class_at_its_old_path_and_in_callbacks():
    """#52: the ready-made names moved from ``callbacks/`` into their method's module of ``algorithms/``; the old
    module paths (imports, configs' ``class_path``s, run records through :data:`MOVED_CLASSES`) give the class now."""
    import importlib

    from lightning_fed import callbacks
    from lightning_fed.migrations import MOVED_CLASSES

    assert len(MOVED_CLASSES) == 13
    for old, new in MOVED_CLASSES.items():
        (old_module, name), (new_module, new_name) = old.rsplit(".", 1), new.rsplit(".", 1)
        assert new_module.startswith("lightning_fed.algorithms.") and new_name == name
        cls = getattr(importlib.import_module(new_module), name)
        assert cls.__module__ == new_module
        assert getattr(importlib.import_module(old_module), name) is cls is getattr(callbacks, name)
