"""Issue #16 data-side hardening: no pickle of unverified CIFAR files, Stack Overflow paths as data, bounded
decompression in every archive reader, damaged files named in errors. Every file is written in its real on-disk
format (CIFAR python pickles, IDX, TFF's SQLite layout, wheels / sdists)."""

from __future__ import annotations

from pathlib import Path
import numpy as np
import pytest
from helpers import write_idx
from lightning_fed.datamodules.partitioners.iid import IIDPartitioner
from lightning_fed.datamodules.tasks.mnist import MNISTDataModule


RAW = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


# ---------------------------------------------------------------------------------------------- item 13: IDX
def _raw_mnist(tmp_path: Path, n_train: int = 20, n_test: int = 10) -> tuple[Path, Path]:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    write_idx(raw / RAW[0], rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8))
    write_idx(raw / RAW[1], (np.arange(n_train) % 10).astype(np.uint8))
    write_idx(raw / RAW[2], rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8))
    write_idx(raw / RAW[3], (np.arange(n_test) % 10).astype(np.uint8))
    return tmp_path, raw


def _mnist(data_dir: Path) -> MNISTDataModule:
    return MNISTDataModule(data_dir=data_dir, partitioner=IIDPartitioner(num_clients=2))


def test_truncated_idx_file_is_named(tmp_path):
    data_dir, raw = _raw_mnist(tmp_path)
    path = raw / RAW[0]
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=rf"{RAW[0]} has 15,596 bytes, but its header .* needs exactly 15,696.*truncated"):
        _mnist(data_dir).load_datasets()


def test_idx_file_with_bad_magic_is_named(tmp_path):
    data_dir, raw = _raw_mnist(tmp_path)
    path = raw / RAW[3]
    data = bytearray(path.read_bytes())
    data[2] = 0x0D  # float32 type code
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{RAW[3]} is not a uint8 IDX file with 1 dimension.*00000d01"):
        _mnist(data_dir).load_datasets()


def test_idx_count_mismatch_is_named(tmp_path):
    data_dir, raw = _raw_mnist(tmp_path)
    write_idx(raw / RAW[1], np.zeros(19, dtype=np.uint8))
    with pytest.raises(ValueError, match="holds 20 images but .*train-labels-idx1-ubyte holds 19 labels"):
        _mnist(data_dir).load_datasets()


def test_idx_label_outside_the_classes_is_refused(tmp_path):
    data_dir, raw = _raw_mnist(tmp_path)
    labels = (np.arange(10) % 10).astype(np.uint8)
    labels[4] = 12
    write_idx(raw / RAW[3], labels)
    with pytest.raises(ValueError, match=rf"{RAW[3]}: label 12 at index 4 is outside the 10 classes 0..9"):
        _mnist(data_dir).load_datasets()
