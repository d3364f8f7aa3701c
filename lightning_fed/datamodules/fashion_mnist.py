"""Fashion-MNIST (Xiao et al., 2017) as a federated data module, offline-first.

Data sources, tried in this order by :meth:`FashionMNISTDataModule.prepare_data`:

1. torchvision's raw layout already present: ``{data_dir}/FashionMNIST/raw/`` holding the
   four decompressed IDX files ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
   ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (exactly the names
   ``torchvision.datasets.FashionMNIST._check_exists`` looks for: its ``resources`` file
   names minus ``.gz``).
2. The Debian package ``dataset-fashion-mnist`` (``apt-get install -y dataset-fashion-mnist``),
   which installs the same four files gzipped under ``/usr/share/datasets/fashion-mnist/``:
   they are gunzipped into the raw layout above. (The Debian ``.gz`` files are recompressed,
   so their md5 differs from torchvision's ``resources`` md5s; torchvision does not check
   md5s of the decompressed files, so this is fine.)
3. ``download=True``: torchvision downloads from its mirror (needs internet).

Otherwise a :class:`FileNotFoundError` explains how to get the data.

Reading is always done by torchvision's own IDX reader; the images are then turned into an
in-memory :class:`FashionMNISTTensorDataset` (float32 ``[1, 28, 28]`` images, normalised
with mean 0.2860 / std 0.3530 -- the train-set pixel statistics -- and a LongTensor
``targets`` attribute that label partitioners read).

FedAWARE defaults (Zeng et al., ICML 2024, App. C.1 / C.2: FMNIST uses the CIFAR-10
settings): 10 % of 100 clients per round (``clients_per_round=10``), batch size 64,
3 local epochs. Note the authors' code feeds FMNIST to the model with ``ToTensor()`` only
(pixels in [0, 1], no normalisation); pass ``normalize=False`` to reproduce that.
"""

from __future__ import annotations

import gzip
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Optional

import torch
from torch.utils.data import TensorDataset

from lightning_fed.datamodules.federated import FederatedDataModule
from lightning_fed.datamodules.partition import Partitioner

__all__ = [
    "FashionMNISTDataModule",
    "FashionMNISTTensorDataset",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "DEBIAN_FASHION_MNIST_DIR",
]

#: Train-set pixel mean / std of Fashion-MNIST after scaling to [0, 1].
FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530
#: Where ``apt-get install dataset-fashion-mnist`` puts the gzipped IDX files.
DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

_INSTALL_HINT = (
    "Get it offline with `apt-get install -y dataset-fashion-mnist` (Debian/Ubuntu; installs "
    f"the IDX .gz files into {DEBIAN_FASHION_MNIST_DIR}), point `debian_dir` at a folder "
    "holding {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz, or pass download=True to let "
    "torchvision download it (needs internet)."
)


def _raw_file_names() -> list[str]:
    """The decompressed file names torchvision's ``FashionMNIST._check_exists`` requires."""
    from torchvision.datasets import FashionMNIST

    return [os.path.splitext(os.path.basename(url))[0] for url, _ in FashionMNIST.resources]


