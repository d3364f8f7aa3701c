"""The tasks: where each paper's data come from (a file format, a download, a natural split) as a
:class:`~lightning_fed.datamodules.federated.FederatedDataModule` subclass, one module or package per task, with
the bounded archive reader they share (:mod:`~lightning_fed.datamodules.tasks.pip_archive`)."""

from lightning_fed.datamodules.tasks.cifar import CIFAR10DataModule, CIFAR100DataModule
from lightning_fed.datamodules.tasks.emnist import EMNISTDataModule
from lightning_fed.datamodules.tasks.fashion_mnist import FashionMNISTDataModule
from lightning_fed.datamodules.tasks.mnist import MNISTDataModule
from lightning_fed.datamodules.tasks.shakespeare import ShakespeareDataModule
from lightning_fed.datamodules.tasks.stackoverflow import StackOverflowNWPDataModule, StackOverflowTagDataModule

__all__ = [
    "CIFAR100DataModule",
    "CIFAR10DataModule",
    "EMNISTDataModule",
    "FashionMNISTDataModule",
    "MNISTDataModule",
    "ShakespeareDataModule",
    "StackOverflowNWPDataModule",
    "StackOverflowTagDataModule",
]
