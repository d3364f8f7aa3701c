"""Federated data: the data source, partitioners, local-work policies, the FederatedDataModule and task data modules."""

from lightning_fed.datamodules.cifar import CIFAR10DataModule, CIFAR100DataModule
from lightning_fed.datamodules.dirichlet import DirichletPartitioner
from lightning_fed.datamodules.emnist import EMNISTDataModule
from lightning_fed.datamodules.fashion_mnist import FashionMNISTDataModule
from lightning_fed.datamodules.mnist import MNISTDataModule
from lightning_fed.datamodules.federated import FederatedDataModule
from lightning_fed.datamodules.grouped_natural_id import GroupedNaturalIdPartitioner
from lightning_fed.datamodules.iid import IIDPartitioner
from lightning_fed.datamodules.inner_dirichlet import InnerDirichletPartitioner
from lightning_fed.datamodules.local_work import (
    ClientWork,
    FixedLocalSteps,
    FixedLocalWork,
    LocalWork,
    SampledLocalWork,
    batch_schedule,
)
from lightning_fed.datamodules.natural_id import NaturalIdPartitioner
from lightning_fed.datamodules.pachinko import PachinkoPartitioner
from lightning_fed.datamodules.partition import Partition, Partitioner
from lightning_fed.datamodules.pathological import PathologicalPartitioner
from lightning_fed.datamodules.shakespeare import ShakespeareDataModule
from lightning_fed.datamodules.shard import ShardPartitioner
from lightning_fed.datamodules.source import DataSource
from lightning_fed.datamodules.size_skew import (
    ExponentialPartitioner,
    LinearPartitioner,
    SizeLabelSkewPartitioner,
    SquarePartitioner,
)
from lightning_fed.datamodules.stackoverflow import StackOverflowNWPDataModule, StackOverflowTagDataModule

__all__ = [
    "CIFAR100DataModule",
    "CIFAR10DataModule",
    "ClientWork",
    "DataSource",
    "DirichletPartitioner",
    "EMNISTDataModule",
    "ExponentialPartitioner",
    "FashionMNISTDataModule",
    "MNISTDataModule",
    "FederatedDataModule",
    "FixedLocalSteps",
    "FixedLocalWork",
    "GroupedNaturalIdPartitioner",
    "IIDPartitioner",
    "InnerDirichletPartitioner",
    "LinearPartitioner",
    "LocalWork",
    "NaturalIdPartitioner",
    "PachinkoPartitioner",
    "Partition",
    "Partitioner",
    "PathologicalPartitioner",
    "SampledLocalWork",
    "ShakespeareDataModule",
    "ShardPartitioner",
    "SizeLabelSkewPartitioner",
    "SquarePartitioner",
    "StackOverflowNWPDataModule",
    "StackOverflowTagDataModule",
    "batch_schedule",
]
