"""Tests of the Partition container and the client partitioners (pure numpy)."""
from __future__ import annotations

import numpy as np
import pytest
from lightning_fed.datamodules.partition import Partition, Partitioner
from lightning_fed.datamodules.partitioners.dirichlet import DirichletPartitioner
from lightning_fed.datamodules.partitioners.iid import IIDPartitioner
from lightning_fed.datamodules.partitioners.natural_id import NaturalIdPartitioner
from lightning_fed.datamodules.partitioners.pathological import PathologicalPartitioner
from lightning_fed.datamodules.partitioners.shard import ShardPartitioner
from helpers import assert_disjoint_cover, balanced_labels, same


LABELS = balanced_labels()  # 10 classes x 1000 samples


RANDOM_SCHEMES = [
    pytest.param(lambda seed: IIDPartitioner(37, seed=seed), id="iid"),
    pytest.param(lambda seed: ShardPartitioner(100, 2, seed=seed), id="shard"),
    pytest.param(lambda seed: PathologicalPartitioner(30, 2, seed=seed), id="pathological"),
    pytest.param(lambda seed: DirichletPartitioner(50, 0.5, seed=seed), id="dirichlet"),
]


# ----------------------------------------------------------------------------------- all schemes
@pytest.mark.parametrize("make", RANDOM_SCHEMES)
def test_disjoint_cover_and_seed_determinism(make):
    p = make(0).partition(len(LABELS), labels=LABELS)
    assert_disjoint_cover(p, len(LABELS))
    assert same(p, make(0).partition(len(LABELS), labels=LABELS))
    assert not same(p, make(1).partition(len(LABELS), labels=LABELS))


def test_partitioner_is_abstract_and_declares_requirements():
    with pytest.raises(TypeError):
        Partitioner()  # type: ignore[abstract]
    assert IIDPartitioner.requires == "none"
    assert ShardPartitioner.requires == "labels"
    assert PathologicalPartitioner.requires == "labels"
    assert DirichletPartitioner.requires == "labels"
    assert NaturalIdPartitioner.requires == "ids"


# ----------------------------------------------------------------------------------- Pathological
@pytest.mark.parametrize(("num_clients", "k"), [(10, 1), (50, 1), (30, 2), (7, 3), (4, 10)])
def test_pathological_exact_classes_per_client(num_clients, k):
    p = PathologicalPartitioner(num_clients, k, seed=2).partition(len(LABELS), labels=LABELS)
    assert_disjoint_cover(p, len(LABELS))
    for c in range(num_clients):
        assert len(np.unique(LABELS[p.client_indices(c)])) == k
    # balanced: each class is held by floor or ceil(N*k/C) clients, and split evenly among them
    hist = p.stats()["label_histogram"]
    holders = (hist > 0).sum(axis=0)
    assert holders.min() >= (num_clients * k) // 10 and holders.max() <= -(-num_clients * k // 10)
    for j in range(10):
        nz = hist[:, j][hist[:, j] > 0]
        assert nz.max() - nz.min() <= 1


def test_pathological_errors():
    with pytest.raises(ValueError, match=r"classes_per_client.*11.*10 classes"):
        PathologicalPartitioner(20, 11).partition(len(LABELS), labels=LABELS)
    with pytest.raises(ValueError, match="num_clients.*classes_per_client"):
        PathologicalPartitioner(4, 2).partition(len(LABELS), labels=LABELS)  # 8 slots < 10 classes
    tiny = np.array([0, 0, 0, 1, 1, 1, 2])  # class 2 has one sample
    with pytest.raises(ValueError, match="class 2 has 1 samples"):
        PathologicalPartitioner(6, 1).partition(len(tiny), labels=tiny)
    with pytest.raises(ValueError, match="classes_per_client"):
        PathologicalPartitioner(10, 0)


# ----------------------------------------------------------------------------------- Dirichlet
def mean_max_class_fraction(p: Partition) -> float:
    hist = p.label_histogram().astype(float)
    return float((hist.max(axis=1) / hist.sum(axis=1)).mean())


