"""ClientStateTable: sizes, CPU storage, checkpoint round trips, bad ids; FedAWARE and SCAFFOLD keep their per-client
state in it and still load checkpoints written before it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.callbacks import SCAFFOLD, FedAWARE
from lightning_fed.migrations import CHECKPOINT_FORMAT, migrate_checkpoint
from lightning_fed.server.client_state import ClientStateTable


@pytest.mark.parametrize("dense", [False, True])
def test_sizes_zeros_and_cpu(dense):
    table = ClientStateTable(num_clients=4, dim=3, dtype=torch.float64, dense=dense)
    assert (table.num_clients, table.dim, len(table), table.ids()) == (4, 3, 0, [])
    assert table.get(1).tolist() == [0.0, 0.0, 0.0] and table.get(1).dtype == torch.float64
    table.put(1, torch.tensor([1.0, 2.0, 3.0]))  # float32 in, stored as float64
    table.scatter([3, 0], torch.tensor([[4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]))
    assert table.ids() == [0, 1, 3] and 2 not in table and 3 in table and len(table) == 3
    assert table.present.tolist() == [True, True, False, True]
    np.testing.assert_array_equal(table.gather([3, 2, 1]).numpy(), [[4, 5, 6], [0, 0, 0], [1, 2, 3]])
    for row in table.rows().values():
        assert row.device.type == "cpu" and row.dtype == torch.float64 and row.shape == (3,)
    if dense:
        assert table.matrix.shape == (4, 3) and table.matrix[2].abs().sum() == 0
    else:
        with pytest.raises(RuntimeError, match="dense=True"):
            table.matrix


@pytest.mark.parametrize("dense", [False, True])
def test_round_trip_through_a_weights_only_file(tmp_path, dense):
    table = ClientStateTable(num_clients=5, dim=2, dtype=torch.float64, dense=dense)
    table.put(4, torch.tensor([0.1, -0.2], dtype=torch.float64))
    table.put(2, torch.tensor([1e-300, 3.0], dtype=torch.float64))
    saved = table.state_dict()
    table.put(4, torch.tensor([9.0, 9.0], dtype=torch.float64))  # the state dict handed out keeps its values
    torch.save(saved, tmp_path / "t.pt")
    back = ClientStateTable.from_state_dict(torch.load(tmp_path / "t.pt", weights_only=True))
    assert (back.num_clients, back.dim, back.dtype, back.dense, back.ids()) == (5, 2, torch.float64, dense, [2, 4])
    assert back.get(4).tolist() == [0.1, -0.2] and back.get(2).tolist() == [1e-300, 3.0]
    assert back.get(0).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="num_clients=5, but this table has num_clients=6"):
        ClientStateTable(6, 2).load_state_dict(saved)
    with pytest.raises(ValueError, match="dim=2, but this table has dim=3"):
        ClientStateTable(5, 3).load_state_dict(saved)


def test_bad_ids_rows_and_arguments_are_named():
    table = ClientStateTable(num_clients=3, dim=2)
    with pytest.raises(ValueError, match=r"client id 3 is outside \[0, 3\)"):
        table.put(3, torch.zeros(2))
    with pytest.raises(ValueError, match=r"client ids \[-1, 5\] are outside \[0, 3\)"):
        table.gather([0, -1, 5])
    with pytest.raises(ValueError, match="more than once"):
        table.scatter([1, 1], torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"shape \(2,\), got \(3,\)"):
        table.put(0, torch.zeros(3))
    with pytest.raises(ValueError, match="`num_clients` must be an integer >= 1, got 0"):
        ClientStateTable(0, 2)
    with pytest.raises(ValueError, match="`dim` must be an integer >= 1"):
        ClientStateTable(2, 1.5)
    with pytest.raises(ValueError, match="`dtype` must be a floating"):
        ClientStateTable(2, 2, dtype=torch.int64)


# ------------------------------------------------------------------ the methods that use it
def _rounds(seed=0, num_clients=5, d=3):
    rng = np.random.default_rng(seed)
    cohorts = [(0, 1), (2, 0), (3, 4), (1, 2)]
    return [[(c, rng.normal(size=d), int(rng.integers(1, 9))) for c in cohort] for cohort in cohorts]


def _fedaware_round(server, params, round_):
    updates = [ClientUpdate(c, [torch.tensor(d)], n, 1, 0.0) for c, d, n in round_]
    server.server_update(params, updates)


def test_fedaware_momenta_live_in_a_dense_table_and_old_checkpoints_load(tmp_path):
    make = lambda: FedAWARE(lr=0.5, alpha=0.3, num_clients=5)  # noqa: E731
    rounds = _rounds()
    full, params = make(), [torch.zeros(3, dtype=torch.float64)]
    for r in rounds:
        _fedaware_round(full, params, r)
    first, mid = make(), [torch.zeros(3, dtype=torch.float64)]
    for r in rounds[:2]:
        _fedaware_round(first, mid, r)
    assert first.client_state.dense and first.momenta is first.client_state.matrix
    assert first.seen.tolist() == [True, True, True, False, False]
    state = first.state_dict()
    # The format before the table (format 1): m_i and the seen mask under state["fedaware"], no "client_state";
    # upgraded in one place (lightning_fed.migrations), as the checkpoint connector does on load.
    (stage,) = state["aggregators"]
    table = stage["table"]["client_state_table"]
    old = {k: v for k, v in state.items() if k != "aggregators"}
    old["fedaware"] = {"num_clients": 5, "client_num_samples": stage["client_num_samples"], "gram": stage["gram"],
                       "momenta": table["rows"], "seen": table["present"]}
    for fmt, saved in ((CHECKPOINT_FORMAT, state), (1, old)):
        torch.save({"lightning_fed": {"format": fmt}, "callbacks": {"FedAWARE": saved}}, tmp_path / "s.pt")
        checkpoint = torch.load(tmp_path / "s.pt", weights_only=True)
        migrate_checkpoint(checkpoint)
        second = make()
        second.load_state_dict(checkpoint["callbacks"]["FedAWARE"])
        resumed = [mid[0].clone()]
        for r in rounds[2:]:
            _fedaware_round(second, resumed, r)
        assert torch.equal(resumed[0], params[0]) and torch.equal(second.momenta, full.momenta)
        assert torch.equal(second.seen, full.seen) and torch.equal(second.gram, full.gram)


def _scaffold_update(c, d, n):
    return ClientUpdate(client_id=c, delta=[torch.tensor(d)], num_samples=n, num_steps=1, loss=0.0,
                        extras={"delta_control": [torch.tensor(-d)]})


def test_scaffold_controls_live_in_a_lazy_table_and_old_checkpoints_load(tmp_path):
    def make():
        server = SCAFFOLD(lr=0.8)
        server.num_clients = 5
        return server

    rounds = _rounds(seed=3)
    full, params = make(), [torch.zeros(3, dtype=torch.float64)]
    for r in rounds:
        full.server_update(params, [_scaffold_update(*u) for u in r])
    first, mid = make(), [torch.zeros(3, dtype=torch.float64)]
    for r in rounds[:2]:
        first.server_update(mid, [_scaffold_update(*u) for u in r])
    assert not first.client_state.dense and first.client_state.ids() == [0, 1, 2]
    state = first.state_dict()
    # The format before the table (format 1): client id -> flat c_i under "client_controls", c under "state";
    # upgraded in one place (lightning_fed.migrations), as the checkpoint connector does on load.
    (stage,) = state["aggregators"]
    table = stage["table"]["client_state_table"]
    old = {k: v for k, v in state.items() if k != "aggregators"}
    old.update(state={"control": stage["control"]}, num_clients=5, client_controls=dict(table["rows"]))
    for fmt, saved in ((CHECKPOINT_FORMAT, state), (1, old)):
        torch.save({"lightning_fed": {"format": fmt}, "callbacks": {"SCAFFOLD": saved}}, tmp_path / "s.pt")
        checkpoint = torch.load(tmp_path / "s.pt", weights_only=True)
        migrate_checkpoint(checkpoint)
        second = SCAFFOLD(lr=0.8)
        second.load_state_dict(checkpoint["callbacks"]["SCAFFOLD"])
        assert second.client_state.num_clients == 5 and second.client_state.dtype == torch.float64
        resumed = [mid[0].clone()]
        for r in rounds[2:]:
            second.server_update(resumed, [_scaffold_update(*u) for u in r])
        assert torch.equal(resumed[0], params[0])
        assert torch.equal(second.state["control"][0], full.state["control"][0])
        assert second.client_controls.keys() == full.client_controls.keys() == {0, 1, 2, 3, 4}
        for k, v in full.client_controls.items():
            assert torch.equal(second.client_controls[k], v)


# ------------------------------------------------------------------ issue #42, item 3: the client-state store
import os  # noqa: E402

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from helpers import LinearRegression, quiet_trainer_kwargs, read_only_dir, regression_data, tmpfs  # noqa: E402
from lightning_fed import FederatedTrainer  # noqa: E402
from lightning_fed.callbacks import FedAvg, FedDyn, ServerOptimizer  # noqa: E402
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner  # noqa: E402
from lightning_fed.server.client_state import MissingClientStateError, disk_manifests  # noqa: E402

_TABLE = {"SCAFFOLD": "ScaffoldControl", "FedDyn": "FedDynClient"}


def test_42_memory_load_shares_the_saved_rows_instead_of_cloning_them():
    """Loading never doubles memory: a lazily filled table takes the saved row tensors themselves, a dense one the
    saved matrix; values and the state dict are those of today bit for bit."""
    table = ClientStateTable(num_clients=4, dim=3)
    table.put(1, torch.tensor([1.0, 2.0, 3.0]))
    table.put(3, torch.tensor([-1.0, 0.5, 0.25]))
    saved = table.state_dict()
    back = ClientStateTable.from_state_dict(saved)
    assert back.ids() == [1, 3] and back.store == "memory"
    for i in (1, 3):
        assert back.get(i).data_ptr() == saved["rows"][i].data_ptr()
        assert torch.equal(back.get(i), table.get(i))
    dense = ClientStateTable(num_clients=3, dim=2, dense=True)
    dense.put(0, torch.tensor([1.0, 2.0]))
    saved = dense.state_dict()
    back = ClientStateTable.from_state_dict(saved)
    assert back.matrix.data_ptr() == saved["rows"].data_ptr() and back.present.tolist() == [True, False, False]
    back.put(2, torch.tensor([5.0, 6.0]))  # a dense table writes in place: into the loaded matrix, as before
    assert torch.equal(back.get(2), torch.tensor([5.0, 6.0]))


def test_42_disk_rows_are_files_copy_on_write_and_a_state_dict_keeps_its_versions(tmp_path):
    table = ClientStateTable(num_clients=5, dim=3, dtype=torch.float64, directory=str(tmp_path / "t"))
    assert ClientStateTable.from_state_dict(table.state_dict()).ids() == []  # no row yet, no directory yet: fine
    table.put(4, torch.tensor([1.0, 2.0, 3.0]))
    first = table.state_dict()
    assert "rows" not in first and first["store"]["kind"] == "disk" and first["store"]["ids"].tolist() == [4]
    table.put(4, torch.tensor([7.0, 8.0, 9.0]))
    files = sorted(p.name for p in (tmp_path / "t" / "rows" / "04").iterdir())
    assert len(files) == 2 and all(f.startswith("4-") and f.endswith(".row") for f in files)
    assert torch.equal(ClientStateTable.from_state_dict(first).get(4), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    assert torch.equal(table.get(4), torch.tensor([7.0, 8.0, 9.0], dtype=torch.float64)) and table.get(0).abs().sum() == 0
    # a memory table's state dict into a disk table: written to disk row by row; and back
    memory = ClientStateTable(5, 3, dtype=torch.float64)
    memory.load_state_dict(table.state_dict())
    assert memory.store == "memory" and torch.equal(memory.get(4), table.get(4))


def _population(num_clients=4):
    x, y = regression_data(n=40, d=3, seed=4)
    return FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                               partitioner=IIDPartitioner(num_clients=num_clients, seed=0), clients_per_round=2,
                               batch_size=4, local_epochs=2)


def _server(method, store, tmp_path):
    directory = None if store == "memory" else str(tmp_path / "store")
    if method == "SCAFFOLD":
        return SCAFFOLD(lr=0.8, client_state_store=store, client_state_dir=directory)
    return FedDyn(alpha=0.1, client_state_store=store, client_state_dir=directory)


def _fit(tmp_path, folder, epochs, method, store, ckpt=None, save_top_k=1):
    torch.manual_seed(0)
    model, server = LinearRegression(lr=0.05), _server(method, store, tmp_path)
    saver = ModelCheckpoint(dirpath=str(tmp_path / folder), save_last=True, every_n_epochs=1, save_top_k=save_top_k)
    FederatedTrainer(max_epochs=epochs, callbacks=[server, saver],
                     **(quiet_trainer_kwargs(tmp_path / "logs") | {"enable_checkpointing": True})).fit(
        model, datamodule=_population(), ckpt_path=ckpt)
    return model, server


def _disk_table_states(checkpoint):
    """The state dicts of the on-disk tables in a checkpoint."""
    found, stack = [], [checkpoint["callbacks"]]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("store"), dict):
                found.append(item)
            else:
                stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return found


def _table(server, method):
    return server.client_state if method == "SCAFFOLD" else server.client_algorithm_states["FedDynClient"]


def _same_run(a, b, method):
    (model_a, server_a), (model_b, server_b) = a, b
    for p, q in zip(model_a.parameters(), model_b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    ta, tb = _table(server_a, method), _table(server_b, method)
    assert ta.ids() == tb.ids() and len(ta.ids()) >= 3
    for i in ta.ids():
        torch.testing.assert_close(ta.get(i), tb.get(i), rtol=0, atol=0)


@pytest.mark.parametrize("store", ["memory", "disk"])
@pytest.mark.parametrize("method", ["SCAFFOLD", "FedDyn"])
def test_42_resume_equals_the_uninterrupted_run_for_each_store(tmp_path, method, store):
    """Bit for bit: a run resumed from round 2's last.ckpt ends like the uninterrupted one; on disk the checkpoint
    holds the manifest, not the rows, and the rows stay files (RAM holds none)."""
    full = _fit(tmp_path / "a", "ckpt", 4, method, store)
    _fit(tmp_path / "b", "ckpt", 2, method, store)
    saved = torch.load(tmp_path / "b" / "ckpt" / "last.ckpt", weights_only=True)
    assert saved["lightning_fed"]["format"] == CHECKPOINT_FORMAT == 5
    resumed = _fit(tmp_path / "b", "ckpt", 4, method, store, ckpt=str(tmp_path / "b" / "ckpt" / "last.ckpt"))
    _same_run(full, resumed, method)
    table = _table(resumed[1], method)
    assert table.store == store
    if store == "disk":
        assert table.directory == str(tmp_path / "b" / "store" / _TABLE[method]) and table._rows == {}
        (table_state,) = _disk_table_states(saved)
        assert "rows" not in table_state and table_state["store"]["directory"] == table.directory


@pytest.mark.parametrize("store", ["memory", "disk"])
@pytest.mark.parametrize("method", ["SCAFFOLD", "FedDyn"])
def test_42_rows_written_after_a_checkpoint_do_not_leak_into_a_resume_from_it(tmp_path, method, store):
    """A run goes on 2 rounds past round 2's checkpoint (its clients' rows rewritten); resuming from round 2's
    checkpoint reads round 2's rows and ends like the uninterrupted run; on disk, the versions no kept checkpoint
    references any more are deleted, every kept checkpoint's rows are there."""
    full = _fit(tmp_path / "a", "ckpt", 4, method, store, save_top_k=-1)
    first = _fit(tmp_path / "b", "ckpt", 4, method, store, save_top_k=-1)  # the run that goes on (then "crashes")
    (early,) = [str(p) for p in (tmp_path / "b" / "ckpt").glob("epoch=1-*.ckpt")]
    loaded = _table(_load_server(early, method, store, tmp_path / "b"), method)
    later = _table(first[1], method)
    assert any(not torch.equal(loaded.get(i), later.get(i)) for i in loaded.ids())  # rewritten after round 2
    resumed = _fit(tmp_path / "b", "ckpt", 4, method, store, ckpt=early, save_top_k=-1)
    _same_run(full, resumed, method)
    if store == "disk":
        directory = tmp_path / "b" / "store" / _TABLE[method]
        referenced = set()
        for name in os.listdir(tmp_path / "b" / "ckpt"):  # every kept checkpoint loads: its rows are all there
            checkpoint = torch.load(tmp_path / "b" / "ckpt" / name, weights_only=True)
            (table_state,) = _disk_table_states(checkpoint)
            store = table_state["store"]
            referenced |= {f"{i}-{v:016x}.row" for i, v in zip(store["ids"].tolist(), store["versions"].tolist())}
            assert ClientStateTable.from_state_dict(table_state).ids() == store["ids"].tolist()
        on_disk = {p.name for p in (directory / "rows").rglob("*.row")}
        assert on_disk == referenced  # garbage collected: no version that no kept checkpoint references


