"""CIFAR-10 / CIFAR-100 (Krizhevsky, 2009) as federated data modules, the image tasks of Reddi et al. 2021.

Data: torchvision's python-pickle layout, ``{data_dir}/cifar-10-batches-py/`` (``data_batch_1`` ..
``data_batch_5``, ``test_batch``, ``batches.meta``) or ``{data_dir}/cifar-100-python/`` (``train``,
``test``, ``meta``). With ``download=True`` torchvision downloads and extracts them (needs internet);
otherwise a :class:`FileNotFoundError` explains how to get them. Reading is done by torchvision's own
``CIFAR10`` / ``CIFAR100`` reader (which checks every file's md5; ``check_md5=False`` only checks that
the files exist, e.g. for re-packed or test files). CIFAR-100's coarse labels, which torchvision does
not expose, are read from the same pickle files (key ``coarse_labels``).

Images stay in memory as uint8 ``[N, 3, 32, 32]`` (150 MB for CIFAR's 50,000 training images) in a
:class:`CIFARTensorDataset`, which preprocesses a whole batch at once with torch ops in
``get_batch(index)`` -- so :class:`~lightning_fed.datamodules.federated.TensorBatches` slices it
directly. The preprocessing is Reddi et al. 2021, App. C (as in TFF's CIFAR tasks):

* training: a random ``24 x 24`` crop and a random horizontal flip (each with probability 1/2), per
  image, then per-channel normalisation with the training-set mean / std;
* evaluation: the central ``24 x 24`` crop, then the same normalisation.

The augmentation draws from torch's *global* RNG. In federated training the loop seeds it with the
client's seed (``torch.manual_seed(client_seed(seed, round, cid))``) before a client's local work, so
augmentations are a pure function of ``(seed, round, client)`` and runs repeat exactly.

Default partitions (Reddi et al. 2021, Sec. 5 / App. C; 500 clients x 100 training images):
CIFAR-10: ``DirichletPartitioner(num_clients=500, alpha=0.1, method="per_client")`` (Hsu et al. 2019);
CIFAR-100: ``PachinkoPartitioner(500, 100, alpha=0.1, beta=10)`` over the 20 coarse / 100 fine labels.
Table-1 settings: 10 clients per round, batch size 20, 1 local epoch.
"""

from __future__ import annotations

import numbers
import os
import pickle
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from lightning_fed.datamodules.dirichlet import DirichletPartitioner
from lightning_fed.datamodules.federated import FederatedDataModule
from lightning_fed.datamodules.pachinko import PachinkoPartitioner
from lightning_fed.datamodules.partition import Partitioner

__all__ = [
    "CIFAR10DataModule",
    "CIFAR100DataModule",
    "CIFARTensorDataset",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
]

#: Per-channel (R, G, B) training-set mean / std of the pixels scaled to [0, 1].
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


class CIFARTensorDataset(Dataset):
    """In-memory CIFAR split that crops / flips / normalises whole batches with torch ops.

    Args:
        images: uint8 ``[N, 3, 32, 32]`` (CHW).
        targets: LongTensor ``[N]`` of class (fine) labels.
        mean, std: per-channel normalisation of the [0, 1] pixels (3 floats each).
        crop_size: side of the square crop (``1 .. 32``; default 24); 32 keeps the full image.
        augment: ``True``: random crop + random horizontal flip (training); ``False``: center crop.
        classes: class names (index -> name).
        coarse_targets: LongTensor ``[N]`` of coarse labels (CIFAR-100) or ``None``.

    ``get_batch(index)`` with a LongTensor ``index [B]`` returns ``(x [B, 3, c, c] float32, y [B] long)``;
    ``dataset[i]`` returns ``(x [3, c, c], y)`` (the same preprocessing, for a ``DataLoader``). Random
    draws use torch's global RNG (see the module docstring).
    """

    def __init__(
        self,
        images: torch.Tensor,
        targets: torch.Tensor,
        mean: tuple[float, float, float],
        std: tuple[float, float, float],
        crop_size: int = 24,
        augment: bool = False,
        classes: list[str] | None = None,
        coarse_targets: torch.Tensor | None = None,
    ) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"`images` must be uint8 [N, 3, H, W], got {images.dtype} {tuple(images.shape)}")
        if targets.dtype != torch.long or targets.shape != (images.shape[0],):
            raise ValueError(f"`targets` must be a LongTensor [{images.shape[0]}], got {targets.dtype} {tuple(targets.shape)}")
        h, w = images.shape[2], images.shape[3]
        if isinstance(crop_size, bool) or not isinstance(crop_size, numbers.Integral) or not 1 <= crop_size <= min(h, w):
            raise ValueError(f"`crop_size` must be an int in [1, {min(h, w)}], got {crop_size!r}")
        self.images = images
        self.targets = targets
        self.coarse_targets = coarse_targets
        self.classes = list(classes) if classes is not None else []
        self.crop_size = int(crop_size)
        self.augment = bool(augment)
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def get_batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Preprocessed ``(x [B, 3, c, c], y [B])`` for the samples ``index`` (LongTensor ``[B]``)."""
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        x = self.images[index]  # [B, 3, H, W] uint8
        b, _, h, w = x.shape
        c = self.crop_size
        if self.augment:
            oy = torch.randint(0, h - c + 1, (b,))
            ox = torch.randint(0, w - c + 1, (b,))
            flip = torch.rand(b) < 0.5
        else:
            oy = torch.full((b,), (h - c) // 2, dtype=torch.long)
            ox = torch.full((b,), (w - c) // 2, dtype=torch.long)
            flip = torch.zeros(b, dtype=torch.bool)
        ar = torch.arange(c)
        rows = oy[:, None] + ar  # [B, c]
        cols = ox[:, None] + ar
        cols = torch.where(flip[:, None], cols.flip(1), cols)  # a flipped crop reads its columns backwards
        x = x[torch.arange(b)[:, None, None, None], torch.arange(3)[None, :, None, None], rows[:, None, :, None], cols[:, None, None, :]]
        x = (x.to(torch.float32).div_(255.0) - self.mean) / self.std
        return x, self.targets[index]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.get_batch(torch.tensor([int(i)]))
        return x[0], y[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Batched fetch for ``DataLoader`` (one :meth:`get_batch` instead of one call per sample)."""
        x, y = self.get_batch(torch.as_tensor(indices, dtype=torch.long))
        return list(zip(x.unbind(0), y.unbind(0)))


