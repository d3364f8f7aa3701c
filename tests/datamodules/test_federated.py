"""FederatedDataModule with torch and Hugging Face datasets: labels, natural ids, client loaders."""

from __future__ import annotations

import datasets
import lightning as L
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
import math
from helpers import regression_data
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, NaturalIdPartitioner
from helpers import classification_dataset, regression_data
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.datamodules.federated import split_client_eval


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
    from lightning_fed.datamodules.tasks.shakespeare import ShakespeareSequences

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
    # since #32 a torch-formatted Hugging Face dataset of fixed-shape columns is sliced too (its columns held as
    # tensors; test_hf_client_batches_are_tensor_slices_equal_to_what_a_dataloader_collates), not read per sample
    assert isinstance(dm.client_dataloader(0, 0), TensorBatches)
    dm = FederatedDataModule(_hf_dataset(), partitioner=ShardPartitioner(5, 1), clients_per_round=1, num_workers=1)
    dm.setup()
    assert isinstance(dm.client_dataloader(0, 0), DataLoader)  # workers: the DataLoader, as asked


def _selection_module(**kwargs):
    x, y = regression_data(n=200)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=100), clients_per_round=10, **kwargs)
    dm.setup()
    return dm


def test_no_dropout_no_over_selection_is_plain_uniform_sampling():
    dm = _selection_module()
    for r in range(5):
        sel = dm.select_cohort(r)
        assert sel.unavailable == 0 and np.array_equal(sel.cohort, sel.candidates)
        assert len(set(sel.cohort.tolist())) == 10
        expected = np.random.default_rng([0, 0x5A3D, r]).choice(100, size=10, replace=False)
        assert np.array_equal(sel.cohort, expected)


def test_client_dropout_and_over_selection():
    dm = _selection_module(client_dropout=0.3, over_selection=1.0, seed=7)
    sizes, dropped = [], []
    for r in range(300):
        sel = dm.select_cohort(r)
        assert len(sel.candidates) == 20 and len(set(sel.candidates.tolist())) == 20
        assert set(sel.cohort.tolist()) <= set(sel.candidates.tolist())
        # the kept clients are the first available candidates, in sampled order
        positions = [sel.candidates.tolist().index(c) for c in sel.cohort.tolist()]
        assert positions == sorted(positions)
        sizes.append(len(sel.cohort))
        dropped.append(sel.unavailable)
    assert np.mean(dropped) / 20 == pytest.approx(0.3, abs=0.02)
    # a full cohort whenever >= 10 of the 20 candidates stay: P(Binomial(20, 0.7) >= 10)
    p_full = sum(math.comb(20, k) * 0.7**k * 0.3 ** (20 - k) for k in range(10, 21))
    assert np.mean(np.array(sizes) == 10) == pytest.approx(p_full, abs=0.02)
    again = _selection_module(client_dropout=0.3, over_selection=1.0, seed=7)
    assert all(np.array_equal(dm.sample_clients(r), again.sample_clients(r)) for r in range(20))


def test_dropout_without_over_selection_shrinks_the_cohort(tmp_path):
    dm = _selection_module(client_dropout=0.5)
    sizes = [len(dm.sample_clients(r)) for r in range(200)]
    assert np.mean(sizes) == pytest.approx(5.0, abs=0.4)


def test_poisson_cohorts_are_binomial_and_seeded():
    """``cohort_sampling="poisson"``: client i joins round t iff u_{t,i} < q = C/N (#31 item 19), so the cohort
    size is Binomial(N, q) — mean C = 10, variance Nq(1 - q) = 9 — every client joins a fraction q of the rounds,
    and the cohorts are a pure function of (seed, round)."""
    dm = _selection_module(cohort_sampling="poisson")
    rounds, n, q = 3000, 100, 0.1
    member = np.zeros((rounds, n), dtype=bool)
    for r in range(rounds):
        sel = dm.select_cohort(r)
        assert np.array_equal(sel.cohort, sel.candidates) and sel.unavailable == 0
        assert np.array_equal(sel.cohort, np.unique(sel.cohort))  # distinct, increasing
        member[r, sel.cohort] = True
    sizes = member.sum(axis=1)
    assert sizes.mean() == pytest.approx(n * q, abs=4 * math.sqrt(n * q * (1 - q) / rounds))  # 4 standard errors
    assert sizes.var() == pytest.approx(n * q * (1 - q), rel=0.1)
    pmf = np.array([math.comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(n + 1)])
    for k in (5, 10, 15):  # the histogram follows Binomial(100, 0.1) at a few sizes
        assert np.mean(sizes == k) == pytest.approx(pmf[k], abs=4 * math.sqrt(pmf[k] * (1 - pmf[k]) / rounds))
    assert member.mean(axis=0).min() > q - 4 * math.sqrt(q * (1 - q) / rounds)  # every client joins about q of rounds
    again = _selection_module(cohort_sampling="poisson")
    assert all(np.array_equal(dm.sample_clients(r), again.sample_clients(r)) for r in range(50))
    other = _selection_module(cohort_sampling="poisson", seed=1)
    assert not all(np.array_equal(dm.sample_clients(r), other.sample_clients(r)) for r in range(50))


