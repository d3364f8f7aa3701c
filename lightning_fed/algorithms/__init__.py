"""Federated algorithms as one unit each: the client half (:class:`~lightning_fed.client.ClientAlgorithm`), the
server half (an aggregator stage over a typed state) and the per-client state, in one module per method.

Give a client half to the run, under any server optimizer (``FederatedTrainer(callbacks=[FedAdam(lr=0.01)],
client_algorithms=[FedProxClient(mu=0.01)])``); the server half is a stage of the server optimizer's ``aggregators``. Ready-made pairings keep their names in :mod:`lightning_fed.callbacks`
(:class:`~lightning_fed.algorithms.fedprox.FedProx` is FedAvg with :class:`FedProxClient`).
"""

# First: its __init__ imports this package's server halves (scaffold, fedlamb, fedaware) as it ends, so a first
# import of any lightning_fed.algorithms.<method> (nothing imported before: `import lightning_fed` is lazy) goes
# through it and never meets a half-imported method module.
import lightning_fed.server.aggregators  # noqa: F401, I001
from lightning_fed.algorithms.apfl import APFLClient
from lightning_fed.algorithms.ditto import DittoClient, DittoInitialModel
from lightning_fed.algorithms.fedala import FedALAClient
from lightning_fed.algorithms.fedbabu import FedBABUClient
from lightning_fed.algorithms.fedbn import FedBNClient
from lightning_fed.algorithms.fedaware import FedAWAREMinNorm
from lightning_fed.algorithms.feddyn import FedDynClient, FedDynCorrection
from lightning_fed.algorithms.fedmgda import FedMGDAMinNorm, min_norm_box
from lightning_fed.algorithms.fednova import FedNovaAveraging
from lightning_fed.algorithms.fedper import FedPerClient
from lightning_fed.algorithms.fedrep import FedRepClient
from lightning_fed.algorithms.fedrod import FedRoDClient
from lightning_fed.algorithms.fedprox import FedProxClient
from lightning_fed.algorithms.ifca import IFCAClient, IFCAClusters
from lightning_fed.algorithms.lgfedavg import LGFedAvgClient
from lightning_fed.algorithms.perfedavg import PerFedAvgClient
from lightning_fed.algorithms.pfedme import PFedMeClient
from lightning_fed.algorithms.scaffold import ScaffoldClient, ScaffoldControl

__all__ = ["APFLClient", "DittoClient", "DittoInitialModel", "FedALAClient", "FedAWAREMinNorm", "FedBABUClient", "FedBNClient", "FedDynClient", "FedDynCorrection", "FedMGDAMinNorm", "FedNovaAveraging", "FedPerClient", "FedProxClient", "FedRepClient", "FedRoDClient", "IFCAClient", "IFCAClusters", "LGFedAvgClient", "PerFedAvgClient", "PFedMeClient", "ScaffoldClient", "ScaffoldControl",
           "min_norm_box"]
