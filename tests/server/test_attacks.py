"""Simulated attackers (lightning_fed/server/attacks.py): which clients, exact counts, each attack's update, label
flipping in the data, and the argument errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from helpers import classification_dataset
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.server.aggregators import ClientDeltas, EmptyState, RoundInfo
from lightning_fed.server.attacks import LabelFlip, MaliciousClients, choose_malicious_clients, flip_client_labels


def _x(client_ids, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    deltas = [[torch.randn(2, 3, generator=g, dtype=dtype), torch.randn(4, generator=g, dtype=dtype)] for _ in client_ids]
    return ClientDeltas(list(client_ids), deltas, torch.ones(len(client_ids), dtype=torch.float64))


def _info(round_idx):
    return RoundInfo(round_idx, 0, 100, 10)


# ------------------------------------------------------------------------------------------------ which clients
@pytest.mark.parametrize("fraction, k, expected", [(0.2, 10, 2), (0.25, 10, 2), (0.29, 100, 29), (0.3, 10, 3),
                                                   (0.0, 10, 0), (1.0, 7, 7), (0.2, 2, 0), (0.5, 5, 2)])
def test_the_number_of_malicious_clients_is_floor_of_fraction_times_k(fraction, k, expected):
    ids = list(range(50, 50 + k))
    bad = MaliciousClients(fraction, seed=3).malicious_ids(ids, round_idx=4)
    assert len(bad) == expected and len(set(bad)) == expected and set(bad) <= set(ids)


def test_the_choice_is_a_function_of_seed_round_and_cohort_not_of_order():
    ids = [7, 3, 19, 42, 11, 5, 28, 30, 1, 16]
    stage = MaliciousClients(0.3, seed=5)
    first = stage.malicious_ids(ids, 0)
    assert first == MaliciousClients(0.3, seed=5).malicious_ids(list(reversed(ids)), 0)  # order-free, repeatable
    per_round = [tuple(stage.malicious_ids(ids, t)) for t in range(20)]
    assert len(set(per_round)) > 5  # fresh every round
    other_seed = [tuple(MaliciousClients(0.3, seed=6).malicious_ids(ids, t)) for t in range(20)]
    assert per_round != other_seed
    # the documented draw: numpy's default_rng([seed, tag, round]) choosing positions in the sorted ids
    rng = np.random.default_rng([5, 0xA77AC, 0])
    assert first == sorted(np.array(sorted(ids))[rng.choice(10, size=3, replace=False)].tolist())


# ------------------------------------------------------------------------------------------------ the attacks
def _run(stage, x, round_idx=2):
    y, state = stage.apply(x, EmptyState(), _info(round_idx))
    assert state == EmptyState() and y.client_ids == x.client_ids and torch.equal(y.counts, x.counts)
    return y, set(stage.malicious_ids(x.client_ids, round_idx))


def test_sign_flip_negates_exactly_the_malicious_updates():
    x = _x(range(10))
    y, bad = _run(MaliciousClients(0.2, attack="sign_flip", seed=1), x)
    assert len(bad) == 2
    for cid, before, after in zip(x.client_ids, x.deltas, y.deltas):
        for b, a in zip(before, after):
            assert torch.equal(a, -b if cid in bad else b)


def test_scale_multiplies_the_malicious_updates():
    x = _x(range(10), dtype=torch.float32)
    y, bad = _run(MaliciousClients(0.3, attack="scale", scale=-10.0, seed=1), x)
    assert len(bad) == 3
    for cid, before, after in zip(x.client_ids, x.deltas, y.deltas):
        for b, a in zip(before, after):
            assert a.dtype == torch.float32
            assert torch.equal(a, b * -10.0 if cid in bad else b)
    assert x.deltas[next(iter(bad))][0] is not y.deltas[next(iter(bad))][0]  # the client's own tensor is left alone


def test_gaussian_replaces_the_update_by_seeded_noise_of_std_scale():
    x = ClientDeltas(list(range(10)), [[torch.zeros(20000, dtype=torch.float64)] for _ in range(10)],
                     torch.ones(10, dtype=torch.float64))
    stage = MaliciousClients(0.2, attack="gaussian", scale=3.0, seed=1)
    y, bad = _run(stage, x)
    y2, _ = _run(MaliciousClients(0.2, attack="gaussian", scale=3.0, seed=1), x)
    noises = [y.deltas[c][0] for c in sorted(bad)]
    assert noises[0].std().item() == pytest.approx(3.0, rel=0.03) and abs(noises[0].mean().item()) < 0.1
    assert not torch.equal(noises[0], noises[1])  # one stream per client
    for c in range(10):
        assert torch.equal(y.deltas[c][0], y2.deltas[c][0])  # repeatable
        if c not in bad:
            assert torch.equal(y.deltas[c][0], torch.zeros(20000, dtype=torch.float64))


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(fraction=1.5), r"`fraction` must be a number in \[0, 1\]"),
     (dict(fraction=-0.1), r"`fraction` must be a number in \[0, 1\]"),
     (dict(fraction=0.2, attack="flip"), r"`attack` must be one of \('sign_flip', 'scale', 'gaussian'\)"),
     (dict(fraction=0.2, attack="scale"), r"`scale` is required for attack='scale'"),
     (dict(fraction=0.2, attack="gaussian"), r"`scale` is required for attack='gaussian'"),
     (dict(fraction=0.2, attack="gaussian", scale=0.0), r"`scale` \(the noise standard deviation\) must be > 0"),
     (dict(fraction=0.2, attack="scale", scale=float("inf")), "`scale` must be a finite number"),
     (dict(fraction=0.2, attack="sign_flip", scale=2.0), "`scale` must be None for attack='sign_flip'"),
     (dict(fraction=0.2, seed=-1), "`seed` must be an integer >= 0")],
)
def test_bad_attack_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MaliciousClients(**kwargs)


# ------------------------------------------------------------------------------------------------ label flip
def test_choose_malicious_clients_is_exact_and_seeded():
    a = choose_malicious_clients(20, 0.25, seed=4)
    assert a.dtype == np.int64 and len(a) == 5 and len(set(a.tolist())) == 5 and a.max() < 20
    assert np.array_equal(a, choose_malicious_clients(20, 0.25, seed=4))
    assert not np.array_equal(a, choose_malicious_clients(20, 0.25, seed=5))
    with pytest.raises(ValueError, match="`num_clients` must be an integer >= 0"):
        choose_malicious_clients(-1, 0.2)


def test_label_flip_maps_y_to_c_minus_1_minus_y_on_the_chosen_samples_only():
    y = torch.tensor([0, 1, 2, 3, 4, 0, 1])
    ds = LabelFlip(TensorDataset(torch.arange(7.0)[:, None], y), indices=[0, 2, 4, 5], num_classes=5)
    expected = [4, 1, 2, 3, 0, 4, 1]  # 5 - 1 - y at 0, 2, 4, 5
    assert [int(ds[i][1]) for i in range(7)] == expected
    index = torch.tensor([6, 0, 4, 3])
    xb, yb = ds.get_batch(index)
    assert yb.tolist() == [expected[i] for i in index.tolist()] and xb[:, 0].tolist() == [6.0, 0.0, 4.0, 3.0]
    assert torch.equal(y, torch.tensor([0, 1, 2, 3, 4, 0, 1]))  # the wrapped data is not modified


def test_label_flip_errors_are_named():
    ds = TensorDataset(torch.zeros(3, 1), torch.tensor([0, 1, 7]))
    with pytest.raises(ValueError, match="`num_classes` must be an integer >= 2"):
        LabelFlip(ds, [0], num_classes=1)
    with pytest.raises(ValueError, match=r"`indices` must lie in \[0, 3\)"):
        LabelFlip(ds, [3], num_classes=3)
    with pytest.raises(ValueError, match=r"a label outside \[0, 3\) \(`num_classes`\)"):
        LabelFlip(ds, [2], num_classes=3)[2]


def test_flip_client_labels_poisons_exactly_the_malicious_clients_batches():
    data = classification_dataset(n=120, classes=3)
    true = data.tensors[1].clone()
    dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3, batch_size=8)
    with pytest.raises(RuntimeError, match="setup"):
        flip_client_labels(dm, [0], num_classes=3)
    dm.setup("fit")
    bad = choose_malicious_clients(dm.num_clients, 1 / 3, seed=0).tolist()
    with pytest.raises(ValueError, match=r"`malicious_clients` must be client ids in \[0, 6\)"):
        flip_client_labels(dm, [6], num_classes=3)
    flip_client_labels(dm, bad, num_classes=3)
    assert torch.equal(dm.train_dataset.targets, true)  # partitioners and evaluation still see the true labels
    for cid in range(dm.num_clients):
        seen = 0
        for batch_idx, (xb, yb) in zip(dm.client_batches(cid, 0), dm.client_dataloader(cid, 0)):
            want = 2 - true[batch_idx] if cid in bad else true[batch_idx]
            assert torch.equal(yb, want), cid
            seen += len(yb)
        assert seen == dm.client_num_samples(cid)


# ------------------------------------------------------------------------------------------------ num_classes checked
class _PairDataset(torch.utils.data.Dataset):
    """A plain map-style dataset of (x, y) pairs: no `targets`, not a TensorDataset (labels known only when read)."""

    def __init__(self, y):
        self.y = list(y)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.zeros(1), self.y[i]


@pytest.mark.parametrize("num_classes, match", [
    (2, r"`num_classes`=2.*label 2"),  # too few: a flipped sample's label 2 is outside [0, 2)
    (5, r"`num_classes`=5.*3 classes"),  # too many: y -> 4 - y sends label 0 to 4, a class the model does not have
])
def test_flip_client_labels_checks_num_classes_against_the_labels_before_training(num_classes, match):
    """Labels 0..2 (3 classes): a wrong `num_classes` is refused when the attack is installed, not discovered inside
    the poisoned clients' training (where they failed and were dropped from every round)."""
    data = classification_dataset(n=120, classes=3)
    assert int(data.tensors[1].max()) == 2
    dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3, batch_size=8)
    dm.setup("fit")
    clean = dm.train_dataset
    with pytest.raises(ValueError, match=match):
        flip_client_labels(dm, [0, 1], num_classes=num_classes)
    assert dm.train_dataset is clean  # nothing installed
    with pytest.raises(ValueError, match=match):  # the same check on LabelFlip itself (TensorDataset labels)
        LabelFlip(TensorDataset(*data.tensors), dm.client_indices(0), num_classes=num_classes)


