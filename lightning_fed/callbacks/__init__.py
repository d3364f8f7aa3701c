"""Server optimizers: callbacks that turn a round's client updates into the next global model."""

from lightning_fed.callbacks.adaptive import AdaptiveServerOptimizer
from lightning_fed.callbacks.dp import DifferentialPrivacy, DPFedAdagrad, DPFedAdam, DPFedAvg, DPFedYogi
from lightning_fed.callbacks.fedadagrad import FedAdagrad
from lightning_fed.callbacks.fedadam import FedAdam
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.callbacks.fedavgm import FedAvgM
from lightning_fed.callbacks.fedbn import FedBN
from lightning_fed.callbacks.fedper import Ditto, FedPer, FedRep
from lightning_fed.callbacks.feddyn import FedDyn
from lightning_fed.callbacks.fedaware import FedAWARE
from lightning_fed.callbacks.fednova import FedNova
from lightning_fed.callbacks.fedmgda import FedMGDAPlus
from lightning_fed.callbacks.fedlamb import FedAMS, FedLAMB, LocalAdaptiveServer
from lightning_fed.algorithms.fedlamb import AMSGradClient, FedLAMBClient, LocalAMSGrad
from lightning_fed.callbacks.fedyogi import FedYogi
from lightning_fed.callbacks.fedprox import FedProx
from lightning_fed.callbacks.progress import FederatedProgressBar
from lightning_fed.callbacks.robust import FedMedian, FedTrimmedAvg, Krum
from lightning_fed.callbacks.scaffold import SCAFFOLD
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

__all__ = [
    "AMSGradClient",
    "AdaptiveServerOptimizer",
    "AdaptiveServerStepSize",
    "DPFedAdagrad",
    "Ditto",
    "DPFedAdam",
    "DPFedAvg",
    "DPFedYogi",
    "DifferentialPrivacy",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAMS",
    "FedAWARE",
    "FedAvgM",
    "FedBN",
    "FedDyn",
    "FedLAMB",
    "FedLAMBClient",
    "FedMGDAPlus",
    "FedMedian",
    "FedNova",
    "FedPer",
    "FedProx",
    "FedRep",
    "FedTrimmedAvg",
    "FedYogi",
    "FederatedProgressBar",
    "Krum",
    "LocalAMSGrad",
    "LocalAdaptiveServer",
    "NormalizedFedAdagrad",
    "NormalizedFedAdam",
    "NormalizedFedAvgM",
    "NormalizedFedYogi",
    "SCAFFOLD",
    "ServerLAMB",
    "ServerOptimizer",
    "ServerStepSize",
    "normalized_direction",
]
