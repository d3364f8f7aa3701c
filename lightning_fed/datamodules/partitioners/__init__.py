"""The partition schemes, one per module: each a seeded, stateless :class:`~lightning_fed.datamodules.partition.Partitioner`
that splits a dataset among clients (IID, shards, Dirichlet, natural ids, ...) and returns a
:class:`~lightning_fed.datamodules.partition.Partition`.

The base class and the result type stay in :mod:`lightning_fed.datamodules.partition` (the partition is what the
data module's other parts, cohorts and federated evaluation, read); they are re-exported here.
"""

from lightning_fed.datamodules.partition import Partition, Partitioner
from lightning_fed.datamodules.partitioners.dirichlet import DirichletPartitioner
from lightning_fed.datamodules.partitioners.grouped_natural_id import GroupedNaturalIdPartitioner
from lightning_fed.datamodules.partitioners.iid import IIDPartitioner
from lightning_fed.datamodules.partitioners.inner_dirichlet import InnerDirichletPartitioner
from lightning_fed.datamodules.partitioners.natural_id import NaturalIdPartitioner
from lightning_fed.datamodules.partitioners.pachinko import PachinkoPartitioner
from lightning_fed.datamodules.partitioners.pathological import PathologicalPartitioner
from lightning_fed.datamodules.partitioners.shard import ShardPartitioner
from lightning_fed.datamodules.partitioners.size_skew import (
    ExponentialPartitioner,
    LinearPartitioner,
    SizeLabelSkewPartitioner,
    SquarePartitioner,
)

__all__ = [
    "DirichletPartitioner",
    "ExponentialPartitioner",
    "GroupedNaturalIdPartitioner",
    "IIDPartitioner",
    "InnerDirichletPartitioner",
    "LinearPartitioner",
    "NaturalIdPartitioner",
    "PachinkoPartitioner",
    "Partition",
    "Partitioner",
    "PathologicalPartitioner",
    "ShardPartitioner",
    "SizeLabelSkewPartitioner",
    "SquarePartitioner",
]
