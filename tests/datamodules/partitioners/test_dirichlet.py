"""DirichletPartitioner's options: per-class alpha vector, self_balancing, Flower's min_partition_size limit."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fed.datamodules import DirichletPartitioner

LABELS = np.random.default_rng(1).integers(0, 4, 400)


def reference_per_class(labels, n, class_alpha, seed, balancing=False, min_size=0, max_tries=100):
    """The documented algorithm, written out: per try, per class in sorted order, shuffle, Dir(alpha_j 1_N), cut."""
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(max_tries):
        owner = np.empty(len(labels), dtype=int)
        sizes = np.zeros(n, dtype=int)
        for j, k in enumerate(classes):
            members = rng.permutation(np.flatnonzero(labels == k))
            p = rng.dirichlet([class_alpha[j]] * n)
            if balancing:
                p = np.array([0.0 if sizes[c] > len(labels) / n else p[c] for c in range(n)])
                p = p / p.sum()
            cuts = [0] + [min(int(np.floor(x)), len(members)) for x in np.cumsum(p) * len(members)]
            cuts[-1] = len(members)
            for c in range(n):
                owner[members[cuts[c]:cuts[c + 1]]] = c
                sizes[c] += cuts[c + 1] - cuts[c]
        if sizes.min() >= min_size:
            return owner
    return None


def owners(p):
    out = np.full(p.indices.max() + 1, -1)
    for c in range(p.num_clients):
        out[p.client_indices(c)] = c
    return out


def test_per_class_alpha_vector_matches_reference():
    alpha = [0.05, 1.0, 10.0, 0.3]
    p = DirichletPartitioner(5, alpha, min_partition_size=0, seed=3).partition(len(LABELS), labels=LABELS)
    np.testing.assert_array_equal(owners(p), reference_per_class(LABELS, 5, alpha, 3))
    assert p.label_histogram().sum() == len(LABELS)


def test_scalar_alpha_equals_the_constant_vector():
    a = DirichletPartitioner(6, 0.5, seed=2).partition(len(LABELS), labels=LABELS)
    b = DirichletPartitioner(6, [0.5] * 4, seed=2).partition(len(LABELS), labels=LABELS)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.offsets, b.offsets)


def test_per_class_alpha_skews_each_class_by_its_own_alpha():
    labels = np.repeat([0, 1], 5000)
    p = DirichletPartitioner(10, [0.01, 1000.0], min_partition_size=0, seed=0).partition(10000, labels=labels)
    share = p.label_histogram() / 5000.0
    assert share[:, 0].max() > 0.8  # alpha 0.01: class 0 on (nearly) one client
    assert np.abs(share[:, 1] - 0.1).max() < 0.03  # alpha 1000: class 1 spread evenly


def test_per_client_alpha_vector_is_the_class_prior():
    # per_client with a vector: q_c ~ Dir(alpha); class 0's tiny alpha leaves it to few clients
    labels = np.repeat([0, 1, 2], 300)
    p = DirichletPartitioner(9, [1e-3, 50.0, 50.0], seed=0, method="per_client").partition(900, labels=labels)
    assert (p.sizes() == 100).all()
    # most clients take (almost) nothing of class 0 of their own choice; only exhaustion of 1 and 2 forces it
    h = p.label_histogram()
    assert h.sum(axis=0).tolist() == [300, 300, 300]


def test_self_balancing_matches_reference_and_evens_sizes():
    p = DirichletPartitioner(5, 0.2, min_partition_size=0, seed=4, self_balancing=True)
    q = p.partition(len(LABELS), labels=LABELS)
    np.testing.assert_array_equal(owners(q), reference_per_class(LABELS, 5, [0.2] * 4, 4, balancing=True))
    big = np.random.default_rng(0).integers(0, 10, 20000)
    plain = DirichletPartitioner(20, 0.3, min_partition_size=0, seed=0).partition(20000, labels=big).sizes()
    bal = DirichletPartitioner(20, 0.3, min_partition_size=0, seed=0, self_balancing=True).partition(
        20000, labels=big).sizes()
    assert bal.std() < plain.std()


def test_min_partition_size_redraws_the_whole_partition_and_max_tries_11_is_flowers_limit():
    # seed 0: the first draw leaves a client below 20 samples, a later one (within Flower's 11) does not
    assert reference_per_class(LABELS, 8, [0.5] * 4, 0, min_size=20, max_tries=1) is None
    ref = reference_per_class(LABELS, 8, [0.5] * 4, 0, min_size=20, max_tries=11)
    assert ref is not None
    p = DirichletPartitioner(8, 0.5, min_partition_size=20, max_tries=11, seed=0).partition(len(LABELS), labels=LABELS)
    np.testing.assert_array_equal(owners(p), ref)
    assert p.sizes().min() >= 20
    with pytest.raises(ValueError, match="no Dirichlet draw"):
        DirichletPartitioner(8, 0.5, min_partition_size=20, max_tries=1, seed=0).partition(len(LABELS), labels=LABELS)
    with pytest.raises(ValueError, match="max_tries`=1"):
        DirichletPartitioner(40, 0.01, min_partition_size=9, max_tries=1).partition(len(LABELS), labels=LABELS)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(alpha=[0.1, -1.0]), ValueError, "alpha"),
        (dict(alpha=[0.1, float("nan")]), ValueError, "alpha"),
        (dict(alpha=[]), TypeError, "alpha"),
        (dict(alpha="0.1"), TypeError, "alpha"),
        (dict(alpha=[[0.1]]), TypeError, "alpha"),
        (dict(alpha=0.1, self_balancing=1), TypeError, "self_balancing"),
        (dict(alpha=0.1, self_balancing=True, method="per_client"), ValueError, "self_balancing"),
    ],
)
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        DirichletPartitioner(4, **kwargs)


def test_alpha_vector_of_the_wrong_length():
    with pytest.raises(ValueError, match="per-class `alpha` has 3 entries but the labels hold 4 classes"):
        DirichletPartitioner(4, [1.0, 1.0, 1.0], min_partition_size=0).partition(len(LABELS), labels=LABELS)