def _load_server(path, method, store, tmp_path):
    server = _server(method, store, tmp_path)
    (state,) = [v for k, v in torch.load(path, weights_only=True)["callbacks"].items() if k.startswith(method)]
    server.load_state_dict(state)
    if method == "SCAFFOLD":
        server.chain_state([torch.zeros(1, 3, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)])
    return server


@pytest.mark.parametrize("method", ["SCAFFOLD", "FedDyn"])
def test_42_a_missing_row_file_or_store_directory_is_refused_by_name(tmp_path, method):
    _fit(tmp_path, "ckpt", 2, method, "disk")
    last = str(tmp_path / "ckpt" / "last.ckpt")
    (manifest,) = disk_manifests(torch.load(last, weights_only=True)["callbacks"])
    client, version = manifest["ids"][0].item(), manifest["versions"][0].item()
    row = tmp_path / "store" / _TABLE[method] / "rows" / f"{client % 256:02x}" / f"{client}-{version:016x}.row"
    moved = row.with_name("elsewhere")
    row.rename(moved)
    with pytest.raises(MissingClientStateError, match=rf"row of client {client} .* \(file '{row}'\)"):
        _fit(tmp_path, "ckpt", 4, method, "disk", ckpt=last)
    moved.rename(row)
    (tmp_path / "store").rename(tmp_path / "moved")
    with pytest.raises(MissingClientStateError, match=f"directory '{tmp_path / 'store' / _TABLE[method]}'"):
        _fit(tmp_path, "ckpt", 4, method, "disk", ckpt=last)


