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
