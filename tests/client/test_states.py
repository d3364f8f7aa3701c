"""ClientStates: the run's per-client state (issue #52). The client runner owns it; a client half reads its row
through its ClientContext; the server optimizer hands over what it loaded and saves the run's registry."""

from __future__ import annotations

import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.algorithms import FedDynClient
from lightning_fed.callbacks import FedAvg
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.client.runner import ClientContext, ClientRunner
from lightning_fed.client.states import ClientStates


def _update(client_id, row):
    return ClientUpdate(client_id, [torch.zeros(2)], 1, 1, 0.0, extras={"client_state/FedDynClient": row})


def test_rows_are_written_when_updates_arrive_and_read_through_the_client_context():
    states, half = ClientStates(), FedDynClient(alpha=0.1)
    states.setup([half], {"FedDynClient": 2}, num_clients=4, dtype=torch.float64)
    states.receive([_update(1, torch.tensor([0.5, -1.5])), _update(3, torch.tensor([2.0, 4.0]))], [half])
    table = states.tables["FedDynClient"]
    assert (table.num_clients, table.dim, table.dtype, table.ids()) == (4, 2, torch.float64, [1, 3])
    runner, seen = ClientRunner(), []

    class Recorder(ClientAlgorithm):  # a half that keeps what start hands it, reading FedDyn's rows
        state_key = "FedDynClient"

        def start(self, module, context, state):
            seen.append(None if state is None else state.tolist())

    runner.client_halves.algorithms = [Recorder()]
    for client_id in (3, 0):  # the runner's own registry is empty: the rows come through the context's
        runner.client_halves.start(None, ClientContext(client_id, 0, [torch.zeros(2)], [], 0.1, client_states=states))
    assert seen == [[2.0, 4.0], None]


def test_a_row_of_the_wrong_size_is_refused_naming_the_half_the_client_and_both_sizes():
    states, half = ClientStates(), FedDynClient(alpha=0.1)
    states.setup([half], {"FedDynClient": 2}, num_clients=4, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"Client half FedDynClient \(given\) returned a per-client state of 3 "
                                         r"numbers from finish\(\) for client 2, but its state_dim\(2\) is 2\."):
        states.receive([_update(2, torch.ones(3))], [half])


def test_a_loaded_registry_is_checked_against_the_run_then_stale_tables_dropped():
    saved = ClientStates()
    saved.setup([FedDynClient(alpha=0.1)], {"FedDynClient": 2}, num_clients=4, dtype=torch.float32)
    saved.tables["FedDynClient"].put(0, torch.tensor([1.0, 2.0]))
    loaded = ClientStates()
    loaded.load_state_dict(saved.state_dict())
    assert loaded.loaded and loaded.row("FedDynClient", 0).tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match=r"population changed from N = 4 to N = 5 clients"):
        loaded.setup([FedDynClient(alpha=0.1)], {"FedDynClient": 2}, num_clients=5, dtype=torch.float32)
    with pytest.warns(UserWarning, match=r"per-client state of client half\(s\) \['FedDynClient'\]"):
        loaded.setup([], {}, num_clients=4, dtype=torch.float32)
    assert loaded.tables == {} and not loaded.loaded


def test_the_runner_owns_the_registry_and_the_server_optimizer_hands_over_what_it_loaded():
    runner, half = ClientRunner(), FedDynClient(alpha=0.1)
    run_states = runner.client_halves.states
    saved = ClientStates()
    saved.setup([half], {"FedDynClient": 2}, num_clients=3, dtype=torch.float32)
    saved.tables["FedDynClient"].put(2, torch.tensor([7.0, 8.0]))
    server = FedAvg()
    server.load_state_dict({"num_steps": 1, "state": {}, "client_algorithms": saved.state_dict()})
    assert server.client_states is not run_states and server.loaded_client_state
    server.bind_client_algorithms([half], run_states)
    assert server.client_states is run_states and run_states.loaded
    assert run_states.row("FedDynClient", 2).tolist() == [7.0, 8.0]
    run_states.tables["FedDynClient"].put(0, torch.tensor([1.0, 1.0]))  # the run writes a row ...
    rows = server.state_dict()["client_algorithms"]["FedDynClient"]["rows"]  # ... and the checkpoint holds it
    assert sorted(rows) == [0, 2] and rows[0].tolist() == [1.0, 1.0]


def test_where_a_half_was_given_names_its_list_and_position():
    """where_given (the server optimizer's error text for a half's wrong-size state): a half of the server
    optimizer's own list by its ``client[i]``; any other by its position among the trainer's halves only."""
    from lightning_fed.client.states import where_given

    own_a, own_b, trainer_a, trainer_b = (FedDynClient(alpha=0.1) for _ in range(4))
    run = [own_a, own_b, trainer_a, trainer_b]
    assert where_given(own_b, [own_a, own_b], run, "SCAFFOLD") == "`client[1]` of SCAFFOLD"
    assert where_given(trainer_b, [own_a, own_b], run, "SCAFFOLD") == "`client_algorithms[1]` of the trainer"
    assert where_given(trainer_a, [], [trainer_a], "FedAvg") == "`client_algorithms[0]` of the trainer"