def test_42_bad_store_arguments_are_refused_naming_them(tmp_path):
    with pytest.raises(ValueError, match=r"`client_state_store` must be one of \('memory', 'disk'\), got 'ssd'"):
        SCAFFOLD(client_state_store="ssd")
    with pytest.raises(ValueError, match="`client_state_store` must be one of"):
        FedDyn(client_state_store=None)
    with pytest.raises(ValueError, match="`client_state_dir`='x' needs client_state_store='disk'"):
        FedAvg(client_state_dir="x")
    with pytest.raises(TypeError, match="FedAWARE got an unexpected keyword argument 'client_state_store'"):
        FedAWARE(client_state_store="disk")
    ddp = FederatedTrainer(strategy="ddp", **(quiet_trainer_kwargs(tmp_path) | {"devices": 2}))
    with pytest.raises(ValueError, match=r"SCAFFOLD\(client_state_store='disk'\) runs in one process, but this "
                                         r"trainer has world_size=2"):
        SCAFFOLD(client_state_store="disk").resolve_client_state_store(ddp)
    from lightning_fed.algorithms.fedaware import FedAWAREMinNorm

    server = ServerOptimizer(weighting="num_samples", aggregators=[FedAWAREMinNorm()], client_state_store="disk")
    with pytest.raises(ValueError, match=r"ServerOptimizer\(client_state_store='disk'\): FedAWAREMinNorm computes "
                                         r"over every client's row at once"):
        FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(
            LinearRegression(lr=0.05), datamodule=_population())