def test_poisson_cohorts_can_be_empty_and_take_dropout():
    """C/N = 1/100: P(empty) = 0.99^100 = 0.366; with dropout p the cohort is Binomial(N, q(1 - p))."""
    x, y = regression_data(n=200)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=100), clients_per_round=1, cohort_sampling="poisson")
    dm.setup()
    sizes = np.array([len(dm.sample_clients(r)) for r in range(3000)])
    assert np.mean(sizes == 0) == pytest.approx(0.99**100, abs=0.04)
    dm = _selection_module(cohort_sampling="poisson", client_dropout=0.5)
    sels = [dm.select_cohort(r) for r in range(2000)]
    assert np.mean([len(s.cohort) for s in sels]) == pytest.approx(5.0, abs=0.25)
    assert all(len(s.cohort) + s.unavailable == len(s.candidates) for s in sels)


def test_poisson_fit_runs_empty_rounds_as_rounds_nobody_reports(tmp_path):
    from helpers import LinearRegression, quiet_trainer_kwargs
    from lightning_fed import FederatedTrainer

    x, y = regression_data(n=40)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(20),
                             clients_per_round=1, batch_size=2, cohort_sampling="poisson", seed=3)
    dm.setup()
    sizes = [len(dm.sample_clients(r)) for r in range(8)]
    assert 0 in sizes and max(sizes) > 1  # empty rounds and rounds larger than C
    trainer = FederatedTrainer(max_epochs=8, **quiet_trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match="no client reported back"):
        trainer.fit(LinearRegression(), datamodule=dm)
    assert trainer.current_epoch == 8


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"cohort_sampling": "uniform"}, "`cohort_sampling` must be one of \\('fixed_size', 'poisson', 'sweep_then_uniform'\\)"),
        ({"cohort_sampling": "poisson", "over_selection": 0.5}, "`over_selection`.*cohort_sampling='fixed_size'"),
        ({"client_dropout": 1.0}, "`client_dropout` must be a probability in \\[0, 1\\), got 1.0"),
        ({"client_dropout": -0.1}, "`client_dropout`"),
        ({"over_selection": -1}, "`over_selection` must be a finite number >= 0, got -1"),
        ({"clients_per_round": 0}, "`clients_per_round` must be an integer >= 1, got 0"),
        ({"batch_size": 2.5}, "`batch_size` must be an integer >= 1, got 2.5"),
        ({"local_epochs": -1}, "`local_epochs`"),
        ({"data_order": "random"}, "`data_order` must be one of \\('reshuffle', 'once', 'none'\\)"),
        ({"num_workers": -2}, "`num_workers`"),
        ({"seed": -1}, "`seed`"),
    ],
)
def test_bad_datamodule_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FederatedDataModule(TensorDataset(torch.zeros(4, 1)), partitioner=IIDPartitioner(2), **kwargs)


def test_missing_natural_id_is_an_error():
    dm = FederatedDataModule(TensorDataset(torch.zeros(4, 1)), partitioner=NaturalIdPartitioner("writer_id"),
                             clients_per_round=1)
    with pytest.raises(ValueError, match="`id_column` 'writer_id' is not an attribute of TensorDataset"):
        dm.setup()


def test_label_partitioner_without_labels_is_an_error():
    from lightning_fed.datamodules import DirichletPartitioner

    dm = FederatedDataModule(TensorDataset(torch.zeros(40, 1)), partitioner=DirichletPartitioner(2, alpha=1.0),
                             clients_per_round=1)
    with pytest.raises(ValueError, match="needs labels"):
        dm.setup()
    dm = FederatedDataModule(TensorDataset(torch.zeros(40, 1)), partitioner=DirichletPartitioner(2, alpha=1.0),
                             clients_per_round=1, labels=np.linspace(0, 1, 40))
    with pytest.raises(ValueError, match="`labels` must be integer"):
        dm.setup()