class FashionMNISTTensorDataset(TensorDataset):
    """In-memory ``(image, label)`` dataset with a torchvision-style ``targets`` attribute.

    Args:
        images: float tensor ``[N, 1, 28, 28]`` (already normalised).
        targets: LongTensor ``[N]`` of class indices.
        classes: class names (index -> name), as ``torchvision.datasets.FashionMNIST.classes``.

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


class FashionMNISTDataModule(FederatedDataModule):
    """Federated Fashion-MNIST: 60,000 train / 10,000 test images, 10 classes, 1x28x28.

    Args:
        data_dir: torchvision ``root``; files live in ``{data_dir}/FashionMNIST/raw/``.
        partitioner: how the train set is split across clients (required), e.g.
            ``ShardPartitioner(num_clients=100, shards_per_client=2)`` (FedAWARE
            "statistical only") or ``DirichletPartitioner(num_clients=100, alpha=0.1)``
            ("hybrid").
        debian_dir: folder with the Debian package's ``*-ubyte.gz`` files (see module doc).
        download: let torchvision download when no local copy is found.
        normalize: standardise pixels with (0.2860, 0.3530); ``False`` keeps [0, 1] pixels
            (what the FedAWARE authors' code does).
        val_from_test: the data set has no official validation split; with ``True`` (default)
            the official test set is also returned as the validation set, which is the
            FedAWARE protocol (the global model is evaluated on the test set every round).
            ``False`` returns ``None`` for validation.
        clients_per_round, batch_size, local_epochs: FedAWARE App. C.1 defaults (10 of 100
            clients, 64, 3).
        **kwargs: passed to :class:`FederatedDataModule` (``data_order``, ``seed``,
            ``local_work``, ``eval_batch_size``, ``num_workers``, ...).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike = "data",
        partitioner: Optional[Partitioner] = None,
        debian_dir: str | os.PathLike | None = DEBIAN_FASHION_MNIST_DIR,
        download: bool = False,
        normalize: bool = True,
        val_from_test: bool = True,
        clients_per_round: int = 10,
        batch_size: int = 64,
        local_epochs: int = 3,
        **kwargs: Any,
    ) -> None:
        if partitioner is None:
            raise ValueError(
                "FashionMNISTDataModule needs a partitioner, e.g. "
                "ShardPartitioner(num_clients=100, shards_per_client=2) or "
                "DirichletPartitioner(num_clients=100, alpha=0.1)"
            )
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
        """``{data_dir}/FashionMNIST/raw`` -- torchvision's ``FashionMNIST.raw_folder``."""
        return Path(self.data_dir) / "FashionMNIST" / "raw"

    def _raw_present(self) -> bool:
        return all((self.raw_folder / name).is_file() for name in _raw_file_names())

    def _debian_present(self) -> bool:
        if not self.debian_dir:
            return False
        return all((Path(self.debian_dir) / f"{name}.gz").is_file() for name in _raw_file_names())

    def prepare_data(self) -> None:
        """Make sure torchvision's raw files exist (Debian copy > download > clear error).

        Idempotent; writes each file atomically (temporary name + ``os.replace``).
        """
        if self._raw_present():
            return
        if self._debian_present():
            self.raw_folder.mkdir(parents=True, exist_ok=True)
            for name in _raw_file_names():
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
            from torchvision.datasets import FashionMNIST

            FashionMNIST(self.data_dir, train=True, download=True)
            FashionMNIST(self.data_dir, train=False, download=True)
            return
        missing = [n for n in _raw_file_names() if not (self.raw_folder / n).is_file()]
        raise FileNotFoundError(
            f"Fashion-MNIST not found: {self.raw_folder} lacks {missing}, and debian_dir="
            f"{self.debian_dir!r} does not hold the four *-ubyte.gz files. {_INSTALL_HINT}"
        )

    # ------------------------------------------------------------------ datasets
    def _load_split(self, train: bool) -> FashionMNISTTensorDataset:
        from torchvision.datasets import FashionMNIST

        ds = FashionMNIST(self.data_dir, train=train, download=False)
        images = ds.data.unsqueeze(1).to(torch.float32).div_(255.0)  # [N, 1, 28, 28] in [0, 1]
        if self.normalize:
            images.sub_(FASHION_MNIST_MEAN).div_(FASHION_MNIST_STD)
        return FashionMNISTTensorDataset(images, ds.targets.to(torch.long), classes=ds.classes)

    def load_datasets(self):
        """``(train, val, test)`` in-memory datasets; val is the test set if ``val_from_test``."""
        if not self._raw_present():
            self.prepare_data()  # e.g. setup() called without a Trainer; raises if unavailable
        train = self._load_split(train=True)
        test = self._load_split(train=False)
        return train, (test if self.val_from_test else None), test
