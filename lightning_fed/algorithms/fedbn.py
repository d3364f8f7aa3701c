"""FedBN (Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021, Algorithm 1): every client keeps its BatchNorm layers — their affine parameters γ, β and
their running statistics — local; every other parameter is averaged by the server.

Algorithm 1 (user k, layer l, local update pace E, rounds T)::

    for each round t = 1 … T:
        for each user k and each layer l:   w_{t+1,k}^(l) ← SGD(w_{t,k}^(l))                         (l. 3-5)
        if t mod E = 0:
            for each user k and each layer l:
                if layer l is not BatchNorm:  w_{t+1,k}^(l) ← (1/K)·Σ_k w_{t+1,k}^(l)                   (l. 6-10)

Here the E local SGD steps of l. 3-5 are the client's local work of a round (the data module's ``local_epochs`` /
``local_steps``), and l. 6-10 is the server step on the non-BatchNorm part only: :class:`FedBNClient` is a
:class:`~lightning_fed.client.personal.LocalParts` that keeps every ``torch.nn.modules.batchnorm._BatchNorm``
(``BatchNorm1d/2d/3d``, ``SyncBatchNorm``) local, so the clients' updates are 0 there and any server rule averages
(or adapts, e.g. FedAdam) the rest. The paper's average is uniform over the K clients (1/K; the authors' code,
github.com/med-air/FedBN ``fed_train.py``, ``client_weights = [1/client_num]``), so :class:`~lightning_fed.callbacks.
FedBN` defaults to ``weighting="uniform"``; the paper has full participation, here the mean is over the round's
cohort and a client never sampled before starts from the initial BatchNorm values (the global model's, which the
server never changes).

Where this differs from the paper:

* the paper has full participation (every user in every round); here the mean is over the round's cohort, and a
  client never sampled before starts from the initial BatchNorm values (the global model's, never changed by the
  server); its personal model, until it is sampled, is the global model (``fed_personal_<m>`` and
  :func:`lightning_fed.personal.personal_model` with ``untrained="global"``);
* l. 6's "t mod E = 0" (averaging every E local steps) is one round of the client's local work (E steps or epochs
  per round, the data module's ``local_epochs`` / ``local_steps``);
* any server rule may replace l. 6-10's plain average (FedBN with FedAdam: the client half under FedAdam);
* the global model's BatchNorm layers stay at their initial values, so its central ``val_*`` measure the shared
  layers with untrained BatchNorm (a warning says so at fit start, :mod:`lightning_fed.personal`).

Memory: per client seen, the BatchNorm layers' parameters and buffers (4 values per channel plus one counter per
layer), on the CPU and in every checkpoint.
"""

from __future__ import annotations

from typing import Any, Optional

from torch.nn.modules.batchnorm import _BatchNorm

from lightning_fed.client.personal import LocalParts
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.aggregators.base import Stage

__all__ = ["FedBN", "FedBNClient"]


class FedBNClient(LocalParts):
    """FedBN's client half: the BatchNorm layers (parameters and running statistics) stay local to each client
    (Li et al. 2021, Alg. 1, l. 6-10 average only the layers that are not BatchNorm).

    Raises:
        ValueError: at fit start, a model without a BatchNorm layer.

    Example::

        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2), torch.nn.Linear(2, 1))
        >>> half = FedBNClient()
        >>> half.setup(net)
        >>> half.kept_names(net), half.state_dim(0)
        (['1.weight', '1.bias', '1.running_mean', '1.running_var', '1.num_batches_tracked'], 9)
    """

    def __init__(self) -> None:
        super().__init__(types=[_BatchNorm])

    def settings(self) -> dict[str, Any]:
        return {}


class FedBN(FedAvg):
    """FedBN (Li et al., ICLR 2021, Algorithm 1): FedAvg over every parameter except the BatchNorm layers, which each
    client keeps (parameters and running statistics; see :mod:`lightning_fed.algorithms.fedbn`).

    Args:
        lr: Server learning rate η (default 1.0: Alg. 1's plain average).
        weighting: ``"uniform"`` (default, Alg. 1's 1/K) or ``"num_samples"``.
        aggregators: As :class:`FedAvg` (default ``None``: the weighted mean).
        client: More client halves, run after FedBN's (default ``None``).

    Example::

        >>> FedBN()
        FedBN(lr=1.0, weighting='uniform')
        >>> FedBN().client_algorithms
        [FedBNClient()]
    """

    def __init__(self, lr: float = 1.0, weighting: str = "uniform", aggregators: Optional[list[Stage]] = None,
                 client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [FedBNClient()]  # the client half (lightning_fed.algorithms.fedbn)
