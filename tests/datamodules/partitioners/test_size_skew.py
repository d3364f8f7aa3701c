"""Linear / Square / Exponential size skew and the size + label skew combination."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_fed.datamodules import (
    ExponentialPartitioner,
    InnerDirichletPartitioner,
    LinearPartitioner,
    SizeLabelSkewPartitioner,
    SquarePartitioner,
)
from lightning_fed.datamodules.partitioners.size_skew import size_skew_sizes


def test_hand_computed_sizes():
    # linear, 4 clients, 100 samples: 1+2+3+4 = 10 units -> 10, 20, 30, 40
    assert LinearPartitioner(4).partition(100).sizes().tolist() == [10, 20, 30, 40]
    # square: 1+4+9+16 = 30 units -> floor(100/30 * [1, 4, 9, 16]) = 3, 13, 30, 53; the 1 left over to the last
    assert SquarePartitioner(4).partition(100).sizes().tolist() == [3, 13, 30, 54]
    # exponential: e^i / sum e^j
    units = [math.exp(i) for i in range(1, 5)]
    expected = [int(100 * u / sum(units)) for u in units]
    expected[-1] += 100 - sum(expected)
    assert ExponentialPartitioner(4).partition(100).sizes().tolist() == expected == [3, 8, 23, 66]


def test_shuffled_cut_matches_reference_and_shuffle_false_is_dataset_order():
    p = LinearPartitioner(3, seed=4).partition(60)
    perm = np.random.default_rng(4).permutation(60)
    np.testing.assert_array_equal(p.client_indices(0), perm[:10])
    np.testing.assert_array_equal(p.client_indices(2), perm[30:])
    q = LinearPartitioner(3, shuffle=False).partition(60)
    np.testing.assert_array_equal(q.client_indices(1), np.arange(10, 30))


def test_size_label_skew_is_inner_dirichlet_with_the_skewed_sizes():
    labels = np.random.default_rng(0).integers(0, 4, 500)
    p = SizeLabelSkewPartitioner(5, 0.3, size_law="square", seed=2).partition(500, labels=labels)
    sizes = size_skew_sizes("square", 500, 5)
    q = InnerDirichletPartitioner(sizes.tolist(), 0.3, seed=2).partition(500, labels=labels)
    assert np.array_equal(p.indices, q.indices) and np.array_equal(p.offsets, q.offsets)
    assert p.sizes().tolist() == sizes.tolist()


def test_too_many_clients_is_an_error():
    with pytest.raises(ValueError, match="every client needs >= 1"):
        ExponentialPartitioner(10).partition(100)


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda: LinearPartitioner(0), ValueError, "num_clients"),
        (lambda: SquarePartitioner(3, shuffle=1), TypeError, "shuffle"),
        (lambda: ExponentialPartitioner(3, seed=-1), ValueError, "seed"),
        (lambda: SizeLabelSkewPartitioner(3, 0.1, size_law="cubic"), ValueError, "size_law.*'linear', 'square'"),
        (lambda: SizeLabelSkewPartitioner(3, -0.1), ValueError, "alpha"),
    ],
)
def test_bad_arguments(make, exc, match):
    with pytest.raises(exc, match=match):
        make()
