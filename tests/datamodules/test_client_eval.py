"""The held-out per-client evaluation split, vectorised over the population: the same split as one seeded generator
per client (#40 item 5; stratified by label, #50 item 7)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_fed.datamodules import FederatedDataModule, NaturalIdPartitioner
from lightning_fed.datamodules.client_eval import pcg64_states, split_client_eval, split_partition_eval
from lightning_fed.datamodules.partition import Partition


def _reference_split(partition, fraction, seed, labels):
    """The split as FederatedDataModule made it before #40: one default_rng([seed, 0xE5A1, c]) per client."""
    train, held = [], []
    for c in range(partition.num_clients):
        idx = partition.client_indices(c)
        n = idx.size
        k = 0 if n < 2 else int(np.clip(math.floor(fraction * n + 1e-9), 1, n - 1))
        chosen = np.zeros(n, dtype=bool)
        rng = np.random.default_rng([seed, 0xE5A1, c])
        if k and labels is None:
            chosen[rng.permutation(n)[:k]] = True
        elif k:
            classes, inverse, counts = np.unique(labels[idx], return_inverse=True, return_counts=True)
            exact = k * counts / n
            quota = np.floor(exact + 1e-9).astype(np.int64)
            quota[np.argsort(-(exact - quota), kind="stable")[: k - int(quota.sum())]] += 1
            for j in range(classes.size):
                members = np.flatnonzero(inverse == j)
                chosen[members[rng.permutation(members.size)[: quota[j]]]] = True
        train.append(idx[~chosen])
        held.append(idx[chosen])
    return train, held


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3, 2**70 + 1])
def test_pcg64_states_are_default_rngs(seed):
    ids = np.array([0, 1, 2, 99, 123_456, 2**32 - 1])
    for (state, inc), c in zip(pcg64_states([seed, 0xE5A1], ids), ids.tolist()):
        expected = np.random.default_rng([seed, 0xE5A1, c]).bit_generator.state["state"]
        assert (state, inc) == (expected["state"], expected["inc"])
    with pytest.raises(ValueError, match="ids"):
        pcg64_states([0], np.array([2**32]))


@pytest.mark.parametrize("stratified", [False, True])
@pytest.mark.parametrize("fraction", [0.2, 0.5])
def test_split_partition_eval_equals_one_generator_per_client(stratified, fraction):
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 25, 300)
    total = int(sizes.sum())
    labels = rng.integers(0, 4, total + 5) if stratified else None
    lists = np.split(rng.permutation(total), np.cumsum(sizes)[:-1])
    partition = Partition.from_client_lists(lists, labels=labels, client_names=np.arange(300) * 2)
    train, held = split_partition_eval(partition, fraction, [5, 0xE5A1])
    ref_train, ref_held = _reference_split(partition, fraction, 5, labels)
    for c in range(300):
        assert np.array_equal(train.client_indices(c), ref_train[c])
        assert np.array_equal(held.client_indices(c), ref_held[c])
    assert np.array_equal(train.client_names, partition.client_names)
    assert (train.labels is None) == (not stratified)
    assert held.sizes()[sizes == 1].sum() == 0 and (train.sizes() >= 1).all()


def _random_labelled_partition(rng, max_size, num_classes, num_clients=None):
    """A shuffled partition of 1..``max_size`` samples a client with labels in ``0 .. num_classes-1`` (uniform or
    skewed), plus its ``k`` per client as split_partition_eval computes it."""
    num_clients = int(rng.integers(1, 40)) if num_clients is None else num_clients
    sizes = rng.integers(1, max_size + 1, num_clients)
    total = int(sizes.sum())
    if rng.random() < 0.5:
        labels = rng.integers(0, num_classes, total)
    else:  # skewed: a few classes hold most samples
        labels = np.minimum(rng.geometric(0.35, total) - 1, num_classes - 1)
    lists = np.split(rng.permutation(total), np.cumsum(sizes)[:-1])
    return Partition.from_client_lists(lists, labels=labels), labels


