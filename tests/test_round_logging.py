"""Lightning semantics in federated training: every Trainer feature keeps its meaning or is refused (issue #11 A)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset
from helpers import LinearRegression, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner


# ---------------------------------------------------------------- #11.3 Trainer arguments
def _regression_dm(num_clients=4, n=40, **kwargs):
    x, y = regression_data(n=n)
    kwargs = {"clients_per_round": 2, "batch_size": 3} | kwargs
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    return FederatedDataModule(dataset, partitioner=IIDPartitioner(num_clients=num_clients, seed=0), **kwargs)


# ---------------------------------------------------------------- #11.5, #16.5, #16.6 logged values
class _LoggingRegression(LinearRegression):
    """Logs its loss at step and epoch level; client 1 (the one with x[0, 0] > 100) can be made to fail."""

    fail_marker = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)
        self.log("fit", loss, on_step=True, on_epoch=True)
        self.log("train_loss", loss)
        if self.fail_marker is not None and bool((x[:, 0] == self.fail_marker).any()):
            raise RuntimeError("client fails after logging")
        return loss


def _client_losses_numpy(model, dm, clients):
    w = model.linear.weight.detach().numpy().ravel()
    b = float(model.linear.bias.detach())
    x, y = dm.train_dataset.tensors
    out = []
    for c in clients:
        idx = dm.client_indices(c)
        out.append((len(idx), float(np.mean((x.numpy()[idx] @ w + b - y.numpy()[idx]) ** 2))))
    return out


def test_logged_training_values_are_the_client_weighted_round_value(tmp_path):
    """One local full-batch step per client: each client's logged loss is its loss at x_0; the round's value is the
    sample-weighted mean over the cohort (computed in NumPy), and equals round_train_loss (#11.5)."""
    x, y = regression_data(n=30)
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    dm = FederatedDataModule(dataset, partitioner=IIDPartitioner(num_clients=3, seed=0), clients_per_round=3,
                             batch_size=30)
    dm.setup()
    model = _LoggingRegression()
    expected = _client_losses_numpy(model, dm, range(3))
    value = sum(n * l for n, l in expected) / sum(n for n, _ in expected)
    trainer = FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    m = trainer.callback_metrics
    for key in ("train_loss", "fit_step", "fit_epoch", "round_train_loss"):
        assert float(m[key]) == pytest.approx(value, rel=1e-6), key


def test_dropped_clients_values_do_not_enter_the_round_value(tmp_path):
    """A client that logs and then fails contributes nothing to train_loss (#16.6)."""
    x, y = regression_data(n=30)
    x[0, 0] = 1234.5  # sample 0 makes its client fail after logging a huge loss
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    dm = FederatedDataModule(dataset, partitioner=IIDPartitioner(num_clients=3, seed=0), clients_per_round=3,
                             batch_size=30)
    dm.setup()
    model = _LoggingRegression()
    model.fail_marker = 1234.5
    bad = next(c for c in range(3) if 0 in dm.client_indices(c))
    good = [c for c in range(3) if c != bad]
    expected = _client_losses_numpy(model, dm, good)
    value = sum(n * l for n, l in expected) / sum(n for n, _ in expected)
    trainer = FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match="dropped"):
        trainer.fit(model, datamodule=dm)
    m = trainer.callback_metrics
    assert float(m["round_clients_dropped"]) == 1
    for key in ("train_loss", "fit_step", "fit_epoch", "round_train_loss"):
        assert float(m[key]) == pytest.approx(value, rel=1e-6), key


class _ManualRegression(LinearRegression):
    """Lightning's documented manual-optimization style: training_step returns nothing."""

    def __init__(self, return_every_other=False, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False
        self.return_every_other = return_every_other

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        if self.return_every_other and batch_idx % 2 == 0:
            return loss
        return None


def test_manual_optimization_without_a_returned_loss_trains(tmp_path):
    """Returning nothing is 'no loss reported', not a non-finite update: every client counts (#16.5)."""
    model = _ManualRegression()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = FederatedTrainer(max_epochs=2, **quiet_trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match="no client reported a training loss"):
        trainer.fit(model, datamodule=_regression_dm())
    assert float(trainer.callback_metrics["round_clients_dropped"]) == 0
    assert float(trainer.callback_metrics["round_clients"]) == 2
    assert torch.isnan(trainer.callback_metrics["round_train_loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_round_train_loss_averages_only_reported_losses(tmp_path):
    """Steps that return None are not counted as zero loss (#16.6): one client, full batches of 5, two epochs —
    steps 0 and 2 report; the mean is over those two, computed by hand from the SGD iterates."""
    x, y = regression_data(n=10)
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    dm = FederatedDataModule(dataset, partitioner=IIDPartitioner(num_clients=1, seed=0), clients_per_round=1,
                             batch_size=5, local_epochs=1, data_order="none")
    model = _ManualRegression(return_every_other=True, lr=0.1)
    w = np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])
    dm.setup()
    idx = dm.client_indices(0)
    xb, yb = np.hstack([x[idx], np.ones((10, 1))]), y[idx]
    losses = []
    for k in range(2):
        xs, ys = xb[5 * k:5 * k + 5], yb[5 * k:5 * k + 5]
        losses.append(np.mean((xs @ w - ys) ** 2))
        w = w - 0.1 * 2 / 5 * xs.T @ (xs @ w - ys)
    trainer = FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    assert float(trainer.callback_metrics["round_train_loss"]) == pytest.approx(losses[0], rel=1e-6)  # logged as float32


# ---------------------------------------------------------------- #32.3 no warnings from our own paths
#: Lightning 2.6's own CombinedLoader under torch 2.14 (a plain `lightning.Trainer.fit` with a validation loader
#: warns the same): neither ours nor the user's to fix.
_LIGHTNING_OWN = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def test_an_ordinary_federated_fit_warns_nothing(tmp_path):
    """A plain federated fit (FedAdam, validation, TensorBoard, checkpoints, progress bar) raises no warning from the
    package's own paths. Before #32 the fast round-logging path updated Lightning's result metrics without
    torchmetrics' update bookkeeping, and every round metric warned "The ``compute`` method of metric _ResultMetric
    was called before the ``update`` method" once per round."""
    import warnings

    import lightning as L
    from helpers import SmallClassifier, classification_dataset
    from lightning_fed.callbacks import FedAdam

    train, val = classification_dataset(n=300, n_val=60)
    data = FederatedDataModule(train, val_dataset=val, partitioner=IIDPartitioner(num_clients=10, seed=0),
                               clients_per_round=3, batch_size=10, local_epochs=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=_LIGHTNING_OWN, category=FutureWarning)
        trainer = FederatedTrainer(max_epochs=3, callbacks=[FedAdam(lr=0.01)], default_root_dir=str(tmp_path),
                                   logger=L.pytorch.loggers.TensorBoardLogger(str(tmp_path), default_hp_metric=False))
        trainer.fit(SmallClassifier(), datamodule=data)
    assert trainer.current_epoch == 3 and trainer.fit_loop.fast_round_logging
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
