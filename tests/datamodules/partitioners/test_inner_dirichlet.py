"""InnerDirichletPartitioner: given client sizes, a Dirichlet class mix per client."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fed.datamodules import DirichletPartitioner, InnerDirichletPartitioner

LABELS = np.random.default_rng(0).integers(0, 5, 1000)


def test_sizes_are_exact_and_every_sample_is_used():
    sizes = [50, 150, 300, 500]
    p = InnerDirichletPartitioner(sizes, 0.5, seed=1).partition(1000, labels=LABELS)
    assert p.sizes().tolist() == sizes
    np.testing.assert_array_equal(np.sort(p.indices), np.arange(1000))
    # each client's labels are what the histogram says (independent count)
    for c in range(4):
        np.testing.assert_array_equal(np.bincount(LABELS[p.client_indices(c)], minlength=5), p.label_histogram()[c])


def test_equal_sizes_reproduce_dirichlet_per_client():
    a = InnerDirichletPartitioner([250] * 4, 0.3, seed=7).partition(1000, labels=LABELS)
    b = DirichletPartitioner(4, 0.3, seed=7, method="per_client").partition(1000, labels=LABELS)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.offsets, b.offsets)


def test_hand_case_one_class_per_client_at_tiny_alpha():
    # alpha -> 0: each client's mix is a point mass; with 2 classes of 3 samples and sizes [3, 3], whatever the
    # draws, the counts must respect availability: the two clients' class counts add up to [3, 3]
    labels = np.array([0, 0, 0, 1, 1, 1])
    p = InnerDirichletPartitioner([3, 3], 1e-3, seed=0).partition(6, labels=labels)
    h = p.label_histogram()
    assert h.sum(axis=0).tolist() == [3, 3] and h.sum(axis=1).tolist() == [3, 3]


def test_large_alpha_gives_near_uniform_class_mix():
    labels = np.repeat(np.arange(4), 2500)
    p = InnerDirichletPartitioner([2000, 3000, 5000], 1e4, seed=0).partition(10000, labels=labels)
    frac = p.label_histogram() / p.sizes()[:, None]
    assert np.abs(frac - 0.25).max() < 0.03


def test_deterministic_by_seed():
    mk = lambda s: InnerDirichletPartitioner([400, 600], 0.5, seed=s).partition(1000, labels=LABELS)
    assert np.array_equal(mk(3).indices, mk(3).indices) and not np.array_equal(mk(3).indices, mk(4).indices)


@pytest.mark.parametrize(
    "sizes, alpha, exc, match",
    [
        ([], 0.1, TypeError, "partition_sizes"),
        ([10, 0], 0.1, ValueError, "partition_sizes"),
        ([10, 2.5], 0.1, TypeError, "partition_sizes"),
        (5, 0.1, TypeError, "partition_sizes"),
        ([10], 0.0, ValueError, "alpha"),
        ([10], [1.0, -1.0], ValueError, "alpha"),
    ],
)
def test_bad_arguments(sizes, alpha, exc, match):
    with pytest.raises(exc, match=match):
        InnerDirichletPartitioner(sizes, alpha)


def test_sizes_must_sum_to_the_dataset():
    with pytest.raises(ValueError, match="`partition_sizes` sum to 999 but the dataset has 1000"):
        InnerDirichletPartitioner([499, 500], 0.5).partition(1000, labels=LABELS)
