"""Every data-module option reaches every task on the CLI as ``--data.<option>``, or is refused by name (#40 item 2).

The options are read from :class:`FederatedDataModule`'s signature, so an option added later without a value here
fails :func:`test_every_option_has_a_value_here`. Each task is instantiated from one of its example configs (no data
is read: construction reads nothing), once with every option that can go together, once with the others.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from lightning_fed.cli import FederatedCLI
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
#: One example config per task module.
TASKS = {
    "ShakespeareDataModule": "shakespeare_fedadam.yaml",
    "StackOverflowNWPDataModule": "stackoverflow_nwp_fedavg.yaml",
    "StackOverflowTagDataModule": "stackoverflow_lr_fedavg.yaml",
    "EMNISTDataModule": "emnist_cr_fedavg.yaml",
    "CIFAR10DataModule": "cifar10_fedavg.yaml",
    "CIFAR100DataModule": "cifar100_fedavg.yaml",
    "MNISTDataModule": "fedlamb_mnist_cnn_noniid_fedams.yaml",
    "FashionMNISTDataModule": "fashion_mnist_hybrid_fedavg.yaml",
}
#: Tasks whose clients are natural (users, roles): a ``partitioner`` is refused.
NATURAL = {"ShakespeareDataModule", "StackOverflowNWPDataModule", "StackOverflowTagDataModule"}
#: Options that are Python objects, not CLI values: a task loads its own datasets (refused by name in Python).
DATASETS = ("train_dataset", "val_dataset", "test_dataset")
#: option -> (CLI value, the value the data module holds); the first group goes together in one instantiation.
TOGETHER = {
    "clients_per_round": ("3", 3),
    "batch_size": ("7", 7),
    "local_epochs": ("2", 2),
    "data_order": ("once", "once"),
    "seed": ("5", 5),
    "label_column": ("digit", "digit"),
    "labels": ("[0, 1, 2]", [0, 1, 2]),
    "eval_batch_size": ("64", 64),
    "num_workers": ("1", 1),
    "drop_last": ("true", True),
    "client_dropout": ("0.1", 0.1),
    "over_selection": ("0.5", 0.5),
    "eval_clients_per_round": ("4", 4),
    "eval_fraction": ("0.2", 0.2),
    "eval_local_steps": ("1", 1),
    "eval_csv": ("fed.csv", "fed.csv"),
    "eval_personal_untrained": ("exclude", "exclude"),
    "batch_columns": ("[image, label]", ("image", "label")),
}
#: The options that need another instantiation (they exclude one of the above).
APART = {
    "cohort_sampling": ("poisson", "poisson"),  # excludes over_selection
    "poisson_draws": ("binomial", "binomial"),  # needs cohort_sampling=poisson
    "local_work": ('{"class_path": "lightning_fed.datamodules.FixedLocalSteps", '
                   '"init_args": {"steps": 3, "batch_size": 5}}', None),
    "partitioner": ('{"class_path": "lightning_fed.datamodules.IIDPartitioner", "init_args": {"num_clients": 7}}',
                    None),
    # #53: simulated time (a deadline needs a device model)
    "device_model": ('{"class_path": "lightning_fed.datamodules.devices.ParametricDeviceModel", '
                     '"init_args": {"seconds_per_sample": 0.02, "compute_sigma": 0.5}}', None),
    "round_deadline": ("30.5", 30.5),
    "deadline_policy": ("partial", "partial"),
    # #54: asynchronous training (needs a device model, no deadline)
    "asynchronous": ('{"concurrency": 8, "buffer_size": 4, "max_staleness": 3, '
                     '"staleness": {"class_path": "lightning_fed.asynchronous.StalenessWeighting", '
                     '"init_args": {"name": "polynomial", "a": 0.5}}}', None),
}


def _options() -> list[str]:
    return [n for n in inspect.signature(FederatedDataModule.__init__).parameters if n != "self"]


def test_every_option_has_a_value_here():
    assert sorted(_options()) == sorted([*DATASETS, *TOGETHER, *APART])


def _instantiate(config: str, args: list[str], tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return FederatedCLI(args=["--config", str(EXAMPLES / config), *args], run=False).datamodule


def _held(dm, name):
    value = getattr(dm, name)
    return value.tolist() if isinstance(value, np.ndarray) else value


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_option_reaches_the_task_on_the_cli(task, tmp_path, monkeypatch):
    args = [a for name, (value, _) in TOGETHER.items() for a in (f"--data.{name}", value)]
    # #54: asynchronous training (a device model, no deadline: with the first group, not with the clock's below)
    args += ["--data.device_model", APART["device_model"][0], "--data.asynchronous", APART["asynchronous"][0]]
    dm = _instantiate(TASKS[task], args, tmp_path, monkeypatch)
    assert type(dm).__name__ == task
    assert {n: _held(dm, n) for n in TOGETHER} == {n: held for n, (_, held) in TOGETHER.items()}
    config = dm.asynchronous
    assert (config.concurrency, config.buffer_size, config.max_staleness) == (8, 4, 3)
    assert (config.staleness.name, config.staleness.a) == ("polynomial", 0.5)
    assert dm.simulated_time.asynchronous is config
    clock = [a for name in ("device_model", "round_deadline", "deadline_policy") for a in (f"--data.{name}",
                                                                                          APART[name][0])]
    dm = _instantiate(TASKS[task], ["--data.cohort_sampling", "poisson", "--data.poisson_draws", "binomial",
                                    "--data.local_work", APART["local_work"][0], *clock], tmp_path, monkeypatch)
    assert dm.cohort_sampling == "poisson" and dm.cohorts.cohort_sampling == "poisson"
    assert dm.poisson_draws == "binomial" and dm.cohorts.poisson_draws == "binomial"
    assert (dm.local_work.steps, dm.local_work.batch_size) == (3, 5)
    # #53: simulated time
    assert type(dm.device_model).__name__ == "ParametricDeviceModel" and dm.device_model.compute_sigma == 0.5
    assert (dm.round_deadline, dm.deadline_policy) == (30.5, "partial")
    assert dm.simulated_time.device_model is dm.device_model and dm.simulated_time.round_deadline == 30.5


@pytest.mark.parametrize("task", sorted(TASKS))
def test_a_partitioner_reaches_the_task_or_is_refused_by_name(task, tmp_path, monkeypatch, capsys):
    args = ["--data.partitioner", APART["partitioner"][0]]
    if task in NATURAL:
        with pytest.raises(SystemExit):
            _instantiate(TASKS[task], args, tmp_path, monkeypatch)
        assert "partitioner" in capsys.readouterr().err
        return
    dm = _instantiate(TASKS[task], args, tmp_path, monkeypatch)
    assert type(dm.partitioner).__name__ == "IIDPartitioner" and dm.partitioner.num_clients == 7


#: What a task needs besides the refused option to get to its refusal.
NEEDS = {"EMNISTDataModule": {"leaf_path": "femnist"},
         "MNISTDataModule": {"partitioner": IIDPartitioner(4)},
         "FashionMNISTDataModule": {"partitioner": IIDPartitioner(4)}}


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("name", [*DATASETS, "partitioner"])
def test_options_a_task_sets_itself_are_refused_by_name_in_python(task, name):
    import lightning_fed.datamodules as dms

    if name == "partitioner" and task not in NATURAL:
        return
    with pytest.raises(ValueError, match=f"{task} does not take `{name}`"):
        getattr(dms, task)(**NEEDS.get(task, {}), **{name: object()})


def test_shakespeare_example_takes_eval_fraction(tmp_path, monkeypatch):
    """The issue's command: ``lightning-fed fit --config examples/shakespeare_fedadam.yaml --data.eval_fraction
    0.2`` is accepted (it was refused: Shakespeare had no ``eval_fraction``)."""
    dm = _instantiate("shakespeare_fedadam.yaml", ["--data.eval_fraction", "0.2"], tmp_path, monkeypatch)
    assert dm.eval_fraction == 0.2
