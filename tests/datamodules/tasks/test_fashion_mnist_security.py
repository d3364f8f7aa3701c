"""Issue #16 data-side hardening: no pickle of unverified CIFAR files, Stack Overflow paths as data, bounded
decompression in every archive reader, damaged files named in errors. Every file is written in its real on-disk
format (CIFAR python pickles, IDX, TFF's SQLite layout, wheels / sdists)."""

from __future__ import annotations

import gzip
import struct
import numpy as np
import pytest
from helpers import write_idx
from lightning_fed.datamodules.partitioners.iid import IIDPartitioner
from lightning_fed.datamodules.tasks.fashion_mnist import FashionMNISTDataModule


def test_debian_idx_gzip_bomb_is_refused(tmp_path):
    debian = tmp_path / "debian"
    debian.mkdir()
    rng = np.random.default_rng(0)
    write_idx(debian / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (10, 28, 28), dtype=np.uint8), True)
    write_idx(debian / "t10k-labels-idx1-ubyte.gz", np.arange(10, dtype=np.uint8), True)
    write_idx(debian / "train-labels-idx1-ubyte.gz", np.arange(10, dtype=np.uint8), True)
    with gzip.open(debian / "train-images-idx3-ubyte.gz", "wb", compresslevel=1) as f:
        f.write(struct.pack(">IIII", 2051, 100_000, 28, 28))
        for _ in range(5):
            f.write(b"\0" * (16 << 20))  # 80 MiB > the 64 MiB limit
    dm = FashionMNISTDataModule(data_dir=tmp_path / "data", debian_dir=debian,
                                partitioner=IIDPartitioner(num_clients=2))
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz inflates to more than 67,108,864"):
        dm.prepare_data()
    assert not (dm.raw_folder / "train-images-idx3-ubyte").exists()
    assert [p.name for p in dm.raw_folder.iterdir() if p.name.startswith(".")] == []  # no temporary file left