def test_label_flip_reads_the_flipped_labels_of_a_plain_dataset_when_built():
    ds = _PairDataset([0, 1, 2, 1, 0, 2])
    with pytest.raises(ValueError, match=r"`num_classes`=2.*label 2"):
        LabelFlip(ds, indices=[1, 2], num_classes=2)
    assert [int(LabelFlip(ds, indices=[1, 2], num_classes=3)[i][1]) for i in range(6)] == [0, 1, 0, 1, 0, 2]
    LabelFlip(ds, indices=[0, 1], num_classes=2)  # the flipped samples' labels fit; the rest are never flipped


def test_flip_client_labels_with_eval_fraction_keeps_central_and_federated_evaluation(tmp_path):
    """eval_fraction and no val_dataset: the central validation set is the union of the clients' held-out samples
    and federated evaluation runs over them; both survive flip_client_labels, on the clean (true) labels."""
    from helpers import SmallClassifier, quiet_trainer_kwargs
    from lightning_fed import FederatedTrainer

    data = classification_dataset(n=120, classes=3)
    true = data.tensors[1].clone()
    dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3,
                             batch_size=8, eval_fraction=0.25, eval_clients_per_round="all", eval_batch_size=7)
    dm.setup("fit")
    flip_client_labels(dm, [0, 1], num_classes=3)
    torch.manual_seed(0)
    model = SmallClassifier(num_classes=3)
    trainer = FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    m = trainer.callback_metrics
    assert "val_loss" in m and float(m["fed_eval_clients"]) == 6
    union = np.concatenate([dm.client_eval_indices(c) for c in range(6)])
    assert len(union) == 30
    model.eval()
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model.net(data.tensors[0][union]), true[union]).item()
    assert float(m["val_loss"]) == pytest.approx(expected, rel=1e-5)
    assert float(m["fed_val_loss/weighted"]) == pytest.approx(expected, rel=1e-5)  # sample-weighted = the union's mean


def test_choosing_or_flipping_zero_malicious_clients_warns():
    with pytest.warns(UserWarning, match=r"`fraction`=0.2 of 4 clients.*0 malicious"):
        assert choose_malicious_clients(4, 0.2).size == 0
    data = classification_dataset(n=60, classes=3)
    dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=3, seed=0), clients_per_round=3, batch_size=8)
    dm.setup("fit")
    with pytest.warns(UserWarning, match="no malicious clients"):
        flip_client_labels(dm, [], num_classes=3)
