"""lightning_fed.client.personal: the parts a client keeps local, selected by name, type or predicate, and the
per-client state sized by them (the methods end to end: tests/algorithms/test_fedbn.py, test_fedper.py,
test_fedrep.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_fed.client.personal import LocalParts, select_parts


def _net():
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_select_by_name_type_and_predicate():
    net = _net()
    assert select_parts(net, names=["0.bias"]) == ([1], [])
    assert select_parts(net, types=[nn.BatchNorm1d]) == ([2, 3], [0, 1, 2])
    assert select_parts(net, predicate=lambda name, t: name.endswith("weight") and t.ndim == 2) == ([0, 4], [])
    assert select_parts(net, names=["2"], types=[nn.BatchNorm1d]) == ([2, 3, 4, 5], [0, 1, 2])


def test_state_is_sized_by_what_is_kept_and_the_update_is_zero_there():
    net = _net()
    half = LocalParts(names=["2"], types=[nn.BatchNorm1d])
    half.setup(net)
    assert half.state_dim(10**6) == 4 * 2 + 2 + 4 + 4 + 4 + 4 + 1  # head W, b; BN γ, β; mean, var, count
    before = [t.detach().clone() for t in list(net.parameters()) + list(net.buffers())]
    half.start(net, None, None)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
        net[1].num_batches_tracked += 3
    _, state = half.finish(net, None)
    assert state.shape == (half.state_dim(0),) and state[-1].item() == 3
    after = list(net.parameters()) + list(net.buffers())
    for i, (a, b) in enumerate(zip(before, after)):
        kept = i in (2, 3, 4, 5, 6, 7, 8)  # BN γ, β, head W, b; BN buffers
        assert torch.equal(a, b) == kept
    half.start(net, None, state)  # the next round: the client's own values come back
    assert torch.equal(net[2].bias, before[5] + 1) and net[1].num_batches_tracked.item() == 3


@pytest.mark.parametrize("kwargs, match", [
    ({"names": [1]}, "`names` must be a list"), ({"types": ["BatchNorm2d"]}, "`types` must be a list of module"),
    ({"predicate": 3}, "`predicate` must be callable"),
])
def test_bad_selections_are_refused(kwargs, match):
    with pytest.raises(TypeError, match=match):
        LocalParts(**kwargs)


def test_two_halves_keeping_one_tensor_are_refused_naming_both_and_the_tensors():
    """Issue #49: FedBN and FedPer with a head that holds the BatchNorm layer both keep it; the fit-start check names
    both halves and exactly the shared parameters and buffers (disjoint selections pass)."""
    from lightning_fed.algorithms import FedBNClient, FedPerClient
    from lightning_fed.client.personal import check_disjoint_local_parts

    net = _net()  # Linear(3, 4), BatchNorm1d(4), Linear(4, 2)
    bn, per, body = FedBNClient(), FedPerClient(head=["1", "2"]), LocalParts(names=["0.weight"])
    for half in (bn, per, body):
        half.setup(net)
    bias = LocalParts(names=["0.bias"])
    bias.setup(net)
    check_disjoint_local_parts([bn, body, bias], net)  # disjoint: accepted
    check_disjoint_local_parts([per, body, bias], net)
    with pytest.raises(ValueError) as err:
        check_disjoint_local_parts([body, bn, per], net)
    assert str(err.value).startswith(
        "Client halves FedBNClient() and FedPerClient(head=['1', '2']) both keep 1.weight, 1.bias, 1.running_mean, "
        "1.running_var, 1.num_batches_tracked local;")


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`:UserWarning")
def test_overlapping_kept_parts_are_refused_at_fit_start_before_any_client_trains(tmp_path):
    """The same refusal in a fit: FedPer's head given to the server optimizer and a LocalParts of the trainer keeping
    the head's bias (two state keys, so nothing else refused it; the head was then averaged into the global model)."""
    import lightning as L
    from lightning.pytorch.callbacks import Callback
    from torch.utils.data import TensorDataset

    from helpers import quiet_trainer_kwargs, regression_data
    from lightning_fed import FederatedTrainer
    from lightning_fed.algorithms import FedPerClient
    from lightning_fed.callbacks import FedAvg
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    class TwoLayer(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1)).double()

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.net(batch[0]).squeeze(-1), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class Trained(Callback):
        batches = 0

        def on_train_batch_start(self, *args):
            Trained.batches += 1

    x, y = regression_data(n=24)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2, batch_size=4)
    trainer = FederatedTrainer(max_epochs=2, callbacks=[FedAvg(client=[FedPerClient(head=["net.1"])]), Trained()],
                               client_algorithms=[LocalParts(names=["net.1.bias"])], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"^Client halves FedPerClient\(head=\['net.1'\]\) and LocalParts\(names="
                                         r"\['net.1.bias'\], types=\[\], predicate=None\) both keep net.1.bias local"):
        trainer.fit(TwoLayer(), datamodule=dm)
    assert Trained.batches == 0 and trainer.current_epoch == 0


def test_49_a_predicate_by_name_is_looked_up_in_the_registry_only():
    """From a config, `predicate` is a registered name (`bias_tensors`: names ending in bias); any other name — e.g.
    the importable `os.system`, which jsonargparse would import and fit start call — is refused, naming the allowed
    ones; registering a function makes its name usable; Python callers still pass any callable."""
    from lightning_fed.client.personal import PARTS_PREDICATES, bias_tensors, register_parts_predicate

    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1))
    # parameters: 0.weight, 0.bias, 1.weight, 1.bias, 2.weight, 2.bias -> the biases are 1, 3, 5
    assert LocalParts(predicate="bias_tensors").predicate is bias_tensors
    assert select_parts(net, predicate=LocalParts(predicate="bias_tensors").predicate) == ([1, 3, 5], [])
    # vector_tensors: ndim <= 1 -> every bias, BN's weight, and BN's 3 buffers (running mean/var, batches tracked)
    assert select_parts(net, predicate=LocalParts(predicate="vector_tensors").predicate) == ([1, 2, 3, 5], [0, 1, 2])
    with pytest.raises(ValueError, match=r"`predicate` 'os.system' is not a registered LocalParts predicate; a config "
                                         r"may name only \['bias_tensors', 'vector_tensors'\]"):
        LocalParts(predicate="os.system")

    def first_layer(name, tensor):
        return name.startswith("0.")

    try:
        register_parts_predicate("first_layer", first_layer)
        assert select_parts(net, predicate=LocalParts(predicate="first_layer").predicate) == ([0, 1], [])
        with pytest.raises(ValueError, match="already registered as 'first_layer'"):
            register_parts_predicate("first_layer", bias_tensors)
    finally:
        PARTS_PREDICATES.pop("first_layer", None)
    assert LocalParts(predicate=first_layer).predicate is first_layer  # Python: any callable
