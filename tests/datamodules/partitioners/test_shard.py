"""ShardPartitioner's shard_size and keep_incomplete_shard (hand-computed and reference partitions)."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fed.datamodules import ShardPartitioner
from lightning_fed.datamodules.partitioners.shard import ShardPartitioner
from helpers import assert_disjoint_cover

LABELS = np.arange(23) % 3  # sorted stably: class 0 = 0,3,..,21 (8), class 1 = 1,..,22 (8), class 2 = 2,..,20 (7)
SORTED = np.argsort(LABELS, kind="stable")


def reference(n_clients, k, s, keep, seed, n=23):
    usable = n // s + (1 if keep and n % s else 0)
    dealt = np.random.default_rng(seed).permutation(usable)
    per = [k] * n_clients if k is not None else [usable // n_clients + (c < usable % n_clients) for c in range(n_clients)]
    out, pos = [], 0
    for c in range(n_clients):
        shards = dealt[pos:pos + per[c]]
        pos += per[c]
        out.append(np.concatenate([SORTED[j * s:min(j * s + s, n)] for j in shards]))
    return out


@pytest.mark.parametrize("k, keep", [(None, True), (None, False), (2, False), (2, True)])
def test_fixed_shard_size_matches_reference(k, keep):
    p = ShardPartitioner(2, k, seed=5, shard_size=4, keep_incomplete_shard=keep).partition(23, labels=LABELS)
    for c, expected in enumerate(reference(2, k, 4, keep, 5)):
        np.testing.assert_array_equal(p.client_indices(c), expected)


def test_hand_computed_sizes():
    # 23 samples, shard_size 4: 5 complete shards + 1 of 3. All dealt over 3 clients: 2, 2, 2 shards.
    keep = ShardPartitioner(3, None, shard_size=4, keep_incomplete_shard=True).partition(23, labels=LABELS)
    assert sorted(keep.sizes().tolist()) == [7, 8, 8] and keep.sizes().sum() == 23
    # without the incomplete shard: 5 shards over 3 clients -> 2, 2, 1 shards, 3 samples left out
    drop = ShardPartitioner(3, None, shard_size=4).partition(23, labels=LABELS)
    assert drop.sizes().tolist() == [8, 8, 4] and len(np.unique(drop.indices)) == 20
    # every shard is consecutive in label order: a shard of size 4 spans at most 2 classes
    for c in range(3):
        assert len(np.unique(LABELS[drop.client_indices(c)])) <= 3


def test_default_path_unchanged_by_the_new_arguments():
    labels = np.random.default_rng(0).integers(0, 10, 1000)
    a = ShardPartitioner(50, 2, seed=1).partition(1000, labels=labels)
    b = ShardPartitioner(50, 2, seed=1, shard_size=None, keep_incomplete_shard=False).partition(1000, labels=labels)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.offsets, b.offsets)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(shards_per_client=None), ValueError, "shards_per_client`=None .* needs `shard_size`"),
        (dict(shard_size=0), ValueError, "shard_size"),
        (dict(shard_size=2.0), TypeError, "shard_size"),
        (dict(keep_incomplete_shard=True), ValueError, "keep_incomplete_shard"),
        (dict(shard_size=4, keep_incomplete_shard="yes"), TypeError, "keep_incomplete_shard"),
    ],
)
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ShardPartitioner(3, **kwargs)


def test_too_many_shards_requested():
    with pytest.raises(ValueError, match="only 5 shards of `shard_size`=4"):
        ShardPartitioner(3, 2, shard_size=4).partition(23, labels=LABELS)
    with pytest.raises(ValueError, match="fewer than `num_clients`=7"):
        ShardPartitioner(7, None, shard_size=4).partition(23, labels=LABELS)


# ----------------------------------------------------------------------------------- Shard
def test_shard_sizes_and_at_most_two_labels_on_sorted_dataset():
    labels = np.repeat(np.arange(10), 600)  # sorted, 6000 samples, 200 shards of 30
    p = ShardPartitioner(100, shards_per_client=2, seed=0).partition(len(labels), labels=labels)
    assert_disjoint_cover(p, len(labels))
    np.testing.assert_array_equal(p.sizes(), np.full(100, 2 * 30))
    for c in range(100):
        assert len(np.unique(labels[p.client_indices(c)])) <= 2
    # each client's samples are exactly two label-sorted shards (contiguous runs of the sorted order)
    for c in range(100):
        starts = np.sort(p.client_indices(c))[[0, 30]]
        assert np.all(starts % 30 == 0)


def test_shard_remainder_is_spread():
    labels = np.arange(1003) % 10
    p = ShardPartitioner(10, shards_per_client=3, seed=1).partition(1003, labels=labels)
    assert_disjoint_cover(p, 1003)
    # shard sizes 33 or 34 -> client sizes within [99, 102]
    assert p.sizes().min() >= 3 * 33 and p.sizes().max() <= 3 * 34


def test_shard_too_many_shards():
    with pytest.raises(ValueError, match="more shards than samples"):
        ShardPartitioner(10, 2).partition(19, labels=np.zeros(19, dtype=int))
