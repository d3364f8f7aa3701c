"""`lightning-fed validate` with federated evaluation: fit one round (ModelCheckpoint), then validate the checkpoint
with `--data.eval_*` given on the command line; the fed_* metrics and the CSV rows are checked against the
checkpoint's model applied by hand to each writer's LEAF test samples."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from lightning_fed.cli import FederatedCLI
from lightning_fed.datamodules.tasks.emnist import EMNISTDataModule
from lightning_fed.datamodules.tasks.stackoverflow import StackOverflowNWPDataModule, StackOverflowTagDataModule
from lightning_fed.models.emnist import EMNISTCNN
from tests.test_evaluation_natural import write_leaf
from tests.datamodules.tasks.test_stackoverflow import random_rows, write_tff_sqlite

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:.*LightningCLI.s args parameter.*"),
]


def _femnist_config(tmp_path: Path) -> Path:
    root = write_leaf(tmp_path / "leaf")
    cfg = {
        "seed_everything": 0,
        "trainer": {
            "max_epochs": 1, "enable_progress_bar": False, "accelerator": "cpu", "num_sanity_val_steps": 0,
            "enable_model_summary": False, "logger": False,
            "callbacks": [
                {"class_path": "lightning_fed.callbacks.FedAvg", "init_args": {"lr": 1.0}},
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                 "init_args": {"dirpath": str(tmp_path / "ckpt"), "save_last": True}},
            ],
        },
        "model": {"class_path": "lightning_fed.models.emnist.EMNISTCNN", "init_args": {"lr": 0.05}},
        "data": {"class_path": "lightning_fed.datamodules.tasks.emnist.EMNISTDataModule",
                 "init_args": {"data_dir": str(tmp_path / "data"), "leaf_path": str(root), "clients_per_round": 2,
                               "batch_size": 4, "eval_batch_size": 2}},
    }
    path = tmp_path / "femnist.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_validate_a_checkpoint_with_federated_evaluation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _femnist_config(tmp_path)
    fit = FederatedCLI(args=["fit", "--config", str(config)])
    assert fit.datamodule.eval_clients_per_round is None  # fit ran without federated evaluation
    assert not [k for k in fit.trainer.callback_metrics if k.startswith("fed_")]
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    assert ckpt.is_file()

    table = tmp_path / "clients.csv"
    cli = FederatedCLI(args=["validate", "--config", str(config), "--ckpt_path", str(ckpt),
                             "--data.eval_clients_per_round", "all", "--data.eval_csv", str(table)])
    dm = cli.datamodule
    assert isinstance(dm, EMNISTDataModule) and dm.eval_clients_per_round == "all" and dm.eval_csv == str(table)
    metrics = cli.trainer.callback_metrics

    # by hand: the checkpoint's global model on each writer's own test samples (writers with test samples only)
    model = EMNISTCNN.load_from_checkpoint(ckpt).eval()
    clients = dm.eval_client_ids().tolist()
    assert clients == [1, 2, 3]  # f0001_40 (client 0) has no LEAF test samples
    loss, acc, n = [], [], []
    with torch.no_grad():
        for c in clients:
            idx = torch.from_numpy(dm.client_eval_indices(c))
            x = dm.test_dataset.data[idx].float().div(255).unsqueeze(1)
            y = dm.test_dataset.targets[idx]
            logits = model(x)
            loss.append(F.cross_entropy(logits, y).item())
            acc.append((logits.argmax(1) == y).double().mean().item())
            n.append(len(idx))
    loss, acc, n = np.asarray(loss), np.asarray(acc), np.asarray(n, dtype=np.float64)
    assert metrics["fed_eval_clients"].item() == 3
    assert metrics["fed_val_loss/weighted"].item() == pytest.approx((n * loss).sum() / n.sum(), rel=1e-5)
    assert metrics["fed_val_loss/mean"].item() == pytest.approx(loss.mean(), rel=1e-5)
    assert metrics["fed_val_loss/worst10"].item() == pytest.approx(loss.max(), rel=1e-5)
    assert metrics["fed_val_acc/weighted"].item() == pytest.approx((n * acc).sum() / n.sum(), abs=1e-6)
    assert metrics["fed_val_acc/p50"].item() == pytest.approx(np.median(acc), abs=1e-6)
    # the central val_loss is the whole LEAF test set (8 samples, including the test-only writer's)
    assert "val_loss" in metrics

    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["client_id"]) for r in rows] == clients
    assert [int(r["samples"]) for r in rows] == n.astype(int).tolist()
    assert {int(r["round"]) for r in rows} == {cli.trainer.current_epoch}
    np.testing.assert_allclose([float(r["val_loss"]) for r in rows], loss, rtol=1e-5)


@pytest.mark.parametrize("cls", [StackOverflowNWPDataModule, StackOverflowTagDataModule])
def test_stackoverflow_eval_arguments_from_the_command_line(tmp_path, monkeypatch, cls):
    monkeypatch.chdir(tmp_path)
    db = write_tff_sqlite(tmp_path / "so.sqlite", random_rows())
    model = ("lightning_fed.models.stackoverflow.StackOverflowNWP" if cls is StackOverflowNWPDataModule
             else "lightning_fed.models.stackoverflow.StackOverflowTagLR")
    cli = FederatedCLI(args=["--model", model, "--data", f"{cls.__module__}.{cls.__name__}",
                             "--data.sqlite_path", str(db), "--data.eval_clients_per_round", "3",
                             "--data.eval_local_steps", "2", "--data.eval_csv", "c.csv"], run=False)
    dm = cli.datamodule
    assert isinstance(dm, cls)
    assert (dm.eval_clients_per_round, dm.eval_local_steps, dm.eval_csv) == (3, 2, "c.csv")