# fractions in (0, 1), edges included: ⌊f·n⌋ = 0 (clipped to 1), ⌊f·n⌋ ≥ n − 1 (clipped to n − 1), f·n exact
_FRACTIONS = [1e-9, 0.01, 0.1, 0.2, 0.25, 1 / 3, 0.5, 0.7, 0.99, 1 - 1e-9]


@pytest.mark.parametrize("trial", range(4))
def test_stratified_split_is_the_per_client_loop_on_random_partitions(trial):
    """Issue #50.7: the vectorised stratified split equals one default_rng([seed, 0xE5A1, c]) per client running
    the per-client loop (_reference_split), held-out and kept indices of every client, on random partitions:
    clients of 1 sample to a few thousand, 1 to 150 classes, fractions from 1e-9 to 1 - 1e-9."""
    rng = np.random.default_rng(500 + trial)
    for max_size, num_classes in [(1, 3), (2, 2), (6, 1), (30, 4), (30, 150), (400, 10), (3000, 40), (200, 150)]:
        partition, labels = _random_labelled_partition(rng, max_size, num_classes)
        fraction = float(rng.choice(_FRACTIONS + [rng.random()]))
        seed = int(rng.integers(0, 2**40))
        train, held = split_partition_eval(partition, fraction, [seed, 0xE5A1])
        ref_train, ref_held = _reference_split(partition, fraction, seed, labels)
        for c in range(partition.num_clients):
            assert np.array_equal(held.client_indices(c), ref_held[c]), (max_size, num_classes, fraction, c)
            assert np.array_equal(train.client_indices(c), ref_train[c]), (max_size, num_classes, fraction, c)


def test_stratified_split_mixes_both_ways_at_population_scale():
    """3,000 small clients (drawn together, vectorised) and two of 4,000 samples (each with its own Generator): the
    split is still the per-client loop's."""
    rng = np.random.default_rng(9)
    sizes = np.r_[rng.integers(1, 13, 3000), 4000, 4000]
    rng.shuffle(sizes)
    total = int(sizes.sum())
    labels = rng.integers(0, 5, total)
    partition = Partition.from_client_lists(np.split(rng.permutation(total), np.cumsum(sizes)[:-1]), labels=labels)
    train, held = split_partition_eval(partition, 0.3, [2, 0xE5A1])
    ref_train, ref_held = _reference_split(partition, 0.3, 2, labels)
    assert np.array_equal(held.indices, np.concatenate(ref_held))
    assert np.array_equal(train.indices, np.concatenate(ref_train))
    assert np.array_equal(held.sizes(), [r.size for r in ref_held])


@pytest.mark.parametrize("pass_cost_us", [0.0, 1e18])
def test_stratified_held_both_ways_are_the_per_client_loop(pass_cost_us):
    """Both ways _stratified_held draws — every client through the vectorised PCG64 streams and Fisher-Yates swaps
    (pass cost 0), every client through a re-pointed Generator (pass cost 1e18 µs) — hold out what the per-client loop
    does, on partitions with one-sample clients, one-class clients, clients whose classes all have one sample, and
    huge label values (the lexsort fallback of the (client, label) sort)."""
    from lightning_fed.datamodules.client_eval import _stratified_held

    rng = np.random.default_rng(77)
    cases = [_random_labelled_partition(rng, s, c) for s, c in [(1, 2), (3, 3), (12, 1), (25, 6), (300, 60), (80, 40)]]
    partition = Partition.from_client_lists([[0, 1], [2, 3, 4], [5], [6, 7, 8, 9]], labels=[4, 9, 0, 0, 1, 2**61, 5,
                                                                                            5, 5, 2**61])
    cases.append((partition, partition.labels))
    for partition, labels in cases:
        for fraction in (1e-9, 0.3, 0.5, 1 - 1e-9):
            sizes = partition.sizes()
            k = np.array([0 if n < 2 else min(max(math.floor(fraction * n + 1e-9), 1), n - 1) for n in sizes.tolist()])
            _, ref_held = _reference_split(partition, fraction, 11, labels)
            expected = np.zeros(partition.indices.size, dtype=bool)
            for c in range(partition.num_clients):
                start = partition.offsets[c]
                expected[start:start + sizes[c]] = np.isin(partition.client_indices(c), ref_held[c])
            got = _stratified_held(partition, k, [11, 0xE5A1], pass_cost_us=pass_cost_us)
            assert np.array_equal(got, expected), (sizes.max(), fraction)


