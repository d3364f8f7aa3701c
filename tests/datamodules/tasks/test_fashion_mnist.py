"""FashionMNISTDataModule: Debian IDX files -> torchvision raw layout -> in-memory tensors.

The fake "Debian" files are written in the real on-disk IDX format (big-endian header, magic
2051 for uint8 images / 2049 for uint8 labels, gzipped) and read back by torchvision's own reader.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_fed.datamodules.tasks.fashion_mnist import (
    DEBIAN_FASHION_MNIST_DIR,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    FashionMNISTDataModule,
    FashionMNISTTensorDataset,
)
from helpers import write_idx
from lightning_fed.datamodules.partitioners.iid import IIDPartitioner
from lightning_fed.datamodules.partitioners.shard import ShardPartitioner

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
]

RAW_NAMES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


def make_fake_debian(folder: Path, n_train: int = 200, n_test: int = 30, seed: int = 0) -> dict:
    """Four IDX .gz files named like the Debian package's; labels balanced over 10 classes."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.permutation(np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) % 10).astype(np.uint8)[::-1].copy(),
    }
    raw = {name: write_idx(folder / f"{name}.gz", arr, compress=True) for name, arr in arrays.items()}
    return {"arrays": arrays, "raw": raw}


@pytest.fixture
def fake(tmp_path):
    debian = tmp_path / "debian"
    info = make_fake_debian(debian)
    info.update(debian=debian, data_dir=tmp_path / "data")
    return info


def _dm(fake, **kw) -> FashionMNISTDataModule:
    kw.setdefault("partitioner", IIDPartitioner(num_clients=10))
    kw.setdefault("debian_dir", fake["debian"])
    return FashionMNISTDataModule(data_dir=fake["data_dir"], **kw)


def test_raw_names_are_what_torchvision_checks():
    from torchvision.datasets import FashionMNIST

    assert sorted(Path(url).stem for url, _ in FashionMNIST.resources) == sorted(RAW_NAMES)


def test_prepare_data_gunzips_debian_files_into_torchvision_layout(fake):
    dm = _dm(fake)
    dm.prepare_data()
    raw_dir = fake["data_dir"] / "FashionMNIST" / "raw"
    assert dm.raw_folder == raw_dir
    assert sorted(p.name for p in raw_dir.iterdir()) == sorted(RAW_NAMES)  # no temp files left behind
    for name in RAW_NAMES:
        assert (raw_dir / name).read_bytes() == fake["raw"][name]
    # the real torchvision reader accepts the layout and returns exactly what was written
    from torchvision.datasets import FashionMNIST

    tv = FashionMNIST(str(fake["data_dir"]), train=True, download=False)
    assert torch.equal(tv.data, torch.from_numpy(fake["arrays"]["train-images-idx3-ubyte"]))
    assert torch.equal(tv.targets, torch.from_numpy(fake["arrays"]["train-labels-idx1-ubyte"]).long())
    # idempotent, and the raw copy suffices once it exists
    dm.prepare_data()
    _dm(fake, debian_dir=None).prepare_data()


