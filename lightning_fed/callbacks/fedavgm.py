"""FedAvgM: server SGD with heavy-ball momentum on the negative pseudo-gradient."""

from __future__ import annotations

from typing import Optional

from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.aggregators.base import Stage
from lightning_fed.server.checks import check_positive, check_weighting
from lightning_fed.server.rules.momentum import Momentum


class FedAvgM(ServerOptimizer):
    """FedAvg with server momentum (Hsu et al. 2019; ServerOpt = SGD with momentum in Reddi et al. 2021, Alg. 1).

    The server treats g_t = −Δ_t as a gradient and takes a heavy-ball step, exactly as ``torch.optim.SGD``
    with ``momentum=μ`` (dampening 0), starting from a zero buffer::

        b_t = μ·b_{t−1} + g_t          (b_0 = g_1 on the first round, as torch's SGD)
        x_{t+1} = x_t − η·b_t

    With μ = 0 this is :class:`FedAvg`. State: ``momentum_buffer`` (one tensor per parameter). The composition
    ``ServerOptimizer(rule=Momentum(lr, momentum), aggregators=...)`` (:class:`~lightning_fed.server.rules.Momentum`).

    Args:
        lr: Server learning rate η (> 0).
        momentum: μ in [0, 1) (default 0.9).
        weighting: ``"num_samples"`` (default) or ``"uniform"``.
        aggregators: An aggregator chain in place of the weighted mean (default ``None``).
        client: Client algorithms every client runs (:mod:`lightning_fed.client.algorithm`, e.g.
            ``[FedProxClient(mu=0.01)]``; default ``None``: plain local training).

    Raises:
        ValueError: ``lr`` not a finite number > 0, ``momentum`` outside [0, 1), or an unknown ``weighting``.

    Example: two rounds with Δ = 1, μ = 0.9, η = 1: b_1 = −1, x_1 = 0 + 1 = 1; b_2 = 0.9·(−1) − 1 = −1.9,
    x_2 = 1 + 1.9 = 2.9::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> opt = FedAvgM(lr=1.0, momentum=0.9)
        >>> params = [torch.tensor([0.0], dtype=torch.float64)]
        >>> for _ in range(2):
        ...     _ = opt.server_update(params, [ClientUpdate(0, [torch.tensor([1.0], dtype=torch.float64)], 1, 1, 0.0)])
        ...     print(params[0].item(), opt.state["momentum_buffer"][0].item())
        1.0 -1.0
        2.9 -1.9
        >>> FedAvgM(momentum=1.0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `momentum` must be a number in [0, 1), got 1.0.
    """

    state_key_fields = ("lr", "momentum", "weighting")
    repr_fields = ("lr", "weighting", "momentum")

    def __init__(
        self, lr: float = 1.0, momentum: float = 0.9, weighting: str = "num_samples",
        aggregators: Optional[list[Stage]] = None, client: Optional[list[ClientAlgorithm]] = None,
    ) -> None:
        check_positive("lr", lr)
        check_weighting(weighting)
        rule = Momentum(lr=lr, momentum=momentum)
        super().__init__(weighting=weighting, aggregators=aggregators, rule=rule, client=client)
        self.momentum = rule.momentum
