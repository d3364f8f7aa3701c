"""CIFAR-10/100 data modules, the Pachinko partitioner and the CIFAR ResNets.

The fake CIFAR files are written in the REAL python-pickle layout torchvision reads
(``cifar-10-batches-py/data_batch_1..5``, ``test_batch``, ``batches.meta``; ``cifar-100-python/train``,
``test``, ``meta`` with ``fine_labels`` / ``coarse_labels``; ``data`` uint8 ``[N, 3072]`` in CHW row-major
order) and read back by torchvision's own reader. Their md5s differ from torchvision's, so the data
modules are given ``check_md5=False`` (documented option; one test checks the md5 path rejects them).
"""
from __future__ import annotations

import pickle
from pathlib import Path
import numpy as np
import pytest
import torch
from lightning_fed.datamodules.federated import TensorBatches
from lightning_fed.datamodules.partitioners.dirichlet import DirichletPartitioner
from lightning_fed.datamodules.partitioners.iid import IIDPartitioner
from lightning_fed.datamodules.partitioners.pachinko import CIFAR100_COARSE_OF_FINE, PachinkoPartitioner
from lightning_fed.datamodules.tasks.cifar import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100DataModule,
    CIFAR10DataModule,
    CIFARTensorDataset,
)
from lightning_fed.models.resnet import ResNet9
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*self.trainer. reference is not registered.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
]