def test_dirichlet_skew_falls_with_alpha():
    skews = [
        mean_max_class_fraction(DirichletPartitioner(20, a, seed=0).partition(len(LABELS), labels=LABELS))
        for a in (0.1, 1.0, 100.0)
    ]
    assert skews[0] > skews[1] > skews[2]
    assert skews[0] > 0.5 and skews[2] < 0.2  # near one class vs near uniform (0.1)


def test_dirichlet_min_partition_size_and_label_counts():
    p = DirichletPartitioner(100, 0.3, min_partition_size=20, seed=5).partition(len(LABELS), labels=LABELS)
    assert_disjoint_cover(p, len(LABELS))
    assert p.sizes().min() >= 20
    np.testing.assert_array_equal(p.label_histogram().sum(axis=0), np.full(10, 1000))


def test_dirichlet_impossible_requests():
    with pytest.raises(ValueError, match="min_partition_size"):
        DirichletPartitioner(100, 0.5, min_partition_size=200).partition(len(LABELS), labels=LABELS)
    # feasible in principle, but alpha=0.001 puts each class on ~1 client: 100 clients cannot all get 10
    with pytest.raises(ValueError, match=r"max_tries.*min_partition_size.*alpha.*num_clients"):
        DirichletPartitioner(100, 0.001, min_partition_size=10, max_tries=3).partition(len(LABELS), labels=LABELS)


def test_dirichlet_per_client_balanced_reddi_setting():
    # Reddi et al. 2021 CIFAR-10 shape: 500 clients x 100 samples, alpha 0.1 (per-class form cannot meet min 10)
    labels = balanced_labels(10, 5000, seed=1)
    make = lambda seed: DirichletPartitioner(500, 0.1, seed=seed, method="per_client")  # noqa: E731
    p = make(0).partition(len(labels), labels=labels)
    assert_disjoint_cover(p, len(labels))
    np.testing.assert_array_equal(p.sizes(), np.full(500, 100))
    np.testing.assert_array_equal(p.label_histogram().sum(axis=0), np.full(10, 5000))
    assert same(p, make(0).partition(len(labels), labels=labels))
    assert not same(p, make(1).partition(len(labels), labels=labels))
    skew = mean_max_class_fraction(p)
    flat = DirichletPartitioner(500, 100.0, method="per_client").partition(len(labels), labels=labels)
    iidish = mean_max_class_fraction(flat)
    assert skew > 0.5 > 0.2 > iidish
    with pytest.raises(ValueError, match="max_tries.*method='per_client'"):
        DirichletPartitioner(500, 0.1).partition(len(labels), labels=labels)


def test_dirichlet_per_client_uneven_remainder():
    labels = np.random.default_rng(2).integers(0, 7, 1003)
    p = DirichletPartitioner(10, 0.05, method="per_client").partition(1003, labels=labels)
    assert_disjoint_cover(p, 1003)
    assert sorted(p.sizes().tolist()) == [100] * 7 + [101] * 3
    with pytest.raises(ValueError, match="method"):
        DirichletPartitioner(10, 0.1, method="per_sample")


@pytest.mark.parametrize("alpha", [0, -1.0, float("nan"), float("inf")])
def test_dirichlet_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        DirichletPartitioner(10, alpha)


def test_dirichlet_bad_alpha_type():
    with pytest.raises(TypeError, match="alpha"):
        DirichletPartitioner(10, "0.1")


