"""FedAvg: the server adds the (scaled) pseudo-gradient to the global model."""

from __future__ import annotations

from typing import Optional

from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.aggregators.base import Stage
from lightning_fed.server.rules.sgd import SGD
from lightning_fed.callbacks.server_optimizer import ServerOptimizer


class FedAvg(ServerOptimizer):
    """Federated averaging: x_{t+1} = x_t + η·Δ_t (McMahan et al. 2017; ServerOpt = SGD with lr η in
    Reddi et al. 2021, Alg. 1, l. 11). With ``lr=1`` (the default) the new model is the weighted average of the
    client models. No state. The composition ``ServerOptimizer(rule=SGD(lr), aggregators=...)``.

    Args:
        lr: Server learning rate η (default 1.0, > 0).
        weighting: ``"num_samples"`` (default) or ``"uniform"`` client weights.
        aggregators: An aggregator chain (:mod:`lightning_fed.server.aggregators`) in place of the weighted mean.
        client: Client algorithms every client runs (:mod:`lightning_fed.client.algorithm`, e.g.
            ``[FedProxClient(mu=0.01)]``; default ``None``: plain local training).
        client_state_store: Where the client halves' per-client state lives: ``"memory"`` (default) or ``"disk"``
            (:class:`~lightning_fed.callbacks.ServerOptimizer`).
        client_state_dir: The ``"disk"`` store's directory (default ``None``: ``<default_root_dir>/client_state``).

    Raises:
        ValueError: ``lr`` not a finite number > 0, an unknown ``weighting`` or ``client_state_store``.

    Example: x_1 = x_0 + η·Δ_0 with x_0 = [1, 1], Δ_0 = [2, −4], η = 0.5::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> params = [torch.tensor([1.0, 1.0])]
        >>> update = ClientUpdate(client_id=0, delta=[torch.tensor([2.0, -4.0])], num_samples=5, num_steps=1, loss=0.0)
        >>> FedAvg(lr=0.5).server_update(params, [update])  # returns the pseudo-gradient Δ_0
        [tensor([ 2., -4.])]
        >>> params  # [1 + 0.5·2, 1 − 0.5·4]
        [tensor([ 2., -1.])]
        >>> FedAvg(lr=0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `lr` must be a finite number > 0, got 0.
    """

    def __init__(
        self, lr: float = 1.0, weighting: str = "num_samples", aggregators: Optional[list[Stage]] = None,
        client: Optional[list[ClientAlgorithm]] = None, client_state_store: str = "memory",
        client_state_dir: Optional[str] = None,
    ) -> None:
        super().__init__(weighting=weighting, aggregators=aggregators, rule=SGD(lr), client=client,
                         client_state_store=client_state_store, client_state_dir=client_state_dir)
