"""lightning_fed: federated learning research on PyTorch Lightning.

The names below import on first use (a module ``__getattr__``): ``import lightning_fed`` itself imports neither
torch nor Lightning, so the ``lightning-fed`` command starts without them where it does not need them
(:mod:`lightning_fed.console`). ``from lightning_fed import FederatedTrainer`` and ``dir(lightning_fed)`` work as
with eager imports.

>>> import lightning_fed
>>> lightning_fed.FederatedTrainer.__module__, "FederatedTrainer" in dir(lightning_fed)
('lightning_fed.trainer', True)
"""

#: ``{public name: the module that defines it}``, imported on first use.
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same names, read statically by type checkers and the API reference (griffe)
    from lightning_fed.client import ClientUpdate
    from lightning_fed.executor import ClientExecutor, SequentialExecutor
    from lightning_fed.loop import FederatedFitLoop
    from lightning_fed.personal import personal_model, personal_state_dict, trained_clients
    from lightning_fed.trainer import FederatedTrainer
    from lightning_fed.vectorized import VectorizedExecutor

_LAZY = {
    "ClientExecutor": "lightning_fed.executor",
    "ClientUpdate": "lightning_fed.client",
    "FederatedFitLoop": "lightning_fed.loop",
    "FederatedTrainer": "lightning_fed.trainer",
    "personal_model": "lightning_fed.personal",
    "personal_state_dict": "lightning_fed.personal",
    "SequentialExecutor": "lightning_fed.executor",
    "VectorizedExecutor": "lightning_fed.vectorized",
    "trained_clients": "lightning_fed.personal",
}

__all__ = ["ClientExecutor", "ClientUpdate", "FederatedFitLoop", "FederatedTrainer", "SequentialExecutor", "VectorizedExecutor",
           "personal_model", "personal_state_dict", "trained_clients"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """The public name ``name`` from its module (imported now), kept as this package's attribute.

    Raises:
        AttributeError: ``name`` is neither a public name of the package nor one of its sub-modules (which this
            imports: ``lightning_fed.datamodules`` after only ``import lightning_fed``, as with eager imports).
    """
    import importlib
    import importlib.util

    if name not in _LAZY:
        if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")  # a sub-module, as eager imports left it here
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
