"""EMNISTDataModule (torchvision IDX files, LEAF FEMNIST JSON) and the EMNIST CR / AE models.

The torchvision files are written in the real on-disk format (uncompressed big-endian IDX, magic 2051 / 2049,
names ``emnist-byclass-{train,test}-{images-idx3,labels-idx1}-ubyte`` under ``EMNIST/raw``) and read back by
torchvision's own ``EMNIST`` reader; the LEAF files follow LEAF's femnist JSON layout.
"""
from __future__ import annotations

import json
from pathlib import Path
import numpy as np
import pytest
import torch
from helpers import quiet_trainer_kwargs, write_idx
from lightning_fed.datamodules.partitioners.dirichlet import DirichletPartitioner
from lightning_fed.datamodules.partitioners.iid import IIDPartitioner
from lightning_fed.datamodules.tasks.emnist import EMNIST_CLASSES, EMNISTDataModule, EMNISTDataset, read_leaf_femnist
from lightning_fed.models.emnist import EMNISTCNN, EMNISTAutoencoder
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:.*LightningCLI.s args parameter.*"),
]


RAW = {
    ("train", "images"): "emnist-byclass-train-images-idx3-ubyte",
    ("train", "labels"): "emnist-byclass-train-labels-idx1-ubyte",
    ("test", "images"): "emnist-byclass-test-images-idx3-ubyte",
    ("test", "labels"): "emnist-byclass-test-labels-idx1-ubyte",
}


def make_torchvision_emnist(data_dir: Path, n_train: int = 120, n_test: int = 40, seed: int = 0) -> dict:
    """Upright images (what the data module must return) stored transposed, as the EMNIST release does."""
    rng = np.random.default_rng(seed)
    raw = data_dir / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    out = {}
    for part, n in (("train", n_train), ("test", n_test)):
        upright = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.permutation(np.arange(n) % 62).astype(np.uint8)
        write_idx(raw / RAW[(part, "images")], np.ascontiguousarray(upright.transpose(0, 2, 1)))
        write_idx(raw / RAW[(part, "labels")], labels)
        out[part] = (upright, labels)
    return out


def make_leaf(root: Path, seed: int = 0) -> dict:
    """LEAF femnist layout: {root}/train/*.json, {root}/test/*.json; x in [0, 1] with 1 = background."""
    rng = np.random.default_rng(seed)
    writers = {"f0003_12": 7, "f0001_40": 5, "f0100_03": 9, "f0002_22": 4}  # name -> train samples
    files = {
        "train": [["f0003_12", "f0001_40"], ["f0100_03", "f0002_22"]],
        "test": [["f0003_12", "f0001_40", "f0100_03", "f0002_22"]],
    }
    truth = {"train": {}, "test": {}}
    for part, groups in files.items():
        (root / part).mkdir(parents=True)
        for k, users in enumerate(groups):
            blob = {"users": users, "num_samples": [], "user_data": {}}
            for u in users:
                n = writers[u] if part == "train" else 2
                pix = rng.integers(0, 256, size=(n, 784))
                x = (pix / 255.0).tolist()
                y = rng.integers(0, 62, size=n).tolist()
                blob["num_samples"].append(n)
                blob["user_data"][u] = {"x": x, "y": y}
                truth[part][u] = (pix, np.asarray(y))
            (root / part / f"all_data_{k}_niid_1_keep_0_{part}_9.json").write_text(json.dumps(blob))
    truth["order"] = [u for g in files["train"] for u in g]
    return truth


def test_raw_names_are_what_torchvision_reads(tmp_path):
    from torchvision.datasets import EMNIST

    make_torchvision_emnist(tmp_path)
    for train in (True, False):
        ds = EMNIST(str(tmp_path), split="byclass", train=train, download=False)  # real reader accepts the files
        assert Path(ds.images_file).name in RAW.values() and Path(ds.labels_file).name in RAW.values()
    assert EMNIST.classes_split_dict["byclass"] == EMNIST_CLASSES


