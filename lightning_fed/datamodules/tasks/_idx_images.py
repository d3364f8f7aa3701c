"""Shared loader for the torchvision IDX image data sets (MNIST, Fashion-MNIST): raw files -> in-memory tensors.

A subclass of :class:`IDXImageDataModule` names the torchvision class (``MNIST`` / ``FashionMNIST``), the
normalisation statistics, the dataset class to build and the hints of its error messages; everything else
(raw-layout check, optional Debian ``*.gz`` copy, ``download=True`` through torchvision, reading with
torchvision's own IDX reader, normalisation) lives here once.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path
from typing import Any, ClassVar, Optional

import numpy as np
import torch
from torch.utils.data import TensorDataset

from lightning_fed.atomic_io import atomic_write
from lightning_fed.datamodules.federated import FederatedDataModule, refuse_options
from lightning_fed.datamodules.partition import Partitioner
from lightning_fed.datamodules.tasks.pip_archive import copy_bounded
from lightning_fed.errors import DataNotFoundError

__all__ = ["IDXImageDataModule", "IDXImageTensorDataset", "raw_file_names", "check_idx_file", "IDXFormatError"]


class IDXFormatError(ValueError):
    """An IDX file is damaged or not what the data set needs (the message names the file and the problem).

    Example: a file cut short inside its data::

        >>> import struct, tempfile
        >>> from pathlib import Path
        >>> path = Path(tempfile.mkdtemp()) / "labels-idx1-ubyte"
        >>> _ = path.write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 5) + bytes([3, 1, 4]))  # 3 of 5 labels
        >>> check_idx_file(path, ndim=1)
        Traceback (most recent call last):
        ...
        lightning_fed.datamodules.tasks._idx_images.IDXFormatError: .../labels-idx1-ubyte has 11 bytes, but its header (sizes (5,)) needs exactly 13: the file is truncated. Delete it and get it again.
    """


def check_idx_file(path: str | os.PathLike, ndim: int, inner_shape: tuple[int, ...] = ()) -> int:
    """Check the header and size of the uint8 IDX file ``path`` (LeCun's format: 2 zero bytes, type code
    ``0x08`` = uint8, ``ndim``, then ``ndim`` big-endian uint32 sizes, then the data) and return its first size
    (the number of images / labels).

    Raises:
        IDXFormatError: the magic number, the number of dimensions, the inner sizes (``inner_shape``, e.g.
            ``(28, 28)``) or the file size (header + product of the sizes) is not what it must be; the message names
            the file and what is wrong.

    Example: 2 images of 28x28 (header 4 + 3·4 bytes, then 2·784 pixels)::

        >>> import struct, tempfile
        >>> from pathlib import Path
        >>> path = Path(tempfile.mkdtemp()) / "images-idx3-ubyte"
        >>> _ = path.write_bytes(bytes([0, 0, 8, 3]) + struct.pack(">3I", 2, 28, 28) + bytes(2 * 28 * 28))
        >>> check_idx_file(path, ndim=3, inner_shape=(28, 28))
        2
    """
    path = Path(path)
    header_len = 4 + 4 * ndim
    with open(path, "rb") as fh:
        header = fh.read(header_len)
    if len(header) < 4 or header[:2] != b"\x00\x00" or header[2] != 0x08 or header[3] != ndim:
        raise IDXFormatError(
            f"{path} is not a uint8 IDX file with {ndim} dimension(s): its magic number is {header[:4].hex() or 'empty'}"
            f", expected 000008{ndim:02x}. The file is damaged; delete it and get it again."
        )
    if len(header) < header_len:
        raise IDXFormatError(f"{path} is truncated inside its {header_len}-byte header. Delete it and get it again.")
    dims = struct.unpack(f">{ndim}I", header[4:])
    if tuple(dims[1:]) != tuple(inner_shape):
        raise IDXFormatError(f"{path} holds items of shape {tuple(dims[1:])}, expected {tuple(inner_shape)}.")
    expected = header_len + int(np.prod(np.asarray(dims, dtype=np.int64)))
    actual = path.stat().st_size
    if actual != expected:
        raise IDXFormatError(
            f"{path} has {actual:,} bytes, but its header (sizes {tuple(dims)}) needs exactly {expected:,}: the file "
            f"is {'truncated' if actual < expected else 'followed by extra bytes'}. Delete it and get it again."
        )
    return int(dims[0])


def raw_file_names(torchvision_class: str) -> list[str]:
    """The decompressed file names ``torchvision.datasets.<torchvision_class>._check_exists`` requires
    (its ``resources`` file names minus ``.gz``)."""
    import torchvision.datasets

    cls = getattr(torchvision.datasets, torchvision_class)
    return [os.path.splitext(os.path.basename(url))[0] for url, _ in cls.resources]


class IDXImageTensorDataset(TensorDataset):
    """In-memory ``(image, label)`` dataset with a torchvision-style ``targets`` attribute.

    Args:
        images: float tensor ``[N, 1, 28, 28]`` (already normalised).
        targets: LongTensor ``[N]`` of class indices.
        classes: class names (index -> name), as the torchvision data set's ``classes``.

    ``dataset[i]`` returns ``(images[i], targets[i])`` -- a ``[1, 28, 28]`` float tensor and a
    0-d LongTensor; a DataLoader batch is ``([B, 1, 28, 28], [B])``.

    Raises:
        TypeError: ``targets`` not int64.

    Example::

        >>> import torch
        >>> ds = IDXImageTensorDataset(torch.zeros(3, 1, 28, 28), torch.tensor([7, 2, 1]), classes=[str(d) for d in range(10)])
        >>> len(ds), ds[1][0].shape, ds[1][1], ds.targets
        (3, torch.Size([1, 28, 28]), tensor(2), tensor([7, 2, 1]))
    """

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, classes: list[str] | None = None):
        if targets.dtype != torch.long:
            raise TypeError(f"targets must be a LongTensor, got {targets.dtype}")
        super().__init__(images, targets)
        self.data = images
        self.targets = targets
        self.classes = list(classes) if classes is not None else []


class IDXImageDataModule(FederatedDataModule):
    """Base of the MNIST-family data modules (not used directly; see the subclasses for arguments).

    Subclasses set the class attributes below and pass ``debian_dir`` (``None`` where no Debian package
    ships the data).

    Example (through :class:`~lightning_fed.datamodules.tasks.mnist.MNISTDataModule`): the partitioner is required::

        >>> from lightning_fed.datamodules.tasks.mnist import MNISTDataModule
        >>> MNISTDataModule(partitioner=None)
        Traceback (most recent call last):
        ...
        ValueError: MNISTDataModule needs a partitioner, e.g. PathologicalPartitioner(num_clients=50, classes_per_client=1) (Fed-LAMB non-iid) or IIDPartitioner(num_clients=50)
    """

    #: ``torchvision.datasets`` class name; also the folder under ``data_dir`` (``{data_dir}/{name}/raw``).
    torchvision_class: ClassVar[str]
    #: Human-readable data set name for messages.
    display_name: ClassVar[str]
    #: Train-set pixel mean / std after scaling to [0, 1].
    pixel_mean: ClassVar[float]
    pixel_std: ClassVar[float]
    #: Dataset class that :meth:`load_datasets` builds.
    dataset_class: ClassVar[type[IDXImageTensorDataset]] = IDXImageTensorDataset
    #: Whether the data module has a ``debian_dir`` source (changes the missing-data message).
    supports_debian: ClassVar[bool] = False
    #: Example partitioners for the "partitioner is required" message.
    partitioner_hint: ClassVar[str] = "IIDPartitioner(num_clients=100)"
    #: How to get the data, appended to the missing-data message.
    install_hint: ClassVar[str] = "Pass download=True to let torchvision download it (needs internet)."
    #: Largest decompressed IDX file accepted from a ``*.gz`` (64 MiB; MNIST's and Fashion-MNIST's largest,
    #: ``train-images-idx3-ubyte``, has 47,040,016 bytes). Past it the copy stops with
    #: :class:`~lightning_fed.datamodules.tasks.pip_archive.ArchiveTooLargeError` (a gzip bomb).
    max_idx_bytes: ClassVar[int] = 64 << 20

    def __init__(
        self,
        data_dir: str | os.PathLike,
        partitioner: Optional[Partitioner],
        debian_dir: str | os.PathLike | None,
        download: bool,
        normalize: bool,
        val_from_test: bool,
        clients_per_round: int,
        batch_size: int,
        local_epochs: int,
        **kwargs: Any,
    ) -> None:
        if partitioner is None:
            raise ValueError(f"{type(self).__name__} needs a partitioner, e.g. {self.partitioner_hint}")
        refuse_options(type(self).__name__, kwargs, train_dataset="it loads its own data",
                       val_dataset="it loads its own data", test_dataset="it loads its own data")
        super().__init__(
            partitioner=partitioner,
            clients_per_round=clients_per_round,
            batch_size=batch_size,
            local_epochs=local_epochs,
            **kwargs,
        )
        self.data_dir = str(data_dir)
        self.debian_dir = None if debian_dir is None else str(debian_dir)
        self.download = bool(download)
        self.normalize = bool(normalize)
        self.val_from_test = bool(val_from_test)

    # ------------------------------------------------------------------ files
    @property
    def raw_folder(self) -> Path:
        """``{data_dir}/{torchvision_class}/raw`` -- torchvision's ``raw_folder``."""
        return Path(self.data_dir) / self.torchvision_class / "raw"

    def _raw_present(self) -> bool:
        return all((self.raw_folder / name).is_file() for name in raw_file_names(self.torchvision_class))

    def _debian_present(self) -> bool:
        if not self.debian_dir:
            return False
        names = raw_file_names(self.torchvision_class)
        return all((Path(self.debian_dir) / f"{name}.gz").is_file() for name in names)

    def _torchvision_dataset(self, train: bool, download: bool):
        import torchvision.datasets

        return getattr(torchvision.datasets, self.torchvision_class)(self.data_dir, train=train, download=download)

    def prepare_data(self) -> None:
        """Make sure torchvision's raw files exist (Debian copy > download > clear error).

        Idempotent; writes each file atomically (temporary name + ``os.replace``).

        Raises:
            ArchiveTooLargeError: a Debian ``*.gz`` inflates past :attr:`max_idx_bytes` (nothing is left behind).
            FileNotFoundError: no source of the data.
        """
        if self._raw_present():
            return
        if self._debian_present():
            self.raw_folder.mkdir(parents=True, exist_ok=True)
            for name in raw_file_names(self.torchvision_class):
                dst = self.raw_folder / name
                if dst.is_file():
                    continue
                src = Path(self.debian_dir) / f"{name}.gz"
                with gzip.open(src, "rb") as fin, atomic_write(dst) as fout:
                    copy_bounded(fin, fout, f"{src}", self.max_idx_bytes)
            return
        if self.download:
            self._torchvision_dataset(train=True, download=True)
            self._torchvision_dataset(train=False, download=True)
            return
        missing = [n for n in raw_file_names(self.torchvision_class) if not (self.raw_folder / n).is_file()]
        debian = (
            f", and debian_dir={self.debian_dir!r} does not hold the four *-ubyte.gz files"
            if self.supports_debian
            else ""
        )
        raise DataNotFoundError(
            f"{self.display_name} not found: {self.raw_folder} lacks {missing}{debian}. {self.install_hint}"
        )

    # ------------------------------------------------------------------ datasets
    def _check_raw_split(self, train: bool) -> None:
        """Check the split's two raw IDX files (headers, sizes, matching counts) before torchvision reads them."""
        prefix = "train" if train else "t10k"
        names = [n for n in raw_file_names(self.torchvision_class) if n.startswith(prefix)]
        images = self.raw_folder / next(n for n in names if "images" in n)
        labels = self.raw_folder / next(n for n in names if "labels" in n)
        n_images = check_idx_file(images, 3, (28, 28))
        n_labels = check_idx_file(labels, 1)
        if n_images != n_labels:
            raise IDXFormatError(f"{images} holds {n_images:,} images but {labels} holds {n_labels:,} labels.")

    def _load_split(self, train: bool) -> IDXImageTensorDataset:
        self._check_raw_split(train)
        ds = self._torchvision_dataset(train=train, download=False)
        targets = ds.targets.to(torch.long)
        num_classes = len(ds.classes)
        bad = torch.nonzero((targets < 0) | (targets >= num_classes)).flatten()
        if bad.numel():
            prefix = "train" if train else "t10k"
            labels = self.raw_folder / next(n for n in raw_file_names(self.torchvision_class)
                                            if n.startswith(prefix) and "labels" in n)
            i = int(bad[0])
            raise IDXFormatError(
                f"{labels}: label {int(targets[i])} at index {i} is outside the {num_classes} classes "
                f"0..{num_classes - 1} ({bad.numel():,} such labels). The file is damaged; delete it and get it again."
            )
        images = ds.data.unsqueeze(1).to(torch.float32).div_(255.0)  # [N, 1, 28, 28] in [0, 1]
        if self.normalize:
            images.sub_(self.pixel_mean).div_(self.pixel_std)
        return self.dataset_class(images, targets, classes=ds.classes)

    def load_datasets(self):
        """``(train, val, test)`` in-memory datasets; val is the test set if ``val_from_test``."""
        if not self._raw_present():
            self.prepare_data()  # e.g. setup() called without a Trainer; raises if unavailable
        train = self._load_split(train=True)
        test = self._load_split(train=False)
        return train, (test if self.val_from_test else None), test
