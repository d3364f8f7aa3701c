"""Validation against simulated time (issue #53 item 2): the ``time/<metric>`` tags a run with a device model writes
to TensorBoard, and scripts/plot_time_to_accuracy.py's figure and time-to-target from the run folder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import TensorDataset

from helpers import LinearRegression, load_script, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import FedAvg
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.datamodules.devices import ParametricDeviceModel
from lightning_fed.report import Run, load_run


def _fit(tmp_path, device_model):
    x, y = regression_data(n=80, d=3, seed=0)
    data = TensorDataset(torch.tensor(x), torch.tensor(y))
    dm = FederatedDataModule(data, val_dataset=data, partitioner=IIDPartitioner(num_clients=8, seed=0),
                             clients_per_round=3, batch_size=5, device_model=device_model)
    logger = TensorBoardLogger(str(tmp_path), name="run", version=0)
    torch.manual_seed(0)
    trainer = FederatedTrainer(max_epochs=2, callbacks=[FedAvg(lr=1.0)],
                               **(quiet_trainer_kwargs(tmp_path) | dict(logger=logger)))
    trainer.fit(LinearRegression(lr=0.05), datamodule=dm)
    return load_run(logger.log_dir), logger.log_dir


def test_validation_is_written_against_the_simulated_seconds(tmp_path):
    run, path = _fit(tmp_path, ParametricDeviceModel(seconds_per_sample=0.5, compute_sigma=1.0, seed=4))
    rounds, seconds = run.curves["clock/elapsed_seconds"]
    assert rounds.tolist() == [0, 1] and np.all(np.diff(seconds) > 0)
    steps, values = run.curves["time/val_loss"]
    assert steps.tolist() == np.round(seconds).astype(int).tolist()  # step = whole simulated seconds
    np.testing.assert_array_equal(values, run.curves["val_loss"][1])
    assert "time/round_train_loss" in run.curves
    x, v = load_script("scripts/plot_time_to_accuracy.py").time_curve(run, "val_loss")
    np.testing.assert_array_equal(x, seconds)
    np.testing.assert_array_equal(v, run.curves["val_loss"][1])


def _run(path, curves):
    return Run(path=path, name=path, curves={k: (np.array(r), np.array(v, float)) for k, (r, v) in curves.items()},
               settings={}, settings_source="none")


def test_the_script_pairs_rounds_with_times_draws_and_gives_the_time_to_target(tmp_path, monkeypatch):
    script = load_script("scripts/plot_time_to_accuracy.py")
    run = _run("a", {"val_acc": ([1, 3], [0.3, 0.6]), "clock/elapsed_seconds": ([0, 1, 2, 3], [5, 12, 20, 31])})
    x, v = script.time_curve(run, "val_acc")  # validated at rounds 1 and 3: 12 s and 31 s
    assert x.tolist() == [12.0, 31.0] and v.tolist() == [0.3, 0.6]
    assert script.time_to_target(x, v, 0.5) == 31.0 and script.time_to_target(x, v, 0.9) == np.inf
    monkeypatch.setattr(script, "load_run", lambda path: run)
    monkeypatch.setattr(script, "find_runs", lambda paths: list(paths))
    out = tmp_path / "fig.png"
    assert script.main(["a", "--target", "0.5", "--out", str(out)]) == {"a": 31.0}
    assert out.stat().st_size > 1000
    with pytest.raises(KeyError, match="has no 'clock/elapsed_seconds'"):  # a run without a device model
        script.time_curve(_run("b", {"val_acc": ([0], [0.1])}), "val_acc")
