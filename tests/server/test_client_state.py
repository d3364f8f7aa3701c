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