# ----------------------------------------------------------------------------------- argument checks
@pytest.mark.parametrize(
    ("make", "exc", "match"),
    [
        (lambda: IIDPartitioner(0), ValueError, r"num_clients.*>= 1.*0"),
        (lambda: IIDPartitioner(2.5), TypeError, r"num_clients.*2\.5"),
        (lambda: IIDPartitioner(True), TypeError, "num_clients"),
        (lambda: IIDPartitioner(3, seed=-1), ValueError, "seed"),
        (lambda: ShardPartitioner(0), ValueError, "num_clients"),
        (lambda: ShardPartitioner(10, shards_per_client=0), ValueError, "shards_per_client"),
        (lambda: PathologicalPartitioner("10", 1), TypeError, "num_clients"),
        (lambda: DirichletPartitioner(0, 0.1), ValueError, "num_clients"),
        (lambda: DirichletPartitioner(10, 0.1, min_partition_size=-1), ValueError, "min_partition_size"),
        (lambda: DirichletPartitioner(10, 0.1, max_tries=0), ValueError, "max_tries"),
    ],
)
def test_bad_constructor_arguments(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_label_validation():
    with pytest.raises(TypeError, match="labels"):
        ShardPartitioner(2).partition(4, labels=np.array([0.0, 1.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="requires `labels`"):
        ShardPartitioner(2).partition(4)
    with pytest.raises(ValueError, match="labels.*num_samples=5"):
        DirichletPartitioner(2, 1.0, min_partition_size=0).partition(5, labels=np.zeros(4, dtype=int))
    with pytest.raises(ValueError, match="labels.*non-negative"):
        PathologicalPartitioner(2, 1).partition(4, labels=np.array([0, -1, 0, 1]))
    with pytest.raises(ValueError, match="num_samples"):
        IIDPartitioner(2).partition(0)


# ----------------------------------------------------------------------------------- Partition
def test_partition_stats_match_independent_count():
    p = DirichletPartitioner(25, 0.5, seed=3).partition(len(LABELS), labels=LABELS)
    s = p.stats()
    expected_sizes = np.array([len(p.client_indices(c)) for c in range(25)])
    expected_hist = np.zeros((25, 10), dtype=np.int64)
    for c in range(25):
        for i in p.client_indices(c):
            expected_hist[c, LABELS[i]] += 1
    assert s["num_clients"] == 25 and s["num_samples"] == len(LABELS)
    np.testing.assert_array_equal(s["sizes"], expected_sizes)
    assert s["size_min"] == expected_sizes.min() and s["size_max"] == expected_sizes.max()
    assert s["size_mean"] == pytest.approx(expected_sizes.mean())
    assert s["size_median"] == pytest.approx(np.median(expected_sizes))
    assert s["label_histogram"].dtype == np.int64
    np.testing.assert_array_equal(s["label_histogram"], expected_hist)
    assert "label_histogram" not in IIDPartitioner(3).partition(10).stats()


def test_heatmap_shape_dtype_and_content():
    p = Partition.from_client_lists([[0, 1], [2], [], [3, 4, 5]], labels=np.array([0, 0, 2, 1, 1, 2]))
    img = p.heatmap()
    assert img.dtype == np.uint8 and img.shape == (3, 4 * 8, 3 * 8)
    # client 0 is all class 0: that cell is the "1.0" colour, its class-1 cell the "0.0" colour
    assert not np.array_equal(img[:, 0, 0], img[:, 0, 8])
    np.testing.assert_array_equal(img[:, 2 * 8, 0], img[:, 0, 8])  # empty client = 0.0 colour
    assert p.heatmap(max_clients=2).shape == (3, 16, 24)
    big = Partition.from_client_lists([[i] for i in range(500)], labels=np.arange(500) % 300)
    h = big.heatmap(max_clients=400)
    assert h.shape[1] <= 2048 and h.shape[2] <= 2048 and h.shape[1] == 400 * (h.shape[2] // 300)
    with pytest.raises(ValueError, match="labels"):
        IIDPartitioner(2).partition(4).heatmap()


def test_partition_access_and_validation():
    p = Partition.from_client_lists([[3, 1], [0], [2]], client_names=["a", "b", "c"])
    assert p.num_clients == 3 and p.sizes().tolist() == [2, 1, 1]
    assert p.client_indices(0).tolist() == [3, 1]
    with pytest.raises(IndexError, match=r"cid.*5.*0\.\.2"):
        p.client_indices(5)
    with pytest.raises(IndexError, match="cid"):
        p.client_indices(-1)
    with pytest.raises(ValueError, match="offsets"):
        Partition(np.arange(3), np.array([0, 2]))
    with pytest.raises(ValueError, match="client_names"):
        Partition.from_client_lists([[0], [1]], client_names=["a"])
    q = Partition.from_assignment(np.array([1, -1, 0, 1]), 3)
    assert [q.client_indices(c).tolist() for c in range(3)] == [[2], [0, 3], []]
