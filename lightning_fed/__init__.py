"""lightning_fed: federated learning research on PyTorch Lightning.

The names below are imported on first use (PEP 562 ``__getattr__``), so that importing a part of the package
(``lightning_fed.cli`` for ``lightning-fed fit --help``, ``lightning_fed.errors``) does not import the others:
``from lightning_fed import FederatedTrainer`` works as before.

>>> import lightning_fed
>>> lightning_fed.FederatedTrainer.__name__, lightning_fed.VectorizedExecutor.__module__
('FederatedTrainer', 'lightning_fed.vectorized')
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from lightning_fed.client import ClientUpdate
    from lightning_fed.executor import ClientExecutor, SequentialExecutor
    from lightning_fed.loop import FederatedFitLoop
    from lightning_fed.trainer import FederatedTrainer
    from lightning_fed.vectorized import VectorizedExecutor

#: ``{name: module}`` of the names the package exports, each imported on first use.
_EXPORTS = {
    "ClientExecutor": "lightning_fed.executor",
    "ClientUpdate": "lightning_fed.client",
    "FederatedFitLoop": "lightning_fed.loop",
    "FederatedTrainer": "lightning_fed.trainer",
    "SequentialExecutor": "lightning_fed.executor",
    "VectorizedExecutor": "lightning_fed.vectorized",
}

__all__ = ["ClientExecutor", "ClientUpdate", "FederatedFitLoop", "FederatedTrainer", "SequentialExecutor", "VectorizedExecutor"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
