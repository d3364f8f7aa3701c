"""lightning_fed: federated learning research on PyTorch Lightning."""

from lightning_fed.client import ClientUpdate
from lightning_fed.executor import ClientExecutor, SequentialExecutor
from lightning_fed.loop import FederatedFitLoop
from lightning_fed.trainer import FederatedTrainer
from lightning_fed.vectorized import VectorizedExecutor

__all__ = ["ClientExecutor", "ClientUpdate", "FederatedFitLoop", "FederatedTrainer", "SequentialExecutor", "VectorizedExecutor"]
__version__ = "0.1.0"
