"""FedBN: FedAvg whose clients keep their BatchNorm layers local (the client half is
:class:`~lightning_fed.algorithms.fedbn.FedBNClient`)."""

from __future__ import annotations

from typing import Optional

from lightning_fed.algorithms.fedbn import FedBNClient
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.aggregators.base import Stage


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
