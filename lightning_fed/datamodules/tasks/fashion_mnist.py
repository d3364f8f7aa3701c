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

Otherwise a :class:`~lightning_fed.errors.DataNotFoundError` (a ``FileNotFoundError``) explains how to get the data;
``lightning-fed`` prints it as one ``error: ...`` line (exit status 2).

The loading logic is shared with MNIST (:mod:`lightning_fed.datamodules.tasks._idx_images`).
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

import os
from typing import Any, Optional

from lightning_fed.datamodules.partition import Partitioner
from lightning_fed.datamodules.tasks._idx_images import IDXImageDataModule, IDXImageTensorDataset

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


class FashionMNISTTensorDataset(IDXImageTensorDataset):
    """In-memory Fashion-MNIST ``(image, label)`` dataset: an :class:`IDXImageTensorDataset` (shapes, ``targets``) over
    Fashion-MNIST's 10 clothing classes, ``classes`` as ``torchvision.datasets.FashionMNIST.classes``.

    Example::

        >>> import torch
        >>> ds = FashionMNISTTensorDataset(torch.zeros(2, 1, 28, 28), torch.tensor([9, 0]))
        >>> len(ds), ds[0][1]
        (2, tensor(9))
    """


class FashionMNISTDataModule(IDXImageDataModule):
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

    Example: construction reads nothing (the files are read by :meth:`setup`, as in
    :class:`~lightning_fed.datamodules.tasks.mnist.MNISTDataModule`'s example); the partitioner is required::

        >>> from lightning_fed.datamodules.partitioners.shard import ShardPartitioner
        >>> dm = FashionMNISTDataModule(data_dir="data", partitioner=ShardPartitioner(num_clients=100, shards_per_client=2))
        >>> dm.clients_per_round, dm.batch_size, dm.partitioner
        (10, 64, ShardPartitioner(num_clients=100, shards_per_client=2, seed=0, shard_size=None, keep_incomplete_shard=False))
        >>> FashionMNISTDataModule()
        Traceback (most recent call last):
        ...
        ValueError: FashionMNISTDataModule needs a partitioner, e.g. ShardPartitioner(num_clients=100, shards_per_client=2) or DirichletPartitioner(num_clients=100, alpha=0.1)
    """

    torchvision_class = "FashionMNIST"
    display_name = "Fashion-MNIST"
    pixel_mean = FASHION_MNIST_MEAN
    pixel_std = FASHION_MNIST_STD
    dataset_class = FashionMNISTTensorDataset
    supports_debian = True
    partitioner_hint = (
        "ShardPartitioner(num_clients=100, shards_per_client=2) or "
        "DirichletPartitioner(num_clients=100, alpha=0.1)"
    )
    install_hint = _INSTALL_HINT

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
        super().__init__(
            data_dir=data_dir,
            partitioner=partitioner,
            debian_dir=debian_dir,
            download=download,
            normalize=normalize,
            val_from_test=val_from_test,
            clients_per_round=clients_per_round,
            batch_size=batch_size,
            local_epochs=local_epochs,
            **kwargs,
        )