def test_split_client_eval_is_the_per_client_split():
    idx = np.arange(10, 20)
    tr, ev = split_client_eval(idx, 0.3, np.random.default_rng(0))
    assert sorted(tr.tolist() + ev.tolist()) == idx.tolist() and len(ev) == 3


def test_datamodule_eval_fraction_split_and_eval_clients_unchanged():
    """The data module's held-out split is today's, bit for bit, and its evaluation client list is computed once."""
    rng = np.random.default_rng(0)
    ids = np.concatenate([np.arange(400), rng.integers(0, 400, 1600)])
    ds = TensorDataset(torch.zeros(ids.size, 1))
    ds.client_id = torch.from_numpy(ids)
    dm = FederatedDataModule(ds, partitioner=NaturalIdPartitioner(), clients_per_round=5, eval_fraction=0.25, seed=3,
                             eval_clients_per_round=7)
    dm.setup()
    whole = NaturalIdPartitioner().partition(ids.size, ids=ids)
    ref_train, ref_held = _reference_split(whole, 0.25, 3, None)
    for c in range(dm.num_clients):
        assert np.array_equal(dm.client_indices(c), ref_train[c])
        assert np.array_equal(dm.client_eval_indices(c), ref_held[c])
    eligible = [c for c in range(400) if ref_held[c].size]
    assert dm.eval_client_ids().tolist() == eligible
    assert dm.eval_client_ids() is dm.eval_client_ids()  # cached at setup, not recounted at every validation
    expected = np.sort(np.random.default_rng([3, 0xE7A1, 4]).choice(np.array(eligible), size=7, replace=False))
    assert np.array_equal(dm.select_eval_clients(4), expected)


def test_client_evaluation_part_checks_and_reports():
    """The federated-evaluation part on its own: its settings report, its held-out split, its checks."""
    from lightning_fed.datamodules.client_eval import ClientEvaluation

    part = ClientEvaluation(eval_clients_per_round=3, eval_fraction=0.5)
    assert part.settings() == {"eval_clients_per_round": 3, "eval_fraction": 0.5, "eval_local_steps": 0,
                               "eval_csv": None, "eval_personal_untrained": "global"}  # #55: the new setting's default
    partition = Partition.from_client_lists([[0, 1], [2], [3, 4, 5, 6]])
    train, held = part.held_out(partition, seed=1)
    assert held.sizes().tolist() == [1, 0, 2] and train.sizes().tolist() == [1, 1, 2]
    with pytest.raises(ValueError, match=r"`eval_clients_per_round` \(3\) must not exceed .* \(2\)"):
        part.eligible_clients(held, "MyTask")
    assert ClientEvaluation(eval_clients_per_round="all").eligible_clients(held, "MyTask").tolist() == [0, 2]
    with pytest.raises(ValueError, match="MyTask has no per-client evaluation data"):
        ClientEvaluation(eval_clients_per_round=1).eligible_clients(None, "MyTask")
    assert ClientEvaluation().held_out(partition, seed=1) is None
    with pytest.raises(ValueError, match="`eval_local_steps` and `eval_csv` need federated evaluation"):
        ClientEvaluation(eval_local_steps=2)