def test_torchvision_files_read_back_upright(tmp_path):
    truth = make_torchvision_emnist(tmp_path)
    dm = EMNISTDataModule(data_dir=tmp_path, partitioner=IIDPartitioner(num_clients=4), clients_per_round=2)
    dm.setup("fit")
    for ds, part in ((dm.train_dataset, "train"), (dm.test_dataset, "test")):
        upright, labels = truth[part]
        assert isinstance(ds, EMNISTDataset) and len(ds) == len(labels)
        assert torch.equal(ds.data, torch.from_numpy(upright))  # transposition undone
        assert ds.targets.dtype == torch.long and torch.equal(ds.targets, torch.from_numpy(labels).long())
        x, y = ds[5]
        assert x.shape == (1, 28, 28) and x.dtype == torch.float32
        assert torch.allclose(x[0], torch.from_numpy(upright[5]).float() / 255) and int(y) == int(labels[5])
    assert dm.val_dataset is dm.test_dataset
    xb, yb = next(iter(dm.client_dataloader(0, 0)))
    assert xb.shape == (20, 1, 28, 28) and yb.shape == (20,) and yb.dtype == torch.long


def test_task_ae_targets_are_inputs(tmp_path):
    truth = make_torchvision_emnist(tmp_path)
    dm = EMNISTDataModule(
        data_dir=tmp_path, task="ae", partitioner=IIDPartitioner(num_clients=4), batch_size=8, clients_per_round=2
    )
    dm.setup("fit")
    x, y = dm.train_dataset[3]
    assert x.shape == (784,) and torch.equal(x, y)
    assert torch.allclose(x, torch.from_numpy(truth["train"][0][3]).float().reshape(-1) / 255)
    xb, yb = next(iter(dm.client_dataloader(1, 0)))
    assert xb.shape == (8, 784) and torch.equal(xb, yb)
    vx, vy = next(iter(dm.val_dataloader()))
    assert vx.shape == (40, 784) and torch.equal(vx, vy)
    assert dm.train_dataset.targets.shape == (120,)  # labels kept for label partitioners


def test_leaf_natural_split_by_writer(tmp_path):
    truth = make_leaf(tmp_path / "leaf")
    dm = EMNISTDataModule(leaf_path=tmp_path / "leaf", clients_per_round=2)
    dm.setup("fit")
    train = dm.train_dataset
    names = sorted(truth["train"])
    assert train.writer_names == names and dm.num_clients == 4
    assert list(dm.partition.client_names) == list(range(4))
    for cid, name in enumerate(names):
        pix, y = truth["train"][name]
        idx = torch.as_tensor(dm.client_indices(cid))
        assert len(idx) == len(y)
        assert torch.equal(train.targets[idx], torch.from_numpy(y))
        # LEAF's 1 = background is flipped to MNIST's 0 = background; LEAF is already upright
        assert torch.equal(train.data[idx], torch.from_numpy(255 - pix).to(torch.uint8).reshape(-1, 28, 28))
    test = dm.test_dataset
    assert len(test) == 8 and not hasattr(test, "writer_ids")
    assert torch.equal(test.targets, torch.from_numpy(np.concatenate([truth["test"][u][1] for u in truth["test"]])))


def test_leaf_reader_and_ae_task(tmp_path):
    truth = make_leaf(tmp_path / "leaf")
    images, labels, writers, owner = read_leaf_femnist(tmp_path / "leaf" / "train")
    assert writers == truth["order"] and images.dtype == torch.uint8 and images.shape == (25, 28, 28)
    assert torch.bincount(owner).tolist() == [7, 5, 9, 4]
    dm = EMNISTDataModule(leaf_path=tmp_path / "leaf", task="ae", clients_per_round=2)
    dm.setup("fit")
    x, y = dm.train_dataset[0]
    pix = truth["train"]["f0003_12"][0][0]
    assert torch.equal(x, y) and torch.allclose(x, torch.from_numpy(1 - pix / 255.0).float(), atol=1e-6)