def test_42_the_store_is_not_a_setting_of_the_experiment_a_resume_moves_the_rows(tmp_path):
    """A memory run resumed with the disk store (and back) ends bit for bit like the uninterrupted run."""
    full = _fit(tmp_path / "a", "ckpt", 4, "SCAFFOLD", "memory")
    _fit(tmp_path / "b", "ckpt", 2, "SCAFFOLD", "memory")
    resumed = _fit(tmp_path / "b", "ckpt", 3, "SCAFFOLD", "disk", ckpt=str(tmp_path / "b" / "ckpt" / "last.ckpt"))
    assert _table(resumed[1], "SCAFFOLD").store == "disk"
    back = _fit(tmp_path / "b", "ckpt", 4, "SCAFFOLD", "memory", ckpt=str(tmp_path / "b" / "ckpt" / "last.ckpt"))
    assert _table(back[1], "SCAFFOLD").store == "memory"
    _same_run(full, back, "SCAFFOLD")


def test_42_restoring_a_snapshot_goes_back_to_its_disk_rows(tmp_path):
    """on_nonfinite_server_step="restore" puts back the round's start: with the disk store, the snapshot's manifest
    reads the rows of before the step, not those the step wrote."""
    server = SCAFFOLD(lr=0.8, client_state_store="disk", client_state_dir=str(tmp_path / "cs"))
    server.resolve_client_state_store()
    server.num_clients = 5
    params = [torch.zeros(3, dtype=torch.float64)]
    rounds = _rounds(seed=3)
    server.server_update(params, [_scaffold_update(*u) for u in rounds[0]])
    before = {i: server.client_state.get(i).clone() for i in server.client_state.ids()}
    snapshot = server.snapshot_state()
    server.server_update(params, [_scaffold_update(*u) for u in rounds[0]])  # the same clients again
    assert any(not torch.equal(server.client_state.get(i), v) for i, v in before.items())
    server.restore_state(snapshot, params)
    table = server.client_state
    assert table.store == "disk" and table.ids() == sorted(before)
    for i, v in before.items():
        assert torch.equal(table.get(i), v)


