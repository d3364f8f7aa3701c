"""Personalised FL as ready-made names: FedPer and FedRep (FedAvg over the body, each client keeping its head; the
client halves are :class:`~lightning_fed.algorithms.fedper.FedPerClient` and
:class:`~lightning_fed.algorithms.fedrep.FedRepClient`) and Ditto (FedAvg plus a personal model per client,
:class:`~lightning_fed.algorithms.ditto.DittoClient`)."""

from __future__ import annotations

from typing import Optional, Sequence

from lightning_fed.algorithms.ditto import DittoClient
from lightning_fed.algorithms.fedper import FedPerClient
from lightning_fed.algorithms.fedrep import FedRepClient
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.aggregators.base import Stage


class FedPer(FedAvg):
    """FedPer (Arivazhagan et al. 2019, Alg. 1): FedAvg over the base layers; every client keeps the layers named in
    ``head`` (see :mod:`lightning_fed.algorithms.fedper`).

    Args:
        head: Names of the personalisation layers (submodules or tensors), e.g. ``["classifier"]``.
        lr: Server learning rate η (default 1.0).
        weighting: ``"num_samples"`` (default, the paper's n_j/n) or ``"uniform"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after FedPer's (default ``None``).

    Example::

        >>> FedPer(head=["net.2"])
        FedPer(head=['net.2'], lr=1.0, weighting='num_samples')
        >>> FedPer(head=["net.2"]).client_algorithms
        [FedPerClient(head=['net.2'])]
    """

    repr_fields = ("head", "lr", "weighting")

    def __init__(self, head: Sequence[str], lr: float = 1.0, weighting: str = "num_samples",
                 aggregators: Optional[list[Stage]] = None, client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [FedPerClient(head)]
        self.head = list(self._own_client[0].head)


class FedRep(FedAvg):
    """FedRep (Collins et al., ICML 2021, Alg. 1): each client trains its own head for ``head_steps`` local steps
    with the body fixed, then the body with the head fixed; the server averages the body (see
    :mod:`lightning_fed.algorithms.fedrep`).

    Args:
        head: Names of the head (submodules or tensors), e.g. ``["classifier"]``.
        head_steps: τ_h, local steps per round on the head (default 10).
        lr: Server learning rate η (default 1.0).
        weighting: ``"uniform"`` (default, Alg. 1, l. 14) or ``"num_samples"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after FedRep's (default ``None``).

    Example::

        >>> FedRep(head=["net.2"], head_steps=3).client_algorithms
        [FedRepClient(head=['net.2'], head_steps=3)]
    """

    repr_fields = ("head", "head_steps", "lr", "weighting")

    def __init__(self, head: Sequence[str], head_steps: int = 10, lr: float = 1.0, weighting: str = "uniform",
                 aggregators: Optional[list[Stage]] = None, client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [FedRepClient(head, head_steps)]
        self.head, self.head_steps = list(self._own_client[0].head), head_steps


class Ditto(FedAvg):
    """Ditto (Li et al., ICML 2021, Alg. 1): FedAvg (the uniform mean of l. 10) whose clients also train a personal
    model v_k towards the global one (see :mod:`lightning_fed.algorithms.ditto`).

    Args:
        lam: λ (≥ 0, default 0.1).
        personal_lr: η of the personal steps (default ``None``: the client learning rate).
        lr: Server learning rate (default 1.0).
        weighting: ``"uniform"`` (default, Alg. 1, l. 10) or ``"num_samples"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after Ditto's (default ``None``).

    Example::

        >>> Ditto(lam=0.5).client_algorithms
        [DittoClient(lam=0.5, lr=None)]
    """

    repr_fields = ("lam", "personal_lr", "lr", "weighting")

    def __init__(self, lam: float = 0.1, personal_lr: Optional[float] = None, lr: float = 1.0,
                 weighting: str = "uniform", aggregators: Optional[list[Stage]] = None,
                 client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [DittoClient(lam, personal_lr)]
        self.lam, self.personal_lr = self._own_client[0].lam, personal_lr