# ---------------------------------------------------------------------------------------------- fake files
def _dump(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def make_cifar10(root: Path, per_batch: int = 20, n_test: int = 16, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    train_x, train_y = [], []
    for b in range(1, 6):
        x = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        y = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        _dump(folder / f"data_batch_{b}", {"batch_label": f"training batch {b} of 5", "labels": y, "data": x,
                                           "filenames": [f"img{b}_{i}.png" for i in range(per_batch)]})
        train_x.append(x)
        train_y += y
    tx = rng.integers(0, 256, size=(n_test, 3072), dtype=np.uint8)
    ty = [i % 10 for i in range(n_test)]
    _dump(folder / "test_batch", {"batch_label": "testing batch 1 of 1", "labels": ty, "data": tx,
                                  "filenames": [f"t{i}.png" for i in range(n_test)]})
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    _dump(folder / "batches.meta", {"label_names": names, "num_cases_per_batch": per_batch, "num_vis": 3072})
    return {"train_x": np.concatenate(train_x), "train_y": np.array(train_y), "test_x": tx, "test_y": np.array(ty)}


def make_cifar100(root: Path, per_fine: int = 3, n_test: int = 20, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    cof = np.asarray(CIFAR100_COARSE_OF_FINE)
    fine = rng.permutation(np.repeat(np.arange(100), per_fine))
    x = rng.integers(0, 256, size=(fine.size, 3072), dtype=np.uint8)
    _dump(folder / "train", {"filenames": [f"{i}.png" for i in range(fine.size)], "batch_label": "training batch 1 of 1",
                             "fine_labels": fine.tolist(), "coarse_labels": cof[fine].tolist(), "data": x})
    tf = np.arange(n_test) % 100
    tx = rng.integers(0, 256, size=(n_test, 3072), dtype=np.uint8)
    _dump(folder / "test", {"filenames": [f"t{i}.png" for i in range(n_test)], "batch_label": "testing batch 1 of 1",
                            "fine_labels": tf.tolist(), "coarse_labels": cof[tf].tolist(), "data": tx})
    _dump(folder / "meta", {"fine_label_names": [f"fine{i}" for i in range(100)],
                            "coarse_label_names": [f"coarse{i}" for i in range(20)]})
    return {"train_x": x, "fine": fine, "coarse": cof[fine], "test_x": tx, "test_fine": tf}


# ---------------------------------------------------------------------------------------------- datasets
def test_tensor_dataset_center_crop_and_normalisation():
    imgs = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    ds = CIFARTensorDataset(imgs, torch.arange(4), CIFAR10_MEAN, CIFAR10_STD, crop_size=24, augment=False)
    x, y = ds.get_batch(torch.tensor([2, 0]))
    assert x.shape == (2, 3, 24, 24) and y.tolist() == [2, 0]
    mean = torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(3, 1, 1)
    expect = (imgs[2, :, 4:28, 4:28].float() / 255 - mean) / std
    torch.testing.assert_close(x[0], expect)
    x0, y0 = ds[2]
    torch.testing.assert_close(x0, expect)
    loader = torch.utils.data.DataLoader(ds, batch_size=3)  # uses __getitems__ (one get_batch per batch)
    xb, yb = next(iter(loader))
    assert xb.shape == (3, 3, 24, 24) and yb.tolist() == [0, 1, 2]
    torch.testing.assert_close(xb[2], expect)


def test_tensor_dataset_random_crop_flip_are_crops_and_seeded():
    imgs = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    ds = CIFARTensorDataset(imgs, torch.zeros(64, dtype=torch.long), (0.0,) * 3, (1.0,) * 3, crop_size=24, augment=True)
    index = torch.arange(64)
    torch.manual_seed(5)
    x, _ = ds.get_batch(index)
    torch.manual_seed(5)
    x2, _ = ds.get_batch(index)
    assert torch.equal(x, x2)  # the randomness is torch's global RNG (the client's seed)
    found_flip = found_plain = False
    offsets = set()
    for i in range(64):
        img = imgs[i].float() / 255
        hit = None
        for oy in range(9):
            for ox in range(9):
                crop = img[:, oy : oy + 24, ox : ox + 24]
                if torch.equal(x[i], crop):
                    hit = (oy, ox, False)
                elif torch.equal(x[i], crop.flip(-1)):
                    hit = (oy, ox, True)
        assert hit is not None, i
        offsets.add(hit[:2])
        found_flip |= hit[2]
        found_plain |= not hit[2]
    assert found_flip and found_plain and len(offsets) > 10


# ---------------------------------------------------------------------------------------------- data modules
def test_cifar10_reads_real_layout(tmp_path):
    fake = make_cifar10(tmp_path)
    dm = CIFAR10DataModule(data_dir=tmp_path, partitioner=IIDPartitioner(num_clients=10), check_md5=False,
                           augment=False, normalize=False)
    dm.setup()
    train, test = dm.train_dataset, dm.test_dataset
    assert len(train) == 100 and len(test) == 16 and dm.val_dataset is test
    assert train.targets.tolist() == fake["train_y"].tolist()
    assert train.classes[0] == "airplane"
    expect = torch.from_numpy(fake["train_x"][7].reshape(3, 32, 32))[:, 4:28, 4:28].float() / 255
    torch.testing.assert_close(train[7][0], expect)
    assert TensorBatches.supports(train)
    batch = next(iter(dm.client_dataloader(0, 0)))
    assert batch[0].shape[1:] == (3, 24, 24) and batch[0].dtype == torch.float32
    assert dm.num_clients == 10 and dm.batch_size == 20 and dm.clients_per_round == 10


def test_cifar10_default_partitioner_and_md5(tmp_path):
    dm = CIFAR10DataModule(data_dir=tmp_path)
    p = dm.partitioner
    assert isinstance(p, DirichletPartitioner) and (p.num_clients, p.alpha, p.method) == (500, 0.1, "per_client")
    make_cifar10(tmp_path)
    with pytest.raises(FileNotFoundError, match="not unpickled"):
        CIFAR10DataModule(data_dir=tmp_path, partitioner=IIDPartitioner(num_clients=2)).setup()


def test_missing_data_explains(tmp_path):
    dm = CIFAR10DataModule(data_dir=tmp_path, partitioner=IIDPartitioner(num_clients=2))
    with pytest.raises(FileNotFoundError, match="download=True"):
        dm.setup()
    with pytest.raises(FileNotFoundError, match="cifar-100-python"):
        CIFAR100DataModule(data_dir=tmp_path, partitioner=IIDPartitioner(num_clients=2)).setup()


def test_cifar100_reads_fine_and_coarse(tmp_path):
    fake = make_cifar100(tmp_path)
    part = PachinkoPartitioner(num_clients=10, samples_per_client=30, seed=0)
    dm = CIFAR100DataModule(data_dir=tmp_path, partitioner=part, check_md5=False)
    dm.setup()
    assert dm.train_dataset.targets.tolist() == fake["fine"].tolist()
    assert dm.train_dataset.coarse_targets.tolist() == fake["coarse"].tolist()
    assert dm.test_dataset.coarse_targets.shape == (20,)
    assert np.array_equal(dm.partition.sizes(), np.full(10, 30))
    dflt = CIFAR100DataModule(data_dir=tmp_path).partitioner
    assert isinstance(dflt, PachinkoPartitioner)
    assert (dflt.num_clients, dflt.samples_per_client, dflt.alpha, dflt.beta) == (500, 100, 0.1, 10.0)
    # the training batches are augmented: same seed -> same batch
    torch.manual_seed(0)
    b1 = next(iter(dm.client_dataloader(3, 0)))
    torch.manual_seed(0)
    b2 = next(iter(dm.client_dataloader(3, 0)))
    assert torch.equal(b1[0], b2[0]) and b1[0].shape[1:] == (3, 24, 24)


def test_cifar100_coarse_map_mismatch(tmp_path):
    make_cifar100(tmp_path)
    bad = PachinkoPartitioner(num_clients=2, samples_per_client=2, coarse_of_fine=[0] * 100)
    with pytest.raises(ValueError, match="coarse_of_fine"):
        CIFAR100DataModule(data_dir=tmp_path, partitioner=bad, check_md5=False).setup()


@pytest.mark.parametrize("kwargs, match", [({"crop_size": 40}, "crop_size"), ({"download": "yes"}, "download"),
                                           ({"check_md5": 1}, "check_md5")])
def test_datamodule_bad_args(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        CIFAR10DataModule(data_dir=tmp_path, **kwargs)


def test_federated_fedadam_end_to_end(tmp_path):
    from helpers import quiet_trainer_kwargs
    from lightning_fed import FederatedTrainer
    from lightning_fed.callbacks import FedAdam

    make_cifar100(tmp_path)
    dm = CIFAR100DataModule(
        data_dir=tmp_path, partitioner=PachinkoPartitioner(num_clients=20, samples_per_client=10), check_md5=False,
        clients_per_round=2, batch_size=5, eval_batch_size=20,
    )
    model = ResNet9(num_classes=100, lr=0.03)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = FederatedTrainer(max_epochs=2, callbacks=[FedAdam(lr=0.01, tau=1e-3)], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    assert {"val_loss", "val_acc"} <= set(trainer.callback_metrics)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