# ------------------------------------------------------------------------------------------------ split
def test_split_client_eval_stratified_seeded():
    labels = np.array([0] * 10 + [1] * 5 + [2] * 1 + [7] * 4)  # dataset labels; the client holds the first 16
    indices = np.arange(16)[::-1].copy()
    tr, ev = split_client_eval(indices, 0.25, np.random.default_rng(5), labels)
    # k = floor(0.25·16) = 4; shares 4·(10, 5, 1)/16 = (2.5, 1.25, 0.25): floors (2, 1, 0), the one left to class 0
    assert np.bincount(labels[ev], minlength=3).tolist() == [3, 1, 0]
    assert sorted(np.concatenate([tr, ev]).tolist()) == list(range(16))
    assert list(tr) == [i for i in indices if i not in set(ev)]  # train keeps the client's order
    tr2, ev2 = split_client_eval(indices, 0.25, np.random.default_rng(5), labels)
    assert np.array_equal(ev, ev2) and np.array_equal(tr, tr2)
    draws = {tuple(split_client_eval(indices, 0.25, np.random.default_rng(s), labels)[1]) for s in range(20)}
    assert len(draws) > 1
    # sizes: n = 1 -> no eval sample; n = 2 -> one each; no labels -> uniform k
    assert [len(a) for a in split_client_eval(np.array([4]), 0.5, np.random.default_rng(0))] == [1, 0]
    assert [len(a) for a in split_client_eval(np.array([4, 9]), 0.1, np.random.default_rng(0))] == [1, 1]
    assert [len(a) for a in split_client_eval(np.arange(10), 0.3, np.random.default_rng(0))] == [7, 3]


def test_datamodule_eval_fraction_split_per_client_class_counts():
    ds = classification_dataset(300, seed=2)
    labels = ds.targets.numpy()
    plain = FederatedDataModule(ds, partitioner=IIDPartitioner(num_clients=5, seed=4), clients_per_round=2)
    plain.setup()
    dm = FederatedDataModule(ds, partitioner=IIDPartitioner(num_clients=5, seed=4), eval_fraction=0.2, seed=9,
                             clients_per_round=2)
    dm.setup()
    assert dm.client_eval_dataset is ds
    for c in range(5):
        full = plain.client_indices(c)
        tr, ev = dm.client_indices(c), dm.client_eval_indices(c)
        assert sorted(np.concatenate([tr, ev]).tolist()) == sorted(full.tolist())
        assert dm.client_num_samples(c) == len(tr)
        n = len(full)
        k = int(np.floor(0.2 * n))
        assert len(ev) == k
        counts = np.bincount(labels[full], minlength=3)
        got = np.bincount(labels[ev], minlength=3)
        assert np.all(np.abs(got - k * counts / n) < 1)  # stratified: each class within one of its share
    again = FederatedDataModule(ds, partitioner=IIDPartitioner(num_clients=5, seed=4), eval_fraction=0.2, seed=9,
                             clients_per_round=2)
    again.setup()
    assert all(np.array_equal(again.client_eval_indices(c), dm.client_eval_indices(c)) for c in range(5))
    # no val_dataset: central validation covers the union of the clients' evaluation data
    assert len(dm.val_dataloader().dataset) == sum(len(dm.client_eval_indices(c)) for c in range(5))


# ---------------------------------------------------------------- #32.2 Hugging Face data at tensor speed
def _collated(dataset, batches):
    from torch.utils.data import DataLoader

    return list(DataLoader(dataset, batch_sampler=[b.tolist() for b in batches]))


