"""Text / object labels are encoded once (sorted), with the mapping kept in Partition.label_names."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule, IIDPartitioner, ShardPartitioner

NAMES = np.array(["cat", "dog", "ant", "dog", "cat", "ant", "dog", "bee"])


def test_string_labels_encoded_sorted_and_partition_equals_the_integer_one():
    codes = np.array([2, 3, 0, 3, 2, 0, 3, 1])  # ant=0, bee=1, cat=2, dog=3
    a = ShardPartitioner(2, 2, seed=1).partition(8, labels=NAMES)
    b = ShardPartitioner(2, 2, seed=1).partition(8, labels=codes)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.offsets, b.offsets)
    assert a.label_names.tolist() == ["ant", "bee", "cat", "dog"] and a.num_classes == 4
    np.testing.assert_array_equal(a.labels, codes)
    assert a.label_names[a.labels].tolist() == NAMES.tolist()
    assert b.label_names is None


def test_object_and_bytes_labels():
    obj = np.array(["x", "y", "x"], dtype=object)
    assert IIDPartitioner(1).partition(3, labels=obj).label_names.tolist() == ["x", "y"]
    assert IIDPartitioner(1).partition(3, labels=[b"b", b"a", b"b"]).labels.tolist() == [1, 0, 1]


def test_bad_text_labels():
    with pytest.raises(TypeError, match="mix kinds"):
        IIDPartitioner(1).partition(3, labels=np.array(["x", 1, "y"], dtype=object))
    with pytest.raises(ValueError, match="None at sample 1"):
        IIDPartitioner(1).partition(3, labels=np.array(["x", None, "y"], dtype=object))
    with pytest.raises(TypeError, match="labels"):  # floats stay refused
        IIDPartitioner(1).partition(2, labels=np.array([0.5, 1.0]))


def test_datamodule_reads_string_labels():
    ds = TensorDataset(torch.arange(40, dtype=torch.float32).unsqueeze(1))
    labels = np.array(["spam", "ham"] * 20)
    dm = FederatedDataModule(ds, partitioner=DirichletPartitioner(2, 1.0, min_partition_size=1), labels=labels,
                             clients_per_round=1)
    dm.setup()
    assert dm.partition.label_names.tolist() == ["ham", "spam"]
    assert dm.partition.label_histogram().sum(axis=0).tolist() == [20, 20]
