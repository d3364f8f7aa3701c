"""MNIST (LeCun et al., 1998) as a federated data module, for the Fed-LAMB experiments.

Data sources, tried in this order by :meth:`MNISTDataModule.prepare_data`:

1. torchvision's raw layout already present: ``{data_dir}/MNIST/raw/`` holding the four
   decompressed IDX files ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
   ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (exactly the names
   ``torchvision.datasets.MNIST._check_exists`` looks for: its ``resources`` file names minus
   ``.gz``).
2. ``download=True``: torchvision downloads from its mirror (needs internet).

Otherwise a :class:`FileNotFoundError` explains how to get the data. Unlike Fashion-MNIST there
is no Debian package with the full MNIST IDX files (``apt-cache search mnist`` lists only
``dataset-fashion-mnist``), so there is no ``debian_dir`` source.

Loading is shared with Fashion-MNIST (:mod:`lightning_fed.datamodules._idx_images`): torchvision's
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

from lightning_fed.datamodules._idx_images import IDXImageDataModule, IDXImageTensorDataset
from lightning_fed.datamodules.partition import Partitioner

__all__ = ["MNISTDataModule", "MNISTTensorDataset", "MNIST_MEAN", "MNIST_STD"]

#: Train-set pixel mean / std of MNIST after scaling to [0, 1] (the values of the PyTorch MNIST example).
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081


class MNISTTensorDataset(IDXImageTensorDataset):
    """In-memory MNIST ``(image, label)`` dataset with a torchvision-style ``targets`` attribute.

    Args:
        images: float tensor ``[N, 1, 28, 28]`` (already normalised).
        targets: LongTensor ``[N]`` of digits 0-9.
        classes: class names (index -> name), as ``torchvision.datasets.MNIST.classes``.

    ``dataset[i]`` returns ``(images[i], targets[i])`` -- a ``[1, 28, 28]`` float tensor and a
    0-d LongTensor; a DataLoader batch is ``([B, 1, 28, 28], [B])``.
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
        **kwargs: passed to :class:`FederatedDataModule` (``data_order``, ``seed``,
            ``local_work``, ``eval_batch_size``, ``num_workers``, ...).
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
        **kwargs: Any,
    ) -> None:
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
