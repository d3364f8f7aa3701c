"""The client side of a round: what one client does from x_t to its :class:`ClientUpdate`, and how a cohort runs.

* :mod:`~lightning_fed.client.update` — :class:`ClientUpdate` (what a client sends back), built only by
  :meth:`ClientRunner.build_update`;
* :mod:`~lightning_fed.client.algorithm` — :class:`ClientAlgorithm`, the client half of an algorithm (FedProx's
  proximal term, FedDyn's regulariser), given to the run as ``FederatedTrainer(client_algorithms=[...])``;
* :mod:`~lightning_fed.client.runner` — :class:`~lightning_fed.client.runner.ClientRunner`, owned by the federated
  loop: start a client from x_t, take a local step, finish it into a ``ClientUpdate``, report a failure; and
  :class:`~lightning_fed.client.runner.ClientContext`, what the server sends a client;
* :mod:`~lightning_fed.client.sequential` — :class:`ClientExecutor` and :class:`SequentialExecutor`;
* :mod:`~lightning_fed.client.vectorized` — :class:`VectorizedExecutor` (``torch.func.vmap`` over clients);
* :mod:`~lightning_fed.client.distributed` — the cohort split over DDP ranks and the gather of the round's updates;
* :mod:`~lightning_fed.client.host_sync` — :class:`~lightning_fed.client.host_sync.HostSyncCounter`, counting the
  copies of tensor values to the host (device synchronisations) that a local step makes.

This ``__init__`` imports only :mod:`~lightning_fed.client.update` and :mod:`~lightning_fed.client.algorithm` (the
server optimizers import them from here; the executors import the server optimizers).
"""

from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.client.update import ClientUpdate, parameter_client_lrs

__all__ = ["ClientAlgorithm", "ClientUpdate", "parameter_client_lrs"]
