"""Lightning semantics in federated training: every Trainer feature keeps its meaning or is refused (issue #11 A)."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import TensorDataset

from helpers import LinearRegression, SmallClassifier, classification_dataset, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import FedAdam, FedAvg
from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule, IIDPartitioner


class _ExpDecay(SmallClassifier):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)}


def _classification_dm(**kwargs):
    train, val = classification_dataset(n=300, n_val=60)
    kwargs = {"clients_per_round": 3, "batch_size": 8} | kwargs
    return FederatedDataModule(train, val_dataset=val, partitioner=DirichletPartitioner(num_clients=10, alpha=1.0, seed=0), **kwargs)


def _fit_sched(root, max_epochs, ckpt_dir, ckpt_path=None):
    torch.manual_seed(0)
    model = _ExpDecay(lr=0.1)
    checkpoint = ModelCheckpoint(dirpath=str(ckpt_dir), save_last=True, save_top_k=-1, every_n_epochs=1)
    kwargs = quiet_trainer_kwargs(root) | {"enable_checkpointing": True}
    trainer = FederatedTrainer(max_epochs=max_epochs, callbacks=[FedAdam(lr=0.05, tau=1e-2), checkpoint], **kwargs)
    trainer.fit(model, datamodule=_classification_dm(), ckpt_path=ckpt_path)
    return model, trainer


def test_resume_with_lr_scheduler_equals_uninterrupted(tmp_path):
    """ExponentialLR(γ=0.5), 6 rounds, resumed at rounds 2 and 4: same client lr and weights as one run (#11.1)."""
    full, full_trainer = _fit_sched(tmp_path / "a", 6, tmp_path / "ca")
    _fit_sched(tmp_path / "b", 2, tmp_path / "cb")
    _fit_sched(tmp_path / "b", 4, tmp_path / "cb", ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    resumed, trainer = _fit_sched(tmp_path / "b", 6, tmp_path / "cb", ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    lr = trainer.optimizers[0].param_groups[0]["lr"]
    assert lr == pytest.approx(0.1 * 0.5**6, rel=0, abs=1e-15)
    assert lr == full_trainer.optimizers[0].param_groups[0]["lr"]
    for a, b in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("server", [FedAvg, FedAdam])
def test_plain_trainer_with_server_optimizer_is_refused(tmp_path, server):
    """A server optimizer does nothing under a plain lightning.Trainer: refuse, naming FederatedTrainer (#11.2)."""
    trainer = L.Trainer(max_epochs=1, callbacks=[server()], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(RuntimeError, match="FederatedTrainer"):
        trainer.fit(SmallClassifier(), datamodule=_classification_dm())


def test_plain_trainer_without_server_optimizer_still_trains_centrally(tmp_path):
    model = SmallClassifier()
    before = [p.detach().clone() for p in model.parameters()]
    L.Trainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=_classification_dm())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


# ---------------------------------------------------------------- #11.3 Trainer arguments
def _regression_dm(num_clients=4, n=40, **kwargs):
    x, y = regression_data(n=n)
    kwargs = {"clients_per_round": 2, "batch_size": 3} | kwargs
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    return FederatedDataModule(dataset, partitioner=IIDPartitioner(num_clients=num_clients, seed=0), **kwargs)


class _StepCounter(L.Callback):
    def __init__(self):
        self.rounds, self.steps = 0, 0

    def on_train_epoch_end(self, trainer, pl_module):
        self.rounds += 1

    def on_train_batch_end(self, trainer, pl_module, *args):
        self.steps += 1


def test_fast_dev_run_is_one_round_of_one_batch_per_client(tmp_path):
    counter = _StepCounter()
    kwargs = quiet_trainer_kwargs(tmp_path)
    trainer = FederatedTrainer(fast_dev_run=True, callbacks=[counter], **kwargs)
    trainer.fit(LinearRegression(), datamodule=_regression_dm())
    assert counter.rounds == 1 and counter.steps == 2 and trainer.global_step == 2  # 2 clients × 1 batch


def test_limit_train_batches_caps_each_clients_local_batches(tmp_path):
    counter = _StepCounter()
    trainer = FederatedTrainer(max_epochs=3, limit_train_batches=2, callbacks=[counter], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(LinearRegression(), datamodule=_regression_dm())  # each client holds 10 samples: 4 batches of ≤ 3
    assert counter.rounds == 3 and counter.steps == 3 * 2 * 2


@pytest.mark.parametrize(
    "argument, value",
    [("max_steps", 5), ("min_steps", 3), ("overfit_batches", 2), ("val_check_interval", 0.5),
     ("val_check_interval", 3), ("limit_train_batches", 0.5), ("limit_train_batches", 0),
     ("accumulate_grad_batches", 2)],
)
def test_trainer_arguments_without_federated_meaning_are_refused(tmp_path, argument, value):
    trainer = FederatedTrainer(max_epochs=1, **{argument: value}, **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=f"`{argument}="):
        trainer.fit(LinearRegression(), datamodule=_regression_dm())


def test_estimated_stepping_batches_equals_the_steps_taken(tmp_path):
    seen = []

    class Scheduled(LinearRegression):
        def configure_optimizers(self):  # where Lightning documents reading it (e.g. for OneCycleLR)
            seen.append(self.trainer.estimated_stepping_batches)
            return super().configure_optimizers()

    dm = _regression_dm(num_clients=7, n=77, clients_per_round=3)
    trainer = FederatedTrainer(max_epochs=5, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(Scheduled(), datamodule=dm)
    expected = seen[0]
    assert expected == trainer.global_step
    # by hand: IID split of 77 samples into 7 clients of 11; batch 3 → 4 batches each; 5 rounds × 3 clients
    assert expected == 5 * 3 * 4


def test_max_time_stops_at_the_end_of_a_round(tmp_path):
    counter = _StepCounter()
    trainer = FederatedTrainer(max_epochs=50, max_time={"milliseconds": 1}, callbacks=[counter], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(LinearRegression(), datamodule=_regression_dm())
    assert counter.rounds == 1 and counter.steps == 2 * 4  # the first round is completed, never cut short


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


# ---------------------------------------------------------------- #11.6, #16.7 data that trains nothing
def test_dataset_dict_is_refused_naming_the_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"x": [[0.0, 1.0]] * 8, "label": [0, 1] * 4})
    dd = datasets.DatasetDict({"train": ds, "test": ds})
    dm = FederatedDataModule(dd, partitioner=IIDPartitioner(num_clients=2, seed=0), clients_per_round=1)
    with pytest.raises(TypeError, match=r"splits \['test', 'train'\].*dataset\['test'\]"):
        dm.setup()


def test_iterable_dataset_is_refused(tmp_path):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from range(4)

    dm = FederatedDataModule(Stream(), partitioner=IIDPartitioner(num_clients=2, seed=0), clients_per_round=1)
    with pytest.raises(TypeError, match="map-style"):
        dm.setup()


def test_drop_last_with_clients_smaller_than_a_batch_is_refused(tmp_path):
    dm = _regression_dm(num_clients=4, n=40, batch_size=16, drop_last=True)  # clients of 10 < 16
    with pytest.raises(ValueError, match="drop_last=True.*4 of 4 clients"):
        FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path)).fit(LinearRegression(), datamodule=dm)


def test_client_executor_by_name(tmp_path):
    from lightning_fed.vectorized import VectorizedExecutor

    assert isinstance(FederatedTrainer(client_executor="vectorized", logger=False).fit_loop.executor, VectorizedExecutor)
    with pytest.raises(ValueError, match="`client_executor` must be one of \\('sequential', 'vectorized'\\)"):
        FederatedTrainer(client_executor="vectorised")


# ---------------------------------------------------------------- #11.7 dict batches, #11.8 progress bars
class _DictRegression(LinearRegression):
    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self.linear(batch["x"].double()).squeeze(-1), batch["y"].double())
        self.log("train_loss", loss, on_epoch=True)
        return loss


def test_hugging_face_dict_batches_do_not_warn_about_batch_size(tmp_path, recwarn):
    datasets = pytest.importorskip("datasets")
    x, y = regression_data(n=24)
    ds = datasets.Dataset.from_dict({"x": x.tolist(), "y": y.tolist(), "note": ["abc"] * 24})
    dm = FederatedDataModule(ds, partitioner=IIDPartitioner(num_clients=3, seed=0), clients_per_round=3, batch_size=5)
    FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path)).fit(_DictRegression(), datamodule=dm)
    assert not [w for w in recwarn if "batch_size" in str(w.message)]


@pytest.mark.parametrize("bar", ["tqdm", "rich"])
def test_user_progress_bar_counts_clients(tmp_path, bar):
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

    if bar == "rich":
        pytest.importorskip("rich")
    progress = TQDMProgressBar() if bar == "tqdm" else RichProgressBar()
    seen = []

    class Spy(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            if bar == "tqdm":
                seen.append((progress.train_progress_bar.n, progress.train_progress_bar.total))
            else:
                task = progress.progress.tasks[progress.train_progress_bar_id]
                seen.append((task.completed, task.total))

    kwargs = quiet_trainer_kwargs(tmp_path) | {"enable_progress_bar": True}
    FederatedTrainer(max_epochs=2, callbacks=[progress, Spy()], **kwargs).fit(
        LinearRegression(), datamodule=_regression_dm(clients_per_round=3)
    )
    assert seen == [(3, 3), (3, 3)]