def test_42_a_memory_snapshot_shares_the_rows_and_restores_them():
    """The snapshot before each server step (on_nonfinite_server_step="restore") does not copy the c_i table: its rows
    are the table's own tensors (never written in place); restoring it gives back the rows of before the step."""
    server = SCAFFOLD(lr=0.8)
    server.num_clients = 5
    params = [torch.zeros(3, dtype=torch.float64)]
    rounds = _rounds(seed=3)
    server.server_update(params, [_scaffold_update(*u) for u in rounds[0]])
    before = server.client_state.rows()
    snapshot = server.snapshot_state()
    rows = snapshot["aggregators"][0]["table"]["client_state_table"]["rows"]
    assert all(rows[i].data_ptr() == before[i].data_ptr() for i in before)
    assert snapshot["aggregators"][0]["control"][0].data_ptr() != server.state["control"][0].data_ptr()
    server.server_update(params, [_scaffold_update(*u) for u in rounds[0]])
    server.restore_state(snapshot, params)
    assert server.client_state.ids() == sorted(before)
    for i, v in before.items():
        assert torch.equal(server.client_state.get(i), v)


# ---------------------------------------------------------------------------------------------- issue #49
import re  # noqa: E402
import errno  # noqa: E402
import gc  # noqa: E402
import shutil  # noqa: E402

from lightning.pytorch.callbacks import Callback  # noqa: E402

from lightning_fed.checkpoint import AtomicCheckpointIO  # noqa: E402
from lightning_fed.server.client_state import (  # noqa: E402
    ClientStateStore,
    ClientStateStoreError,
    CorruptClientStateError,
)


class _Trained(Callback):
    """Counts the local steps run (a client that trained)."""

    def __init__(self):
        self.steps = 0

    def on_train_batch_start(self, *args):
        self.steps += 1


def _fit_run(root, epochs, ckpt=None, directory=None, method="SCAFFOLD", callbacks=()):
    """A run whose folder is ``root``: checkpoints in ``root/ckpt``, the disk store at its default
    ``root/client_state`` (or ``directory``)."""
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    server = SCAFFOLD(lr=0.8, client_state_store="disk", client_state_dir=directory) if method == "SCAFFOLD" else \
        FedDyn(alpha=0.1, client_state_store="disk", client_state_dir=directory)
    saver = ModelCheckpoint(dirpath=str(root / "ckpt"), save_last=True, every_n_epochs=1, save_top_k=1)
    FederatedTrainer(max_epochs=epochs, callbacks=[server, saver, *callbacks],
                     **(quiet_trainer_kwargs(root) | {"enable_checkpointing": True})).fit(
        model, datamodule=_population(), ckpt_path=None if ckpt is None else str(ckpt))
    return model, server


def _row_files(directory):
    return {p.relative_to(directory): p.read_bytes() for p in directory.rglob("*.row")}