def test_hf_client_batches_are_tensor_slices_equal_to_what_a_dataloader_collates():
    """A torch-formatted Hugging Face dataset's columns are held as tensors once, and every client batch is a slice:
    the same dict, dtypes and values as the DataLoader path (float64 → float32 and int → int64, the torch
    formatter's dtypes), for several clients and rounds with reshuffling."""
    from lightning_fed.datamodules.federated import HFTensorColumns, TensorBatches

    rng = np.random.default_rng(0)
    n = 120
    hf = datasets.Dataset.from_dict({
        "image": rng.normal(size=(n, 2, 3)),  # float64 → float32
        "label": rng.integers(0, 4, n),
        "flag": rng.random(n) > 0.5,
    })
    dm = FederatedDataModule(hf, partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=2,
                             batch_size=7, local_epochs=2)
    dm.setup()
    for round_idx in range(3):
        for cid in range(6):
            fast = dm.client_dataloader(cid, round_idx)
            assert isinstance(fast, TensorBatches) and isinstance(fast.dataset, HFTensorColumns)
            slow = _collated(dm.train_dataset, dm.client_batches(cid, round_idx))
            assert len(list(fast)) == len(slow)
            for a, b in zip(fast, slow):
                assert list(a) == list(b) == ["image", "label", "flag"]
                for key in a:
                    assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
    assert dm.client_dataloader(0, 0).dataset is dm.client_dataloader(1, 0).dataset  # converted once


@pytest.mark.parametrize("column", [
    [[1.0] * (1 + i % 3) for i in range(40)],  # ragged sequences: a list of tensors, not one tensor
    [f"text {i}" for i in range(40)],          # text
])
def test_hf_datasets_that_are_not_fixed_shape_tensors_keep_the_dataloader(column):
    from torch.utils.data import DataLoader

    hf = datasets.Dataset.from_dict({"x": column, "label": [i % 2 for i in range(40)]})
    dm = FederatedDataModule(hf, partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2,
                             batch_size=1)
    dm.setup()
    assert isinstance(dm.client_dataloader(0, 0), DataLoader)


def test_sweep_then_uniform_visits_every_client_once_then_samples_uniformly():
    """#34: ``cohort_sampling="sweep_then_uniform"`` (the start-up of FedAWARE's public code): rounds 0..⌈N/C⌉−1
    partition the N = 100 clients into cohorts of C = 10 (each client exactly once, a seeded permutation), then the
    cohorts are those of ``"fixed_size"`` (C distinct clients, uniform). With N = 25, C = 10 the sweep is 3 rounds,
    the last of 5 clients."""
    dm = _selection_module(cohort_sampling="sweep_then_uniform")
    fixed = _selection_module()
    assert dm.sweep_rounds == 10 and fixed.sweep_rounds == 0
    sweep = [dm.sample_clients(r) for r in range(10)]
    assert all(len(c) == 10 for c in sweep)
    assert sorted(np.concatenate(sweep).tolist()) == list(range(100))  # every client exactly once
    assert not all(np.array_equal(c, np.sort(c)) for c in sweep)  # in the permutation's (random) order
    for r in range(10, 60):  # afterwards: exactly the fixed-size sampler's cohorts
        assert np.array_equal(dm.sample_clients(r), fixed.sample_clients(r))
    again = _selection_module(cohort_sampling="sweep_then_uniform")
    other = _selection_module(cohort_sampling="sweep_then_uniform", seed=1)
    assert all(np.array_equal(dm.sample_clients(r), again.sample_clients(r)) for r in range(12))
    assert not np.array_equal(dm.sample_clients(0), other.sample_clients(0))
    x, y = regression_data(n=100)
    small = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(
        num_clients=25), clients_per_round=10, cohort_sampling="sweep_then_uniform")
    small.setup()
    sizes = [len(small.sample_clients(r)) for r in range(4)]
    assert small.sweep_rounds == 3 and sizes == [10, 10, 5, 10]
    assert sorted(np.concatenate([small.sample_clients(r) for r in range(3)]).tolist()) == list(range(25))
    with pytest.raises(ValueError, match="`over_selection` .* needs cohort_sampling='fixed_size'"):
        _selection_module(cohort_sampling="sweep_then_uniform", over_selection=0.5)
    with pytest.raises(ValueError, match=r"`cohort_sampling` must be one of \('fixed_size', 'poisson', "
                                         r"'sweep_then_uniform'\)"):
        _selection_module(cohort_sampling="sweep")


