"""Lightning semantics in federated training: every Trainer feature keeps its meaning or is refused (issue #11 A)."""

from __future__ import annotations

import lightning as L
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