def test_49_a_checkpoint_copied_by_hand_keeps_its_rows(tmp_path):
    """`cp last.ckpt backup.ckpt` after round 2; the run goes on 2 rounds (rewriting its clients' rows, collecting
    the superseded versions); the copy still resumes, bit for bit like the uninterrupted run."""
    full = _fit_run(tmp_path / "a", 4)
    _fit_run(tmp_path / "b", 2)
    shutil.copy(tmp_path / "b" / "ckpt" / "last.ckpt", tmp_path / "b" / "ckpt" / "backup.ckpt")
    gc.collect()  # the first run's tables gone, as in a new process (a live table's rows are never deleted)
    went_on = _fit_run(tmp_path / "b", 4, ckpt=tmp_path / "b" / "ckpt" / "last.ckpt")
    _same_run(full, went_on, "SCAFFOLD")
    resumed = _fit_run(tmp_path / "b", 4, ckpt=tmp_path / "b" / "ckpt" / "backup.ckpt")
    _same_run(full, resumed, "SCAFFOLD")


def test_49_a_checkpoint_renamed_by_hand_keeps_its_rows_and_unreferenced_ones_still_go(tmp_path):
    """A checkpoint renamed by hand (`mv`), then its old path saved again: the renamed file's rows stay; versions no
    file references are deleted (the garbage collection still works)."""
    table = ClientStateTable(num_clients=3, dim=2, dtype=torch.float64, directory=str(tmp_path / "cs" / "T"))
    io, ckpt = AtomicCheckpointIO(), tmp_path / "ckpt"
    table.put(0, torch.tensor([1.0, 2.0]))
    io.save_checkpoint({"callbacks": {"S": table.state_dict()}}, str(ckpt / "last.ckpt"))
    os.rename(ckpt / "last.ckpt", ckpt / "kept.ckpt")
    table.put(0, torch.tensor([3.0, 4.0]))  # supersedes the kept version
    table.put(0, torch.tensor([5.0, 6.0]))  # supersedes a version no file references
    io.save_checkpoint({"callbacks": {"S": table.state_dict()}}, str(ckpt / "last.ckpt"))
    kept = torch.load(ckpt / "kept.ckpt", weights_only=True)["callbacks"]["S"]
    assert ClientStateTable.from_state_dict(kept).get(0).tolist() == [1.0, 2.0]
    assert len(list((tmp_path / "cs" / "T" / "rows").rglob("*.row"))) == 2  # [1, 2] and [5, 6]; [3, 4] deleted
    os.remove(ckpt / "kept.ckpt")
    table.put(0, torch.tensor([7.0, 8.0]))
    io.save_checkpoint({"callbacks": {"S": table.state_dict()}}, str(ckpt / "last.ckpt"))
    rows = sorted(torch.from_file(str(p), size=2, dtype=torch.float64).tolist()
                  for p in (tmp_path / "cs" / "T" / "rows").rglob("*.row"))
    assert rows == [[7.0, 8.0]]  # the copy gone: its version goes too


def test_49_a_copied_run_folder_is_independent(tmp_path):
    """A run folder copied (`cp -r`) to branch an experiment resumes from its own rows and writes its own store:
    the original deleted, the copy still resumes, bit for bit."""
    full = _fit_run(tmp_path / "a", 4)
    _fit_run(tmp_path / "orig", 2)
    shutil.copytree(tmp_path / "orig", tmp_path / "copy")
    before = _row_files(tmp_path / "orig")
    shutil.rmtree(tmp_path / "orig")
    resumed = _fit_run(tmp_path / "copy", 4, ckpt=tmp_path / "copy" / "ckpt" / "last.ckpt")
    _same_run(full, resumed, "SCAFFOLD")
    assert resumed[1].client_state.directory == str(tmp_path / "copy" / "client_state" / "ScaffoldControl")
    assert not (tmp_path / "orig").exists() and before


def test_49_a_resume_with_another_client_state_dir_copies_the_rows_there(tmp_path):
    """The resume's `client_state_dir` is used (the checkpoint's rows copied there), bit for bit; the directory
    the checkpoint references is left as it was."""
    full = _fit_run(tmp_path / "a", 4)
    _fit_run(tmp_path / "b", 2, directory=str(tmp_path / "b" / "first"))
    before = _row_files(tmp_path / "b" / "first")
    resumed = _fit_run(tmp_path / "b", 4, ckpt=tmp_path / "b" / "ckpt" / "last.ckpt",
                       directory=str(tmp_path / "b" / "second"))
    _same_run(full, resumed, "SCAFFOLD")
    assert resumed[1].client_state.directory == str(tmp_path / "b" / "second" / "ScaffoldControl")
    assert _row_files(tmp_path / "b" / "first") == before  # untouched: no row added or deleted there
    (manifest,) = disk_manifests(torch.load(tmp_path / "b" / "ckpt" / "last.ckpt", weights_only=True)["callbacks"])
    assert manifest["directory"] == str(tmp_path / "b" / "second" / "ScaffoldControl")