class _CIFARDataModule(FederatedDataModule):
    """Shared loader of :class:`CIFAR10DataModule` / :class:`CIFAR100DataModule` (see the module doc)."""

    _name = ""
    _mean: tuple[float, float, float] = CIFAR10_MEAN
    _std: tuple[float, float, float] = CIFAR10_STD

    def __init__(
        self,
        data_dir: str | os.PathLike = "data",
        partitioner: Optional[Partitioner] = None,
        download: bool = False,
        check_md5: bool = True,
        crop_size: int = 24,
        augment: bool = True,
        normalize: bool = True,
        val_from_test: bool = True,
        clients_per_round: int = 10,
        batch_size: int = 20,
        local_epochs: int = 1,
        **kwargs: Any,
    ) -> None:
        if partitioner is None:
            partitioner = self.default_partitioner()
        super().__init__(
            partitioner=partitioner,
            clients_per_round=clients_per_round,
            batch_size=batch_size,
            local_epochs=local_epochs,
            **kwargs,
        )
        for name, value in (("download", download), ("check_md5", check_md5), ("augment", augment),
                            ("normalize", normalize), ("val_from_test", val_from_test)):
            if not isinstance(value, bool):
                raise ValueError(f"`{name}` must be True or False, got {value!r}")
        if isinstance(crop_size, bool) or not isinstance(crop_size, numbers.Integral) or not 1 <= crop_size <= 32:
            raise ValueError(f"`crop_size` must be an int in [1, 32] (24 in Reddi et al.; 32 = no crop), got {crop_size!r}")
        self.data_dir = str(data_dir)
        self.download = download
        self.check_md5 = check_md5
        self.crop_size = int(crop_size)
        self.augment = augment
        self.normalize = normalize
        self.val_from_test = val_from_test

    # ------------------------------------------------------------------ hooks
    @staticmethod
    def default_partitioner() -> Partitioner:
        raise NotImplementedError

    @staticmethod
    def _torchvision_class() -> type:
        raise NotImplementedError

    # ------------------------------------------------------------------ files
    def _reader(self) -> type:
        """torchvision's reader class; with ``check_md5=False`` a subclass whose md5s are ``None``
        (torchvision's ``check_integrity(path, None)`` only checks that the file exists)."""
        cls = self._torchvision_class()
        if self.check_md5:
            return cls
        return type(
            f"{cls.__name__}NoMD5",
            (cls,),
            {
                "train_list": [[name, None] for name, _ in cls.train_list],
                "test_list": [[name, None] for name, _ in cls.test_list],
                "meta": {**cls.meta, "md5": None},
            },
        )

    @property
    def folder(self) -> Path:
        """``{data_dir}/{base_folder}``, where torchvision keeps the pickle files."""
        return Path(self.data_dir) / self._torchvision_class().base_folder

    def _file_names(self) -> list[str]:
        cls = self._torchvision_class()
        return [name for name, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]

    def prepare_data(self) -> None:
        """Download with torchvision when ``download=True`` and the files are missing; else a clear error."""
        missing = [n for n in self._file_names() if not (self.folder / n).is_file()]
        if not missing:
            return
        if self.download:
            cls = self._reader()
            cls(self.data_dir, train=True, download=True)
            return
        cls = self._torchvision_class()
        raise FileNotFoundError(
            f"{self._name} not found: {self.folder} lacks {missing}. Pass download=True to let torchvision "
            f"download {cls.url} (needs internet), or extract {cls.filename} (the python version, "
            f"md5 {cls.tgz_md5}) into {self.data_dir!r} so that {self.folder} holds {self._file_names()}."
        )

    # ------------------------------------------------------------------ datasets
    def _coarse_labels(self, train: bool) -> torch.Tensor | None:
        return None

    def _load_split(self, train: bool) -> CIFARTensorDataset:
        cls = self._reader()
        try:
            ds = cls(self.data_dir, train=train, download=False)
        except RuntimeError as err:  # torchvision's "Dataset not found or corrupted"
            hint = "" if not self.check_md5 else " (pass check_md5=False to skip torchvision's md5 check)"
            raise FileNotFoundError(f"{self._name} in {self.folder} could not be read: {err}{hint}") from err
        images = torch.from_numpy(np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2)))  # HWC -> CHW, uint8
        targets = torch.as_tensor(np.asarray(ds.targets, dtype=np.int64))
        mean, std = (self._mean, self._std) if self.normalize else ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
        return CIFARTensorDataset(
            images, targets, mean, std, crop_size=self.crop_size, augment=train and self.augment,
            classes=ds.classes, coarse_targets=self._coarse_labels(train),
        )

    def load_datasets(self):
        """``(train, val, test)`` in-memory datasets; val is the test set if ``val_from_test`` (Reddi et al.
        evaluate on the whole test set)."""
        self.prepare_data()
        train = self._load_split(train=True)
        test = self._load_split(train=False)
        return train, (test if self.val_from_test else None), test


