"""Federated data: the :class:`FederatedDataModule` and its parts (the data source, cohorts, local work, federated
evaluation), the partitioners and the tasks.

Layout: the data module and its parts stand at the top (``federated``, ``source``, ``partition``, ``cohorts``,
``local_work``, ``client_eval``, ``simulated_time`` with the device models in ``devices/``, ``huggingface``); the
partition schemes in :mod:`lightning_fed.datamodules.partitioners`, one per module; the tasks' data modules in
:mod:`lightning_fed.datamodules.tasks`. Every class is re-exported here
(``lightning_fed.datamodules.DirichletPartitioner``, ``lightning_fed.datamodules.CIFAR10DataModule``).

The modules' paths from before that layout (``lightning_fed.datamodules.cifar``, ``...dirichlet``,
``...stackoverflow.datamodule``, ...) are shim modules until 0.3.0 (``MOVED_MODULES``, the table of
``lightning_fed._moved``): each hands out the names of its module now with a ``DeprecationWarning`` naming the new
path, so imports and pickles that name an old path keep working; the CLI reads a config's old ``class_path`` as the
new one (with a ``FutureWarning``), and a checkpoint's run record is read through the same table. Importing this
package imports no old path.
"""

import importlib as _importlib
from typing import Any as _Any

from lightning_fed._moved import MOVED_MODULES
from lightning_fed.datamodules.devices import CallableDeviceModel, DeviceModel, DeviceProfiles, ParametricDeviceModel
from lightning_fed.datamodules.federated import FederatedDataModule
from lightning_fed.datamodules.simulated_time import SimulatedTime
from lightning_fed.datamodules.local_work import (
    ClientWork,
    FixedLocalSteps,
    FixedLocalWork,
    LocalWork,
    SampledLocalWork,
    batch_schedule,
)
from lightning_fed.datamodules.partition import Partition, Partitioner
from lightning_fed.datamodules.source import DataSource
from lightning_fed.datamodules.partitioners import (
    DirichletPartitioner,
    ExponentialPartitioner,
    GroupedNaturalIdPartitioner,
    IIDPartitioner,
    InnerDirichletPartitioner,
    LinearPartitioner,
    NaturalIdPartitioner,
    PachinkoPartitioner,
    PathologicalPartitioner,
    ShardPartitioner,
    SizeLabelSkewPartitioner,
    SquarePartitioner,
)
from lightning_fed.datamodules.tasks import (
    CIFAR10DataModule,
    CIFAR100DataModule,
    EMNISTDataModule,
    FashionMNISTDataModule,
    MNISTDataModule,
    ShakespeareDataModule,
    StackOverflowNWPDataModule,
    StackOverflowTagDataModule,
)


def __getattr__(name: str) -> _Any:
    """An old module path's shim as an attribute (``lightning_fed.datamodules.cifar``), imported on first use.

    Raises:
        AttributeError: ``name`` is neither a name of this package nor an old module of ``MOVED_MODULES``.
    """
    if f"{__name__}.{name}" in MOVED_MODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "CIFAR100DataModule",
    "CIFAR10DataModule",
    "CallableDeviceModel",
    "ClientWork",
    "DataSource",
    "DeviceModel",
    "DeviceProfiles",
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
    "MOVED_MODULES",
    "NaturalIdPartitioner",
    "PachinkoPartitioner",
    "ParametricDeviceModel",
    "Partition",
    "Partitioner",
    "PathologicalPartitioner",
    "SampledLocalWork",
    "ShakespeareDataModule",
    "ShardPartitioner",
    "SimulatedTime",
    "SizeLabelSkewPartitioner",
    "SquarePartitioner",
    "StackOverflowNWPDataModule",
    "StackOverflowTagDataModule",
    "batch_schedule",
]
