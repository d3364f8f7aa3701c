"""Issue #16 data-side hardening: no pickle of unverified CIFAR files, Stack Overflow paths as data, bounded
decompression in every archive reader, damaged files named in errors. Every file is written in its real on-disk
format (CIFAR python pickles, IDX, TFF's SQLite layout, wheels / sdists)."""
from __future__ import annotations

import pickle
from pathlib import Path
import pytest
from lightning_fed.datamodules.partitioners.iid import IIDPartitioner
from lightning_fed.datamodules.tasks.cifar import CIFAR10DataModule, CIFAR100DataModule
from tests.datamodules.tasks.test_cifar import make_cifar10, make_cifar100


# ---------------------------------------------------------------------------------------------- item 2: CIFAR
class _Evil:
    """Unpickling this calls ``open(marker, "w")`` -- i.e. runs code chosen by the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _poison(path: Path, marker: Path) -> None:
    with open(path, "rb") as f:
        entry = pickle.load(f, encoding="latin1")
    entry["batch_label"] = _Evil(marker)
    with open(path, "wb") as f:
        pickle.dump(entry, f, protocol=2)


def test_cifar_unverified_files_are_never_unpickled(tmp_path):
    make_cifar10(tmp_path)
    marker = tmp_path / "MARKER"
    _poison(tmp_path / "cifar-10-batches-py" / "data_batch_3", marker)
    dm = CIFAR10DataModule(data_dir=tmp_path, partitioner=IIDPartitioner(num_clients=2), check_md5=False)
    with pytest.raises(ValueError, match=r"data_batch_3 is not plain CIFAR data: it asks to load io\.open"):
        dm.setup()
    assert not marker.exists()


def test_cifar100_coarse_labels_never_unpickled_either(tmp_path):
    make_cifar100(tmp_path)
    marker = tmp_path / "MARKER"
    _poison(tmp_path / "cifar-100-python" / "train", marker)
    with pytest.raises(ValueError, match="not plain CIFAR data"):
        CIFAR100DataModule(data_dir=tmp_path, partitioner=IIDPartitioner(num_clients=2), check_md5=False).setup()
    assert not marker.exists()


def test_cifar_md5_failure_does_not_advise_skipping_the_check(tmp_path):
    make_cifar10(tmp_path)  # md5s differ from torchvision's
    with pytest.raises(FileNotFoundError) as err:
        CIFAR10DataModule(data_dir=tmp_path, partitioner=IIDPartitioner(num_clients=2)).setup()
    assert "check_md5" not in str(err.value) and "not unpickled" in str(err.value)


def test_cifar_unverified_labels_out_of_range(tmp_path):
    make_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    with open(path, "rb") as f:
        entry = pickle.load(f, encoding="latin1")
    entry["labels"][2] = 10
    with open(path, "wb") as f:
        pickle.dump(entry, f, protocol=2)
    with pytest.raises(ValueError, match="label 10 of sample 2 is outside the 10 classes"):
        CIFAR10DataModule(data_dir=tmp_path, partitioner=IIDPartitioner(num_clients=2), check_md5=False).setup()