class CIFAR10DataModule(_CIFARDataModule):
    """Federated CIFAR-10: 50,000 train / 10,000 test images, 10 classes, 3x32x32 (cropped to 24x24).

    Args:
        data_dir: torchvision ``root``; files live in ``{data_dir}/cifar-10-batches-py/``.
        partitioner: default ``DirichletPartitioner(num_clients=500, alpha=0.1, method="per_client")``
            (Reddi et al. 2021: 500 clients x 100 images, label distribution ``Dir(0.1)``).
        download: let torchvision download the data (needs internet).
        check_md5: let torchvision check the files' md5s (default ``True``).
        crop_size: crop side (default 24; 32 = no crop).
        augment: random crop + flip on the training set (default ``True``); ``False`` center-crops it.
        normalize: standardise with :data:`CIFAR10_MEAN` / :data:`CIFAR10_STD` (default ``True``).
        val_from_test: return the test set as validation set too (default ``True``).
        clients_per_round, batch_size, local_epochs: Reddi et al. Table 1 settings (10, 20, 1).
        **kwargs: passed to :class:`FederatedDataModule`.

    Raises:
        ValueError: a bad argument. FileNotFoundError: at setup, data missing or unreadable.
    """

    _name = "CIFAR-10"
    _mean, _std = CIFAR10_MEAN, CIFAR10_STD

    @staticmethod
    def default_partitioner() -> Partitioner:
        return DirichletPartitioner(num_clients=500, alpha=0.1, method="per_client")

    @staticmethod
    def _torchvision_class() -> type:
        from torchvision.datasets import CIFAR10

        return CIFAR10


class CIFAR100DataModule(_CIFARDataModule):
    """Federated CIFAR-100: 50,000 train / 10,000 test images, 100 fine / 20 coarse classes, 3x32x32.

    ``targets`` are the fine labels (what the model predicts); the datasets also carry
    ``coarse_targets``. Arguments as :class:`CIFAR10DataModule`, except:

    Args:
        data_dir: files live in ``{data_dir}/cifar-100-python/``.
        partitioner: default ``PachinkoPartitioner(500, 100, alpha=0.1, beta=10)`` (Reddi et al. 2021,
            App. C). With a :class:`PachinkoPartitioner`, setup checks that its ``coarse_of_fine`` agrees
            with the data's coarse labels (ValueError otherwise).
        normalize: standardise with :data:`CIFAR100_MEAN` / :data:`CIFAR100_STD`.
    """

    _name = "CIFAR-100"
    _mean, _std = CIFAR100_MEAN, CIFAR100_STD

    @staticmethod
    def default_partitioner() -> Partitioner:
        return PachinkoPartitioner(num_clients=500, samples_per_client=100, alpha=0.1, beta=10.0)

    @staticmethod
    def _torchvision_class() -> type:
        from torchvision.datasets import CIFAR100

        return CIFAR100

    def _coarse_labels(self, train: bool) -> torch.Tensor:
        cls = self._torchvision_class()
        coarse: list[int] = []
        for name, _ in cls.train_list if train else cls.test_list:
            with open(self.folder / name, "rb") as f:
                coarse.extend(pickle.load(f, encoding="latin1")["coarse_labels"])
        return torch.as_tensor(np.asarray(coarse, dtype=np.int64))

    def load_datasets(self):
        train, val, test = super().load_datasets()
        if isinstance(self.partitioner, PachinkoPartitioner):
            cof = np.asarray(self.partitioner.coarse_of_fine)
            fine, coarse = train.targets.numpy(), train.coarse_targets.numpy()
            if fine.max() >= cof.shape[0] or not np.array_equal(cof[fine], coarse):
                raise ValueError(
                    "`partitioner.coarse_of_fine` disagrees with the data's coarse labels; pass "
                    "coarse_of_fine=None (CIFAR-100's map) or the map matching the data"
                )
        return train, val, test