@pytest.mark.parametrize("normalize", [True, False])
def test_load_datasets_returns_normalised_in_memory_tensors(fake, normalize):
    dm = _dm(fake, normalize=normalize)
    dm.prepare_data()
    train, val, test = dm.load_datasets()
    for ds, img_name, lab_name in [
        (train, "train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
        (test, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    ]:
        assert isinstance(ds, FashionMNISTTensorDataset)
        images = torch.from_numpy(fake["arrays"][img_name]).float().unsqueeze(1) / 255.0
        if normalize:
            images = (images - FASHION_MNIST_MEAN) / FASHION_MNIST_STD
        labels = torch.from_numpy(fake["arrays"][lab_name]).long()
        assert len(ds) == len(labels)
        assert ds.targets.dtype == torch.long and torch.equal(ds.targets, labels)
        assert ds.data.dtype == torch.float32 and ds.data.shape == (len(labels), 1, 28, 28)
        assert torch.allclose(ds.data, images, atol=1e-6)
        x, y = ds[3]
        assert x.shape == (1, 28, 28) and int(y) == int(labels[3])
        assert ds.classes[0] == "T-shirt/top" and len(ds.classes) == 10
    assert val is test  # the FedAWARE protocol: evaluate on the official test set
    assert _dm(fake, val_from_test=False).load_datasets()[1] is None


def test_download_true_delegates_to_torchvision(fake, monkeypatch):
    from torchvision.datasets import FashionMNIST

    calls = []

    def fake_download(self):  # stands in for the network: writes the raw files torchvision would
        calls.append(self.train)
        Path(self.raw_folder).mkdir(parents=True, exist_ok=True)
        for name in RAW_NAMES:
            (Path(self.raw_folder) / name).write_bytes(fake["raw"][name])

    monkeypatch.setattr(FashionMNIST, "download", fake_download)
    dm = _dm(fake, debian_dir=fake["debian"] / "missing", download=True)
    dm.prepare_data()
    assert calls == [True, False]
    train, _, _ = dm.load_datasets()
    assert torch.equal(train.targets, torch.from_numpy(fake["arrays"]["train-labels-idx1-ubyte"]).long())


def test_missing_data_raises_a_clear_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    dm = FashionMNISTDataModule(data_dir=tmp_path / "data", partitioner=IIDPartitioner(num_clients=2), debian_dir=empty)
    for call in (dm.prepare_data, dm.setup):
        with pytest.raises(FileNotFoundError) as err:
            call()
        msg = str(err.value)
        assert "apt-get install -y dataset-fashion-mnist" in msg and "download=True" in msg
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*-ubyte"))


def test_incomplete_debian_dir_is_not_used(fake):
    (fake["debian"] / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        _dm(fake).prepare_data()


def test_partitioner_is_required_and_defaults(fake):
    with pytest.raises(ValueError, match="partitioner"):
        FashionMNISTDataModule(data_dir=fake["data_dir"])
    dm = _dm(fake)
    # FedAWARE App. C.1: 10% of 100 clients, batch size 64, 3 local epochs
    assert (dm.clients_per_round, dm.batch_size, dm.local_epochs) == (10, 64, 3)
    params = inspect.signature(FashionMNISTDataModule.__init__).parameters
    assert params["debian_dir"].default == DEBIAN_FASHION_MNIST_DIR == "/usr/share/datasets/fashion-mnist"
    assert params["download"].default is False and params["data_dir"].default == "data"


def test_shard_partition_gives_each_client_at_most_two_labels(fake):
    dm = _dm(fake, partitioner=ShardPartitioner(num_clients=10, shards_per_client=2), batch_size=8, local_epochs=1)
    dm.prepare_data()
    dm.setup("fit")
    labels = dm.train_dataset.targets
    seen = []
    for cid in range(dm.num_clients):
        idx = dm.client_indices(cid)
        seen.append(idx)
        assert len(torch.unique(labels[torch.as_tensor(idx)])) <= 2
    assert sorted(np.concatenate(seen).tolist()) == list(range(len(labels)))  # a partition of all samples
    x, y = next(iter(dm.client_dataloader(0, round_idx=0)))
    assert x.shape == (8, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.long


def test_trains_fedaware_cnn_end_to_end(fake):
    import lightning as L

    from lightning_fed.models.cnn import FedAwareCNN

    dm = _dm(fake, batch_size=16, eval_batch_size=16)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, max_epochs=1, limit_train_batches=2, limit_val_batches=1,
    )
    trainer.fit(FedAwareCNN(), datamodule=dm)
    assert {"train_loss", "val_loss", "val_acc"} <= set(trainer.callback_metrics)


@pytest.mark.skipif(
    not all((Path(DEBIAN_FASHION_MNIST_DIR) / f"{n}.gz").is_file() for n in RAW_NAMES),
    reason="Debian package dataset-fashion-mnist not installed",
)
def test_real_debian_fashion_mnist(tmp_path):
    dm = FashionMNISTDataModule(data_dir=tmp_path, partitioner=ShardPartitioner(num_clients=100, shards_per_client=2))
    dm.prepare_data()
    dm.setup("fit")
    train, test = dm.train_dataset, dm.test_dataset
    assert (len(train), len(test)) == (60_000, 10_000)
    assert torch.bincount(train.targets).tolist() == [6_000] * 10
    assert torch.bincount(test.targets).tolist() == [1_000] * 10
    assert train.targets[:5].tolist() == [9, 0, 0, 3, 0]  # Fashion-MNIST's first train labels
    assert abs(train.data.mean().item()) < 1e-3 and abs(train.data.std().item() - 1) < 1e-3
    hist = dm.partition.label_histogram()
    assert ((hist > 0).sum(axis=1) <= 2).all() and (hist.sum(axis=1) == 600).all()