def test_49_table_folders_are_injective_and_never_outside_the_store(tmp_path):
    keys = ["ScaffoldControl", "FedDynClient", "a b", "a_b", "a-b", "a/b", "..", ".", "", "/etc", "../../x",
            "a" * 101, "a" * 100, "FedProxClient{mu=0.1}", "FedProxClient{mu=0_1}"]
    store = ClientStateStore("disk", str(tmp_path / "cs"))
    folders = [store.table_directory(k) for k in keys]
    assert len(set(folders)) == len(keys)
    assert all(os.path.dirname(f) == str(tmp_path / "cs") and os.path.basename(f) not in ("", ".", "..")
               for f in folders)
    assert folders[:2] == [str(tmp_path / "cs" / "ScaffoldControl"), str(tmp_path / "cs" / "FedDynClient")]
    # real files: two tables whose keys today's mapping sent to one folder keep their own rows and refs
    a, b = (store.table(k, 2, 2, torch.float64) for k in ("a b", "a_b"))
    io = AtomicCheckpointIO()
    a.put(0, torch.tensor([1.0, 1.0]))
    b.put(0, torch.tensor([2.0, 2.0]))
    io.save_checkpoint({"callbacks": {"A": a.state_dict(), "B": b.state_dict()}}, str(tmp_path / "one.ckpt"))
    a.put(0, torch.tensor([3.0, 3.0]))
    b.put(0, torch.tensor([4.0, 4.0]))
    io.save_checkpoint({"callbacks": {"A": a.state_dict(), "B": b.state_dict()}}, str(tmp_path / "two.ckpt"))
    os.makedirs(tmp_path / "elsewhere")
    os.rename(tmp_path / "two.ckpt", tmp_path / "elsewhere" / "two.ckpt")  # out of sight of the scan
    a.put(0, torch.tensor([5.0, 5.0]))
    io.save_checkpoint({"callbacks": {"A": a.state_dict()}}, str(tmp_path / "three.ckpt"))
    one = torch.load(tmp_path / "one.ckpt", weights_only=True)["callbacks"]
    assert ClientStateTable.from_state_dict(one["A"]).get(0).tolist() == [1.0, 1.0]
    assert ClientStateTable.from_state_dict(one["B"]).get(0).tolist() == [2.0, 2.0]
    assert not (tmp_path / "x").exists() and not (tmp_path / "etc").exists()


def _strip_to_todays_format(path, move_to=None):
    """Rewrite the checkpoint at ``path`` in the manifest format of before issue #49 (absolute directory only, no
    checksums, flags or relative directory), optionally with the table folder moved to ``move_to``."""
    checkpoint = torch.load(path, weights_only=True)
    for manifest in disk_manifests(checkpoint["callbacks"]):
        for key in ("crc32", "finite", "relative", "saved_directory"):
            manifest.pop(key, None)
        if move_to is not None:
            os.rename(manifest["directory"], move_to)
            manifest["directory"] = str(move_to)
    torch.save(checkpoint, path)


@pytest.mark.parametrize("method", ["SCAFFOLD", "FedDyn"])
def test_49_a_checkpoint_in_the_format_of_before_resumes_bit_for_bit(tmp_path, method):
    """A manifest of before issue #49 (no checksums, absolute directory), its folder named by the old mapping
    (`re.sub` of the key, here standing for a key with `{`): resumed bit for bit, its rows copied into the table's
    folder of today."""
    full = _fit_run(tmp_path / "a", 4, method=method)
    _fit_run(tmp_path / "b", 2, method=method)
    last = tmp_path / "b" / "ckpt" / "last.ckpt"
    _strip_to_todays_format(last, move_to=tmp_path / "b" / "client_state" / "Old_mapping_")
    resumed = _fit_run(tmp_path / "b", 4, ckpt=last, method=method)
    _same_run(full, resumed, method)
    assert _table(resumed[1], method).directory == str(tmp_path / "b" / "client_state" / _TABLE[method])


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("method", ["SCAFFOLD", "FedDyn"])
def test_49_a_damaged_row_is_refused_naming_the_file_and_the_client(tmp_path, method):
    """One flipped bit in each row file of the checkpoint: the resume refuses the first row it reads
    (CorruptClientStateError, a MissingClientStateError), naming the file and the client, instead of training on
    other numbers."""
    _fit_run(tmp_path, 2, method=method)
    last = tmp_path / "ckpt" / "last.ckpt"
    (manifest,) = disk_manifests(torch.load(last, weights_only=True)["callbacks"])
    directory = tmp_path / "client_state" / _TABLE[method]
    files = {}
    for client, version in zip(manifest["ids"].tolist(), manifest["versions"].tolist()):
        files[client] = directory / "rows" / f"{client % 256:02x}" / f"{client}-{version:016x}.row"
        _flip_a_byte(files[client])
    with pytest.raises(CorruptClientStateError, match=r"row of client (\d+) .* is damaged \(file '.*\.row': CRC-32") \
            as error:
        _fit_run(tmp_path, 4, ckpt=last, method=method)
    client = int(re.search(r"row of client (\d+)", str(error.value)).group(1))
    assert str(files[client]) in str(error.value) and isinstance(error.value, MissingClientStateError)