# ---------------------------------------------------------------- #43.2 a ragged Hugging Face column is refused
class _DictRegression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.linear(batch["x"]).squeeze(-1), batch["y"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_ragged_hugging_face_column_is_refused_at_fit_start_naming_it_and_its_lengths(tmp_path):
    from helpers import quiet_trainer_kwargs
    from lightning_fed import FederatedTrainer

    rows = [[0.1, 0.2, 0.3]] * 40
    rows[33], rows[37] = [0.1, 0.2], [0.5]  # short rows in one client's share: that client would fail every round
    hf = datasets.Dataset.from_dict({"x": rows, "y": [0.5] * 40, "user": [i // 10 for i in range(40)]})
    dm = FederatedDataModule(hf, partitioner=NaturalIdPartitioner("user"), clients_per_round=4, batch_size=5)
    trainer = FederatedTrainer(max_epochs=2, **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"column 'x' is ragged: its rows hold lists of different lengths, from 1 "
                                         r"\(row 37\) to 3 \(row 0\).*batch_size=1"):
        trainer.fit(_DictRegression(), datamodule=dm)
    assert trainer.current_epoch == 0 and trainer.global_step == 0
    # what collates is accepted: one row per batch, or the ragged column left out of the format
    dm = FederatedDataModule(hf, partitioner=NaturalIdPartitioner("user"), clients_per_round=4, batch_size=1)
    assert dm.setup() is None and dm.check_local_work() is None
    fixed = hf.map(lambda r: {"x": (r["x"] + [0.0] * 3)[:3]})
    FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path)).fit(
        _DictRegression(), datamodule=FederatedDataModule(fixed, partitioner=NaturalIdPartitioner("user"),
                                                          clients_per_round=4, batch_size=5))


def test_sweep_cohorts_are_todays_with_one_permutation_per_sweep():
    """#40 item 5: the sweep's permutation is drawn once (not at every sweep round); the cohorts are unchanged:
    round r's are the permutation's r-th block of C, and a caller changing a cohort does not change later ones."""
    dm = _selection_module(cohort_sampling="sweep_then_uniform", seed=4, client_dropout=0.2)
    order = np.random.default_rng([4, 0x5EE9]).permutation(100)
    for r in range(10):
        sel = dm.select_cohort(r)
        assert np.array_equal(sel.candidates, order[r * 10:(r + 1) * 10])
        drop = np.random.default_rng([4, 0xD409, r]).random(10)
        assert np.array_equal(sel.cohort, sel.candidates[drop >= 0.2])
        sel.candidates[:] = -1
    assert np.array_equal(dm.select_cohort(3).candidates, order[30:40])


def test_a_subclass_overriding_natural_eval_indices_is_still_read():
    """Since #40 setup reads the natural split as one CSR partition (natural_eval_partition); a data module that
    overrides the list form natural_eval_indices is read through it."""
    test = TensorDataset(torch.arange(6.0).reshape(6, 1))

    class Lists(FederatedDataModule):
        def natural_eval_indices(self):
            return test, [np.array([5, 1]), np.array([], dtype=np.int64), np.array([0])]

    dm = Lists(TensorDataset(torch.zeros(9, 1)), partitioner=IIDPartitioner(3), clients_per_round=2,
               eval_clients_per_round="all")
    dm.setup()
    assert dm.client_eval_dataset is test
    assert [dm.client_eval_indices(c).tolist() for c in range(3)] == [[5, 1], [], [0]]
    assert dm.eval_client_ids().tolist() == [0, 2]


def test_every_setting_of_a_part_is_forwarded_by_the_data_module_from_the_parts_own_names():
    """Issue #40: the parts name their settings (``setting_names`` / ``attributes``); the data module forwards
    exactly those, reading and writing the part, and lists none itself."""
    import inspect

    from lightning_fed.datamodules import federated
    from lightning_fed.datamodules.client_eval import ClientEvaluation
    from lightning_fed.datamodules.cohorts import CohortSampler
    from lightning_fed.datamodules.source import DataSource

    ds = TensorDataset(torch.arange(12.0).reshape(12, 1), torch.arange(12) % 3)
    dm = FederatedDataModule(ds, partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2)
    for part, names in (("cohorts", CohortSampler.setting_names), ("client_evaluation", ClientEvaluation.setting_names),
                        ("data_source", DataSource.attributes)):
        owner = getattr(dm, part)
        if hasattr(owner, "settings"):
            assert tuple(owner.settings()) == names
        for name in names:
            assert getattr(dm, name) is getattr(owner, name)
    dm.clients_per_round = 3
    assert dm.cohorts.clients_per_round == 3
    source = inspect.getsource(federated)
    assert '"cohort_sampling", "client_dropout"' not in source and '"eval_fraction", "eval_local_steps"' not in source