def test_leaf_malformed_files(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.json").write_text(json.dumps({"users": ["u"], "user_data": {"u": {"x": [[0.5] * 10], "y": [1]}}}))
    with pytest.raises(ValueError, match="784"):
        read_leaf_femnist(bad)
    (bad / "a.json").write_text(json.dumps({"users": ["u"], "user_data": {"u": {"x": [[0.5] * 784], "y": [62]}}}))
    with pytest.raises(ValueError, match="labels outside"):
        read_leaf_femnist(bad)
    (bad / "a.json").write_text(json.dumps({"nope": 1}))
    with pytest.raises(ValueError, match="LEAF"):
        read_leaf_femnist(bad)
    with pytest.raises(FileNotFoundError):
        read_leaf_femnist(tmp_path / "missing")


def test_bad_arguments_and_missing_data(tmp_path):
    with pytest.raises(ValueError, match="`task`"):
        EMNISTDataModule(task="gan", partitioner=IIDPartitioner(num_clients=2))
    with pytest.raises(ValueError, match="`partitioner` is required"):
        EMNISTDataModule(data_dir=tmp_path)
    with pytest.raises(ValueError, match="`download`"):
        EMNISTDataModule(partitioner=IIDPartitioner(num_clients=2), download="yes")
    with pytest.raises(ValueError, match="`val_from_test`"):
        EMNISTDataModule(partitioner=IIDPartitioner(num_clients=2), val_from_test=1)
    with pytest.raises(ValueError, match="`batch_size`"):
        EMNISTDataModule(partitioner=IIDPartitioner(num_clients=2), batch_size=0)
    dm = EMNISTDataModule(data_dir=tmp_path / "none", partitioner=IIDPartitioner(num_clients=2))
    for call in (dm.prepare_data, dm.setup):
        with pytest.raises(FileNotFoundError, match="download=True"):
            call()
    with pytest.raises(FileNotFoundError, match="leaf_path"):
        EMNISTDataModule(leaf_path=tmp_path / "none").setup()
    with pytest.raises(ValueError, match="`task`"):
        EMNISTDataset(torch.zeros(2, 28, 28, dtype=torch.uint8), torch.zeros(2, dtype=torch.long), task="x")


def test_download_true_delegates_to_torchvision(tmp_path, monkeypatch):
    from torchvision.datasets import EMNIST

    src = tmp_path / "src"
    truth = make_torchvision_emnist(src)
    calls = []

    def fake_download(self):  # stands in for the network: puts the extracted raw files where torchvision would
        calls.append(self.train)
        Path(self.raw_folder).mkdir(parents=True, exist_ok=True)
        for name in RAW.values():
            (Path(self.raw_folder) / name).write_bytes((src / "EMNIST" / "raw" / name).read_bytes())

    monkeypatch.setattr(EMNIST, "download", fake_download)
    dm = EMNISTDataModule(
        data_dir=tmp_path / "dl", partitioner=IIDPartitioner(num_clients=2), download=True, clients_per_round=2
    )
    dm.setup("fit")
    assert calls == [True, False]
    assert torch.equal(dm.train_dataset.targets, torch.from_numpy(truth["train"][1]).long())


@pytest.mark.parametrize("task", ["cr", "ae"])
def test_one_federated_round(tmp_path, task):
    from lightning_fed import FederatedTrainer
    from lightning_fed.callbacks import FedAdam

    make_torchvision_emnist(tmp_path / "data")
    dm = EMNISTDataModule(
        data_dir=tmp_path / "data", task=task, clients_per_round=2, batch_size=20, eval_batch_size=64,
        partitioner=DirichletPartitioner(num_clients=4, alpha=1.0, min_partition_size=5),
    )
    model = EMNISTCNN(lr=0.05) if task == "cr" else EMNISTAutoencoder(lr=0.5)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = FederatedTrainer(
        max_epochs=1, callbacks=[FedAdam(lr=0.01, tau=1e-3)], **quiet_trainer_kwargs(tmp_path)
    )
    trainer.fit(model, datamodule=dm)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    metrics = trainer.callback_metrics
    assert "val_loss" in metrics and torch.isfinite(metrics["val_loss"])
    assert ("val_acc" if task == "cr" else "val_mse_x1000") in metrics
