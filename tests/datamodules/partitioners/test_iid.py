"""Tests of the Partition container and the client partitioners (pure numpy)."""

from __future__ import annotations

import numpy as np
import pytest
from lightning_fed.datamodules.partitioners.iid import IIDPartitioner
from helpers import assert_disjoint_cover


# ----------------------------------------------------------------------------------- IID
def test_iid_sizes_differ_by_at_most_one():
    p = IIDPartitioner(7, seed=3).partition(100)
    sizes = p.sizes()
    assert sizes.sum() == 100 and sizes.max() - sizes.min() <= 1
    assert sorted(sizes.tolist()) == [14] * 5 + [15] * 2
    assert p.labels is None and p.num_classes is None
    assert_disjoint_cover(p, 100)


def test_iid_more_clients_than_samples():
    with pytest.raises(ValueError, match="more clients than samples"):
        IIDPartitioner(11).partition(10)


def test_iid_attaches_optional_labels_for_stats():
    labels = np.arange(20) % 4
    p = IIDPartitioner(5).partition(20, labels=labels)
    assert p.num_classes == 4
    assert p.stats()["label_histogram"].sum() == 20
