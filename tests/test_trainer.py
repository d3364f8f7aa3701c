"""Lightning semantics in federated training: every Trainer feature keeps its meaning or is refused (issue #11 A)."""
from __future__ import annotations

import os

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import TensorDataset
from helpers import (
    CHECKPOINT_DIR_REUSED, LinearRegression, SmallClassifier, classification_dataset, quiet_trainer_kwargs,
    regression_data)
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


@pytest.mark.filterwarnings(CHECKPOINT_DIR_REUSED)
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


def test_leaving_out_the_server_optimizer_says_fedavg_once(tmp_path, caplog):
    """Issue #32 item 8: no server optimizer means FedAvg with η = 1; said once, as info (not a warning)."""
    import logging
    import warnings

    with caplog.at_level(logging.INFO), warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer = FederatedTrainer(**quiet_trainer_kwargs(tmp_path))
    notes = [r for r in caplog.records if "No server optimizer given" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.INFO
    assert "FedAvg with server learning rate η = 1" in notes[0].getMessage()
    assert type(trainer.server_optimizer).__name__ == "FedAvg" and trainer.server_optimizer.lr == 1.0
    caplog.clear()
    with caplog.at_level(logging.INFO):
        FederatedTrainer(**quiet_trainer_kwargs(tmp_path), callbacks=[FedAdam(lr=0.01)])
    assert not [r for r in caplog.records if "No server optimizer given" in r.getMessage()]


@pytest.mark.parametrize("failure", ["refused_argument", "data_error"])
def test_a_fit_that_fails_at_its_start_leaves_no_empty_version_folder(tmp_path, failure):
    """Issue #32 item 8: Lightning creates the loggers' folders before the data module's setup; a fit refused at its
    start used to leave ``lightning_logs/version_N`` behind (events file, hparams.yaml) on every attempt."""
    train, val = classification_dataset(n=60, n_val=10)
    cohort = 9 if failure == "data_error" else 2  # more than the 4 clients: refused in the data module's setup
    dm = FederatedDataModule(train, val, partitioner=IIDPartitioner(4), clients_per_round=cohort, batch_size=10)
    root = tmp_path / "root"
    kwargs = quiet_trainer_kwargs(root) | {"logger": True, "max_epochs": 1}
    if failure == "refused_argument":
        kwargs["max_steps"] = 3
    with pytest.raises(ValueError, match="max_steps" if failure == "refused_argument" else "clients_per_round"):
        FederatedTrainer(**kwargs).fit(SmallClassifier(), datamodule=dm)
    assert not (root / "lightning_logs").exists()
    # a run that trained keeps its folder; the next run takes version_1 after a kept version_0
    dm = FederatedDataModule(train, val, partitioner=IIDPartitioner(4), clients_per_round=2, batch_size=10)
    kwargs = quiet_trainer_kwargs(root) | {"logger": True, "max_epochs": 1}
    FederatedTrainer(**kwargs).fit(SmallClassifier(), datamodule=dm)
    assert sorted(os.listdir(root / "lightning_logs")) == ["version_0"]
    with pytest.raises(ValueError, match="max_steps"):
        FederatedTrainer(**kwargs | {"max_steps": 3}).fit(SmallClassifier(), datamodule=dm)
    assert sorted(os.listdir(root / "lightning_logs")) == ["version_0"]


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_an_evaluation_that_fails_at_its_start_leaves_no_empty_version_folder(tmp_path, stage):
    """Issue #43: `validate` / `test` / `predict` with a missing checkpoint left an empty `version_0` (an events file,
    `hparams.yaml`) behind, as a failed fit did before issue #32."""
    from torch.utils.data import DataLoader

    train, val = classification_dataset(n=60, n_val=10)
    dm = FederatedDataModule(train, val, partitioner=IIDPartitioner(4), clients_per_round=2, batch_size=10)
    root = tmp_path / "root"
    trainer = FederatedTrainer(**quiet_trainer_kwargs(root) | {"logger": True})
    kwargs = {"dataloaders": DataLoader(val, batch_size=5)} if stage == "predict" else {"datamodule": dm}
    model = type("Evaluated", (SmallClassifier,), {"test_step": SmallClassifier.validation_step,
                                                   "predict_step": lambda self, batch, i: self.net(batch[0])})()
    with pytest.raises(FileNotFoundError, match="does/not/exist.ckpt"):
        getattr(trainer, stage)(model, ckpt_path="does/not/exist.ckpt", **kwargs)
    assert not (root / "lightning_logs").exists()
    # one that ran keeps its folder
    FederatedTrainer(**quiet_trainer_kwargs(root) | {"logger": True}).validate(SmallClassifier(), datamodule=dm)
    assert sorted(os.listdir(root / "lightning_logs")) == ["version_0"]


def test_an_existing_log_folder_is_never_removed(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger

    train, val = classification_dataset(n=60, n_val=10)
    dm = FederatedDataModule(train, val, partitioner=IIDPartitioner(4), clients_per_round=2, batch_size=10)
    (tmp_path / "tb" / "run" / "version_0").mkdir(parents=True)  # the user's folder, e.g. a fixed version
    logger = TensorBoardLogger(str(tmp_path / "tb"), name="run", version=0, default_hp_metric=False)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"logger": logger, "max_epochs": 1, "max_steps": 3}
    with pytest.raises(ValueError, match="max_steps"):
        FederatedTrainer(**kwargs).fit(SmallClassifier(), datamodule=dm)
    assert (tmp_path / "tb" / "run" / "version_0").is_dir()


def test_a_run_without_validation_data_does_not_warn_about_an_empty_loader(tmp_path):
    """Issue #43: ``FederatedDataModule.val_dataloader`` is ``[]`` without validation data (validation is skipped);
    Lightning warned "Total length of `list` across ranks is zero" at every such fit."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FederatedTrainer(max_epochs=1, callbacks=[FedAvg()], **quiet_trainer_kwargs(tmp_path)).fit(
            LinearRegression(), datamodule=_regression_dm())
    assert not [w for w in caught if "Total length of `list`" in str(w.message)]
