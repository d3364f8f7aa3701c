"""Server optimizers: callbacks that turn a round's client updates into the next global model.

The ready-made names of methods with halves of their own (FedProx, FedDyn, FedNova, FedMGDA+, FedAWARE, SCAFFOLD,
Fed-LAMB/FedAMS, FedPer, FedRep, Ditto, FedBN) live in their method's module of :mod:`lightning_fed.algorithms`,
beside their client and server halves (issue #52), and are importable from here too (:data:`METHOD_NAMES`).
"""

import importlib as _importlib

from lightning_fed.callbacks.adaptive import AdaptiveServerOptimizer
from lightning_fed.callbacks.dp import DifferentialPrivacy, DPFedAdagrad, DPFedAdam, DPFedAvg, DPFedYogi
from lightning_fed.callbacks.fedadagrad import FedAdagrad
from lightning_fed.callbacks.fedadam import FedAdam
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.callbacks.fedavgm import FedAvgM
from lightning_fed.callbacks.fedyogi import FedYogi
from lightning_fed.callbacks.progress import FederatedProgressBar
from lightning_fed.callbacks.robust import FedMedian, FedTrimmedAvg, Krum
from lightning_fed.callbacks.server_lamb import ServerLAMB
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.callbacks.server_step_size import (
    AdaptiveServerStepSize,
    NormalizedFedAdagrad,
    NormalizedFedAdam,
    NormalizedFedAvgM,
    NormalizedFedYogi,
    ServerStepSize,
    normalized_direction,
)

#: Names of this package that live in their method's module of :mod:`lightning_fed.algorithms` (name -> module; a
#: new method's ready-made name is one line here), imported on first use (PEP 562 ``__getattr__``): a method's module
#: builds on the server optimizers of this package, so this package cannot import it while it loads.
METHOD_NAMES = {
    "APFL": "apfl",
    "Ditto": "ditto",
    "FedALA": "fedala",
    "FedAWARE": "fedaware",
    "FedBABU": "fedbabu",
    "FedBN": "fedbn",
    "FedDyn": "feddyn",
    "AMSGradClient": "fedlamb",
    "FedAMS": "fedlamb",
    "FedLAMB": "fedlamb",
    "FedLAMBClient": "fedlamb",
    "LocalAMSGrad": "fedlamb",
    "LocalAdaptiveServer": "fedlamb",
    "FedMGDAPlus": "fedmgda",
    "FedNova": "fednova",
    "FedPer": "fedper",
    "FedProx": "fedprox",
    "FedRep": "fedrep",
    "FedRoD": "fedrod",
    "IFCA": "ifca",
    "LGFedAvg": "lgfedavg",
    "PFedMe": "pfedme",
    "PerFedAvg": "perfedavg",
    "SCAFFOLD": "scaffold",
}


def __getattr__(name: str):
    """A name of :data:`METHOD_NAMES`, from its method's module (``lightning_fed.callbacks.FedBN`` is
    ``lightning_fed.algorithms.fedbn.FedBN``).

    Raises:
        AttributeError: any other name.
    """
    if name in METHOD_NAMES:
        value = getattr(_importlib.import_module(f"lightning_fed.algorithms.{METHOD_NAMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(METHOD_NAMES))


__all__ = [
    "AdaptiveServerOptimizer",
    "AdaptiveServerStepSize",
    "DPFedAdagrad",
    "DPFedAdam",
    "DPFedAvg",
    "DPFedYogi",
    "DifferentialPrivacy",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedMedian",
    "FedTrimmedAvg",
    "FedYogi",
    "FederatedProgressBar",
    "Krum",
    "NormalizedFedAdagrad",
    "NormalizedFedAdam",
    "NormalizedFedAvgM",
    "NormalizedFedYogi",
    "ServerLAMB",
    "ServerOptimizer",
    "ServerStepSize",
    "normalized_direction",
    *sorted(METHOD_NAMES),
]

import lightning_fed.algorithms  # noqa: E402,F401  (defines the names of METHOD_NAMES: the CLI lists every server optimizer)
