"""Server optimizers: callbacks that turn a round's client updates into the next global model."""

from lightning_fed.callbacks.adaptive import AdaptiveServerOptimizer
from lightning_fed.callbacks.fedadagrad import FedAdagrad
from lightning_fed.callbacks.fedadam import FedAdam
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.callbacks.fedavgm import FedAvgM
from lightning_fed.callbacks.fedyogi import FedYogi
from lightning_fed.callbacks.progress import FederatedProgressBar
from lightning_fed.callbacks.server_optimizer import ServerOptimizer

__all__ = [
    "AdaptiveServerOptimizer",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedYogi",
    "FederatedProgressBar",
    "ServerOptimizer",
]