def _nan_row_checkpoint(path, client):
    """The checkpoint at ``path`` rewritten with client ``client``'s row of the per-client table holding a NaN
    (written through the table, as a server step would)."""
    checkpoint = torch.load(path, weights_only=True)
    (state,) = [v for k, v in checkpoint["callbacks"].items() if k.startswith("SCAFFOLD")]
    holder = state["aggregators"][0]["table"]
    table = ClientStateTable.from_state_dict(holder["client_state_table"])
    row = table.get(client).clone()
    row[1] = float("nan")
    table.put(client, row)
    holder["client_state_table"] = table.state_dict()
    AtomicCheckpointIO().save_checkpoint(checkpoint, str(path))


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_49_a_nonfinite_row_is_refused_at_resume_in_either_store(tmp_path, store):
    """A c_i row holding a NaN in the checkpoint: the resume is refused before any client trains, on disk as in
    memory."""
    _fit(tmp_path, "ckpt", 2, "SCAFFOLD", store)
    last = tmp_path / "ckpt" / "last.ckpt"
    state = _disk_table_states(torch.load(last, weights_only=True)) if store == "disk" else None
    client = int(state[0]["store"]["ids"][0]) if state else 0
    if store == "memory":
        client = sorted(_load_server(str(last), "SCAFFOLD", store, tmp_path).client_state.ids())[0]
    _nan_row_checkpoint(last, client)
    trained = _Trained()
    torch.manual_seed(0)
    saver = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True, every_n_epochs=1)
    with pytest.raises(ValueError, match=rf"Cannot resume from .*client.{{0,40}}{client}.*1 non-finite value"):
        FederatedTrainer(max_epochs=4, callbacks=[_server("SCAFFOLD", store, tmp_path), saver, trained],
                         **(quiet_trainer_kwargs(tmp_path / "logs") | {"enable_checkpointing": True})).fit(
            LinearRegression(lr=0.05), datamodule=_population(), ckpt_path=str(last))
    assert trained.steps == 0


def test_49_a_read_only_client_state_dir_is_refused_at_fit_start(tmp_path):
    with read_only_dir(tmp_path / "ro") as read_only:
        trained = _Trained()
        with pytest.raises(ClientStateStoreError, match=rf"`client_state_dir` '{read_only / 'cs'}' \(the on-disk "
                                                        rf"client-state store\) is not writable: creating "):
            _fit_run(tmp_path, 2, directory=str(read_only / "cs"), callbacks=[trained])
        assert trained.steps == 0  # refused before any client trained
        with pytest.raises(ClientStateStoreError, match=rf"`client_state_dir` '{read_only}' .* is not writable: "
                                                        rf"writing '{read_only}/\.writable-"):
            ClientStateStore("disk", str(read_only)).check_writable()


def test_49_a_full_disk_while_writing_a_row_names_the_file_and_the_store(tmp_path):
    with tmpfs(tmp_path / "small", "size=64k") as small:
        table = ClientStateTable(num_clients=2, dim=20_000, directory=str(small / "T"))  # a row: 80 kB > 64 kB
        with pytest.raises(ClientStateStoreError, match=rf"Cannot write the row of client 1 '{small}/T/rows/01/1-"
                                                        rf"[0-9a-f]{{16}}\.row' of the client-state store '{small}/T'"
                                                        r" \(`client_state_dir`\): No space left on device") as error:
            table.put(1, torch.ones(20_000))
        assert error.value.errno == errno.ENOSPC
        assert [p.name for p in (small / "T" / "rows" / "01").iterdir()] == []  # no partial file left
        assert 1 not in table and table.ids() == []


def test_52_collect_tables_garbage_visits_each_on_disk_table_once_and_skips_the_rest(tmp_path):
    """The server optimizer's round-start garbage collection over its tables (client halves', stages', its own):
    every superseded row version of each on-disk table goes, the live ones stay; in-memory tables and ``None``
    are skipped; a table listed twice is collected once."""
    import glob
    import os

    from lightning_fed.server.client_state import collect_tables_garbage

    a = ClientStateTable(num_clients=3, dim=2, directory=str(tmp_path / "a"))
    b = ClientStateTable(num_clients=3, dim=1, directory=str(tmp_path / "b"))
    memory = ClientStateTable(num_clients=3, dim=2)
    for value in (1.0, 2.0, 3.0):  # client 0 of a written three times, client 2 of b twice
        a.put(0, torch.full((2,), value))
    b.put(2, torch.ones(1)), b.put(2, torch.zeros(1)), memory.put(1, torch.ones(2))

    def files(table):
        return len(glob.glob(os.path.join(table.directory, "rows", "*", "*.row")))

    assert (files(a), files(b)) == (3, 2)
    collect_tables_garbage([a, None, memory, b, a])
    assert (files(a), files(b)) == (1, 1)
    assert a.get(0).tolist() == [3.0, 3.0] and b.get(2).tolist() == [0.0] and memory.get(1).tolist() == [1.0, 1.0]
