"""Shared loader for the torchvision IDX image data sets (MNIST, Fashion-MNIST): raw files -> in-memory tensors.

A subclass of :class:`IDXImageDataModule` names the torchvision class (``MNIST`` / ``FashionMNIST``), the
normalisation statistics, the dataset class to build and the hints of its error messages; everything else
(raw-layout check, optional Debian ``*.gz`` copy, ``download=True`` through torchvision, reading with
torchvision's own IDX reader, normalisation) lives here once.
"""

from __future__ import annotations

import gzip
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, ClassVar, Optional

import torch
from torch.utils.data import TensorDataset

from lightning_fed.datamodules.federated import FederatedDataModule
from lightning_fed.datamodules.partition import Partitioner

__all__ = ["IDXImageDataModule", "IDXImageTensorDataset", "raw_file_names"]


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
        """
        if self._raw_present():
            return
        if self._debian_present():
            self.raw_folder.mkdir(parents=True, exist_ok=True)
            for name in raw_file_names(self.torchvision_class):
                dst = self.raw_folder / name
                if dst.is_file():
                    continue
                tmp = dst.with_name(f".{name}.{uuid.uuid4().hex}.tmp")
                try:
                    with gzip.open(Path(self.debian_dir) / f"{name}.gz", "rb") as fin, open(tmp, "wb") as fout:
                        shutil.copyfileobj(fin, fout, length=1 << 20)
                    os.replace(tmp, dst)
                finally:
                    if tmp.exists():
                        tmp.unlink()
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
        raise FileNotFoundError(
            f"{self.display_name} not found: {self.raw_folder} lacks {missing}{debian}. {self.install_hint}"
        )

    # ------------------------------------------------------------------ datasets
    def _load_split(self, train: bool) -> IDXImageTensorDataset:
        ds = self._torchvision_dataset(train=train, download=False)
        images = ds.data.unsqueeze(1).to(torch.float32).div_(255.0)  # [N, 1, 28, 28] in [0, 1]
        if self.normalize:
            images.sub_(self.pixel_mean).div_(self.pixel_std)
        return self.dataset_class(images, ds.targets.to(torch.long), classes=ds.classes)

    def load_datasets(self):
        """``(train, val, test)`` in-memory datasets; val is the test set if ``val_from_test``."""
        if not self._raw_present():
            self.prepare_data()  # e.g. setup() called without a Trainer; raises if unavailable
        train = self._load_split(train=True)
        test = self._load_split(train=False)
        return train, (test if self.val_from_test else None), test
