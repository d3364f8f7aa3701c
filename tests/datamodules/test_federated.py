"""FederatedDataModule with torch and Hugging Face datasets: labels, natural ids, client loaders."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_fed.datamodules import (
    DirichletPartitioner,
    FederatedDataModule,
    FixedLocalSteps,
    NaturalIdPartitioner,
    ShardPartitioner,
)


def _hf_dataset(n=200, seed=0):
    rng = np.random.default_rng(seed)
    return datasets.Dataset.from_dict(
        {
            "x": rng.normal(size=(n, 3)).astype(np.float32),
            "label": rng.permutation(np.repeat(np.arange(4), n // 4)),  # 50 per class: shards of 10 align
            "user": rng.integers(0, 7, n),
        }
    )


def test_hf_dataset_labels_from_label_column():
    hf = _hf_dataset()
    dm = FederatedDataModule(hf, partitioner=ShardPartitioner(num_clients=10, shards_per_client=2), clients_per_round=3)
    dm.setup()
    labels = np.asarray(hf["label"])
    for cid in range(10):
        assert len(np.unique(labels[dm.client_indices(cid)])) <= 2
    batch = next(iter(dm.client_dataloader(0, round_idx=0)))
    assert isinstance(batch["x"], torch.Tensor) and batch["x"].shape[1] == 3
    assert torch.equal(batch["label"], torch.as_tensor(labels[batch_indices(dm, 0)[0]]))


def batch_indices(dm, cid):
    return dm.client_batches(cid, 0)


def test_hf_dataset_custom_label_column_and_natural_ids():
    hf = _hf_dataset().rename_column("label", "digit")
    dm = FederatedDataModule(hf, partitioner=DirichletPartitioner(num_clients=4, alpha=1.0, min_partition_size=1),
                             label_column="digit", clients_per_round=2)
    dm.setup()
    assert dm.partition.stats()["label_histogram"].sum() == 200
    dm = FederatedDataModule(hf, partitioner=NaturalIdPartitioner("user"), clients_per_round=2)
    dm.setup()
    users = np.asarray(hf["user"])
    assert dm.num_clients == len(np.unique(users))
    for cid in range(dm.num_clients):
        assert len(np.unique(users[dm.client_indices(cid)])) == 1
    with pytest.raises(ValueError, match="`id_column` 'writer' is not a column of the dataset"):
        bad = FederatedDataModule(hf, partitioner=NaturalIdPartitioner("writer"), clients_per_round=2)
        bad.setup()


def test_explicit_labels_win_and_targets_are_read_without_decoding():
    class NoGetItem(torch.utils.data.Dataset):
        targets = torch.arange(40) % 4

        def __len__(self):
            return 40

        def __getitem__(self, i):
            raise AssertionError("labels must not be read by decoding samples")

    dm = FederatedDataModule(NoGetItem(), partitioner=ShardPartitioner(num_clients=4, shards_per_client=1),
                             clients_per_round=1)
    dm.setup()
    for cid in range(4):
        assert len(np.unique(NoGetItem.targets.numpy()[dm.client_indices(cid)])) == 1
    labels = np.repeat(np.arange(4), 10)
    dm = FederatedDataModule(NoGetItem(), partitioner=ShardPartitioner(num_clients=4, shards_per_client=1),
                             clients_per_round=1, labels=labels)
    dm.setup()
    assert sorted(len(np.unique(labels[dm.client_indices(c)])) for c in range(4)) == [1, 1, 1, 1]


def test_client_loader_covers_local_epochs_and_step_budgets():
    x = torch.arange(30, dtype=torch.float32).unsqueeze(1)
    ds = TensorDataset(x, torch.zeros(30))
    dm = FederatedDataModule(ds, partitioner=NaturalIdPartitioner("client_id"), clients_per_round=1,
                             batch_size=4, local_epochs=3)
    ds.client_id = np.repeat([0, 1, 2], 10)
    dm.setup()
    seen = torch.cat([b[0].squeeze(1) for b in dm.client_dataloader(1, round_idx=5)])
    assert len(seen) == 30 and sorted(seen.tolist()) == sorted(list(range(10, 20)) * 3)
    dm = FederatedDataModule(ds, partitioner=NaturalIdPartitioner("client_id"), clients_per_round=1,
                             local_work=FixedLocalSteps(steps=7, batch_size=3))
    dm.setup()
    assert len(list(dm.client_dataloader(2, round_idx=0))) == 7


def test_partition_is_computed_once_and_is_seed_deterministic():
    hf = _hf_dataset()
    a = FederatedDataModule(hf, partitioner=DirichletPartitioner(4, alpha=0.3, min_partition_size=1, seed=3),
                            clients_per_round=2)
    b = FederatedDataModule(hf, partitioner=DirichletPartitioner(4, alpha=0.3, min_partition_size=1, seed=3),
                            clients_per_round=2)
    a.setup()
    first = a.partition
    a.setup()
    assert a.partition is first
    b.setup()
    assert all(np.array_equal(a.client_indices(c), b.client_indices(c)) for c in range(4))
    assert all(np.array_equal(a.sample_clients(r), b.sample_clients(r)) for r in range(10))


def test_tensor_fast_path_yields_what_a_dataloader_collates():
    from torch.utils.data import DataLoader

    from lightning_fed.datamodules.federated import TensorBatches
    from lightning_fed.datamodules.shakespeare import ShakespeareSequences

    g = torch.Generator().manual_seed(0)
    tensor_ds = TensorDataset(torch.randn(50, 2, 3, generator=g), torch.randint(0, 5, (50,), generator=g))
    tokens = torch.randint(0, 90, (50, 81), generator=g)
    shakespeare_ds = ShakespeareSequences(tokens, np.zeros(50, dtype=np.int64), ["play/ROLE"])
    batches = [np.array([3, 1, 4]), np.array([15, 9, 2, 6]), np.array([49])]
    for ds in (tensor_ds, shakespeare_ds):
        assert TensorBatches.supports(ds)
        fast = list(TensorBatches(ds, batches))
        slow = list(DataLoader(ds, batch_sampler=[b.tolist() for b in batches]))
        assert len(fast) == len(slow) == 3
        for a, b in zip(fast, slow):
            assert all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(a, b))
    tensor_ds.targets = tensor_ds.tensors[1]
    dm = FederatedDataModule(tensor_ds, partitioner=ShardPartitioner(5, 1), clients_per_round=1, batch_size=4)
    dm.setup()
    assert isinstance(dm.client_dataloader(0, 0), TensorBatches)
    dm = FederatedDataModule(_hf_dataset(), partitioner=ShardPartitioner(5, 1), clients_per_round=1)
    dm.setup()
    assert isinstance(dm.client_dataloader(0, 0), DataLoader)
