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
